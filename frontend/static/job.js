/* Job page: charts from the JSON endpoints, then live updates by Server-Sent Events.
 * The charts draw one run of the job (page.run, default the latest; ?run= on the chart
 * routes); with page.compare, the step-time and loss charts overlay that second run's
 * series, one trace per run named "run N", x = step. */
(function () {
  "use strict";
  var V = window.Vigil;
  var page, marks = [];

  var LANE_PX = 16, MAX_LANES = 4, CHAR_PX = 6.6;

  /* Incident marks: a dotted line at each first step and a label "#id kind" above the plot.
   * Labels are put in lanes so that none overlaps another: each goes in the lowest lane
   * whose last label ends left of it (widths estimated from the text, in steps); past
   * MAX_LANES a label joins its left neighbour's ("#3 nan +1", all ids in its hover). */
  function incidentShapes(incidents, xrange, widthPx) {
    var shapes = [], annotations = [], lanes = [];
    var perPx = xrange && widthPx > 0 ? (xrange[1] - xrange[0]) / widthPx : 0;
    var marks = incidents.filter(function (i) { return i.first_step != null; })
      .sort(function (a, b) { return a.first_step - b.first_step || a.id - b.id; });
    marks.forEach(function (i) {
      var color = i.severity === "critical" ? "#dc2626" : i.severity === "warning" ? "#d97706" : "#2563eb";
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: i.first_step, x1: i.first_step,
                    y0: 0, y1: 1, line: { color: color, dash: "dot", width: 1.5 } });
      var text = "#" + i.id + " " + i.kind;
      var width = (text.length * CHAR_PX + 10) * perPx;
      var lane = lanes.findIndex(function (end) { return end <= i.first_step; });
      if (lane < 0 && lanes.length < MAX_LANES) { lane = lanes.length; lanes.push(0); }
      if (lane < 0) {
        var last = annotations[annotations.length - 1];
        last.more = (last.more || 0) + 1;
        last.text = V.plotText(last.base + " +" + last.more);
        last.hovertext += "<br>" + V.plotText(text + ": " + i.summary);
        return;
      }
      lanes[lane] = i.first_step + width;
      annotations.push({ x: i.first_step, y: 1, xref: "x", yref: "paper", yanchor: "bottom",
                         xanchor: "left", yshift: lane * LANE_PX, showarrow: false,
                         font: { color: color, size: 11 }, base: text, text: V.plotText(text),
                         hovertext: V.plotText(text + ": " + i.summary), lane: lane });
    });
    annotations.forEach(function (a) { delete a.base; delete a.more; delete a.lane; });
    return { shapes: shapes, annotations: annotations, top: 10 + LANE_PX * Math.max(1, lanes.length) };
  }

  function plotWidth(id, margin) {
    var el = document.getElementById(id);
    return el ? el.clientWidth - margin.l - margin.r : 0;
  }

  /* Step time and loss of two runs, one trace each ("run N"), their own bins each. */
  function drawOverlay(d, other, margin, m) {
    var runs = [d, other].filter(function (s) { return s.step.length; });
    if (!runs.length) {
      V.noData("step-time-chart", "No steps in either run.");
      V.noData("loss-chart", "No loss reported in either run.");
      return;
    }
    function traces(key, unit) {
      return runs.map(function (s) {
        var bin = s.step_bin > 1 ? " (mean of " + s.step_bin + " steps)" : "";
        return { x: s.step, y: s[key], name: "run " + s.run, mode: "lines",
                 hovertemplate: "run " + s.run + " · step %{x}" + bin + "<br>%{y:.4g}" + unit + "<extra></extra>" };
      });
    }
    V.plot("step-time-chart", traces("step_time", " s"),
           { xaxis: { title: { text: "step" } }, yaxis: { title: { text: "seconds" } },
             shapes: m.shapes, annotations: m.annotations, margin: margin, showlegend: true });
    V.plot("loss-chart", traces("loss", ""), { xaxis: { title: { text: "step" } }, showlegend: true });
  }

  function drawSeries(d, other) {
    marks = d.incidents || [];
    var margin = { l: 55, r: 20, t: 24, b: 40 };
    var m = incidentShapes(marks, [d.step[0], d.step[d.step.length - 1]], plotWidth("step-time-chart", margin));
    margin.t = m.top;
    // Each lane of labels above the plot adds to the chart's height, not takes from the plot.
    var stepChart = document.getElementById("step-time-chart");
    if (stepChart) stepChart.style.height = (300 + m.top - 26) + "px";
    if (other) {
      drawOverlay(d, other, margin, m);
    } else if (!d.step.length) {
      V.noData("step-time-chart", "No steps yet.");
      V.noData("loss-chart", "No loss reported.");
    } else {
      var bin = d.step_bin > 1 ? " (mean per " + d.step_bin + " steps)" : "";
      var run = d.run ? "run " + d.run + ": " : "";
      V.plot("step-time-chart", [
        { x: d.step, y: d.step_time, name: run + "step time" + bin + ", rank " + d.rank, mode: "lines" },
        { x: d.step, y: d.step_time_max, name: "max", mode: "lines", line: { dash: "dot", width: 1 } },
      ], { xaxis: { title: { text: "step" } }, yaxis: { title: { text: "seconds" } },
           shapes: m.shapes, annotations: m.annotations, margin: margin });
      var bad = d.nonfinite_loss_steps.map(function (s) {
        return { type: "line", xref: "x", yref: "paper", x0: s, x1: s, y0: 0, y1: 1,
                 line: { color: "#dc2626", width: 1 } };
      });
      V.plot("loss-chart", [{ x: d.step, y: d.loss, name: "loss", mode: "lines" }],
             { xaxis: { title: { text: "step" } }, shapes: bad, showlegend: false });
    }
    var mem = d.memory;
    if (!mem.step.length) { V.noData("memory-chart", "No memory reported."); return; }
    V.plot("memory-chart", [{
      x: mem.step, y: mem.max_bytes.map(function (b) { return b / 1073741824; }),
      name: "peak over ranks", mode: "lines", fill: "tozeroy",
    }], { xaxis: { title: { text: "step" } }, yaxis: { title: { text: "GiB" } }, showlegend: false });
  }

  function drawHeatmap(d) {
    if (!d.z.length) { V.noData("heatmap", "No steps yet."); return; }
    var note = "bins: " + d.step_bin + " step(s) × " + d.rank_bin + " rank(s)";
    if (d.sampled_steps_per_bin) note += ", " + d.sampled_steps_per_bin + " sampled step(s) per bin";
    document.getElementById("heatmap-note").textContent = note;
    // Ranks are whole numbers: one tick per rank bin (at most ~16), never 0.5.
    var every = Math.max(1, Math.ceil(d.y.length / 16));
    var ticks = d.y.filter(function (_, i) { return i % every === 0; });
    var labels = ticks.map(function (r) { return d.rank_bin > 1 ? r + "–" + (r + d.rank_bin - 1) : String(r); });
    V.plot("heatmap", [{
      type: "heatmap", x: d.x, y: d.y, z: d.z, colorscale: "Viridis",
      colorbar: { title: { text: "s" } },
      hovertemplate: (d.rank_bin > 1 ? "ranks %{y}+" : "rank %{y}") +
                     " · steps %{x}+<br>compute %{z:.4f} s<extra></extra>",
    }], { xaxis: { title: { text: "step" } },
          yaxis: { title: { text: "rank" }, tickmode: "array", tickvals: ticks, ticktext: labels, automargin: true },
          margin: { l: 55, r: 20, t: 10, b: 40 } });
  }

  function drawBandwidth(d) {
    if (!d.groups.length) { V.noData("bandwidth-chart", "No collectives reported."); return; }
    V.plot("bandwidth-chart", d.groups.map(function (g) {
      return { x: g.step, y: g.bytes_per_s.map(function (b) { return b == null ? null : b / 1e9; }),
               name: V.plotText(g.group), mode: "lines" };
    }), { xaxis: { title: { text: "step" } }, yaxis: { title: { text: "GB/s" } }, showlegend: true });
  }

  function drawOverview(d) {
    var g = d.goodput;
    var value = document.getElementById("goodput-value");
    if (!g || !g.total_s) {
      value.textContent = "—";
      V.noData("goodput-chart", "No time accounted yet.");
      return;
    }
    value.textContent = (100 * g.goodput).toFixed(1) + "%";
    var names = ["productive"], secs = [g.productive_s];
    Object.keys(g.badput).forEach(function (k) { names.push(k.replace(/_/g, " ")); secs.push(g.badput[k]); });
    // Horizontal bars: every label is on one line, in a margin sized to fit it.
    V.plot("goodput-chart", [{ type: "bar", orientation: "h", y: names, x: secs,
      text: secs.map(function (s) { return (100 * s / g.total_s).toFixed(1) + "%"; }),
      textposition: "auto", hovertemplate: "%{y}: %{x:.1f} s<extra></extra>",
      marker: { color: names.map(function (n) { return n === "productive" ? "#16a34a" : "#f59e0b"; }) } }],
      { xaxis: { title: { text: "seconds" } },
        yaxis: { automargin: true, autorange: "reversed" },
        margin: { l: 10, r: 20, t: 10, b: 40 }, showlegend: false });
  }

  /* The incidents table lists the drawn run's incidents (the stream sends those), or
   * every run's with a run column (data-runs, page.all_incidents). */
  function renderIncidents(incidents) {
    var table = document.getElementById("incidents");
    var body = table && table.querySelector("tbody");
    if (!body) return;
    var runs = table.hasAttribute("data-runs");
    body.textContent = "";
    var open = 0;
    incidents.forEach(function (i) {
      if (i.status === "open") open += 1;
      var tr = document.createElement("tr");
      tr.className = "incident status-" + i.status;
      tr.setAttribute("data-id", String(i.id));
      V.link(V.cell(tr, ""), "/incidents/" + encodeURIComponent(i.id), String(i.id));
      if (runs) V.cell(tr, "#" + i.run, "num");
      V.cell(tr, i.kind);
      var sev = document.createElement("span");
      sev.className = "sev sev-" + i.severity;
      sev.textContent = i.severity;
      V.cell(tr, "").appendChild(sev);
      V.cell(tr, i.status);
      V.cell(tr, i.ranks.length ? i.ranks.join(", ") : "—");
      V.cell(tr, i.first_step == null ? "—" : i.first_step);
      V.cell(tr, i.detected_at.replace("T", " ").slice(0, 19));
      V.cell(tr, i.summary, "summary");
      body.appendChild(tr);
    });
    document.getElementById("open-incidents").textContent = String(open);
    var chart = document.getElementById("step-time-chart");
    if (chart && chart.getAttribute("data-ready") === "1" && window.Plotly && chart.data) {
      var full = chart._fullLayout;
      var shown = incidents.filter(function (i) { return page.run == null || i.run === page.run; });
      var m = incidentShapes(shown, full.xaxis.range, full.xaxis._length);
      window.Plotly.relayout(chart, { shapes: m.shapes, annotations: m.annotations, "margin.t": m.top });
    }
  }

  var retryS = 5;
  function live() {
    if (!window.EventSource) return;
    var status = document.getElementById("live-status");
    // The stream follows the drawn run: its steps, and its incidents (or every run's).
    var url = page.urls.stream + "?after_step=" + encodeURIComponent(page.current_step == null ? -1 : page.current_step) +
              "&incidents=" + encodeURIComponent(page.incidents_signature) +
              (page.run == null ? "" : "&run=" + encodeURIComponent(page.run)) +
              (page.all_incidents ? "&all_incidents=true" : "");
    var source = new EventSource(url);
    source.onopen = function () {
      // A run that ended is not live: the stream only watches for the job's next run. An
      // earlier run than the current one gets no new steps: only its incidents are watched.
      var ended = page.run_state && page.run_state !== "running";
      var earlier = page.run != null && page.current_run != null && page.run !== page.current_run;
      status.textContent = earlier ? "run #" + page.run + " is over · run #" + page.current_run + " is current"
        : ended ? "run " + page.run_state + " · watching for a new run" : "live";
      retryS = 5;
    };
    source.onerror = function () {
      if (source.readyState !== EventSource.CLOSED) { status.textContent = "reconnecting…"; return; }
      // Refused (e.g. 429/503 when the server's live streams are all taken): the browser
      // gives up for good, so try again later, backing off to a minute.
      source.close();
      status.textContent = "live updates paused; retrying in " + retryS + " s";
      setTimeout(live, retryS * 1000);
      retryS = Math.min(60, retryS * 2);
    };
    source.addEventListener("steps", function (ev) {
      var d = JSON.parse(ev.data);
      if (d.step.length) page.current_step = d.step[d.step.length - 1];
      document.getElementById("current-step").textContent = String(d.current_step);
      // New steps are the job's current run's: they extend its trace only (trace 0, and
      // its max, trace 1, unless another run is overlaid there).
      var chart = document.getElementById("step-time-chart");
      var drawn = page.run == null || page.run === page.current_run;
      if (d.step.length && drawn && chart && chart.data && window.Plotly) {
        var n = page.compare == null ? 2 : 1;
        var upd = { x: [d.step, d.step].slice(0, n), y: [d.step_time, d.step_time].slice(0, n) };
        window.Plotly.extendTraces(chart, upd, [0, 1].slice(0, n), 20000);
      }
    });
    source.addEventListener("incidents", function (ev) {
      renderIncidents(JSON.parse(ev.data).incidents);
    });
  }

  // Runs before plotly.min.js is evaluated (the template loads this script first), so the
  // data is on its way while the browser parses plotly; drawing waits for both.
  var plotlyReady = new Promise(function (resolve) {
    if (window.Plotly) { resolve(); } else { window.addEventListener("load", resolve); }
  });
  function load(url) {
    return Promise.all([V.fetchJSON(url), plotlyReady]).then(function (both) { return both[0]; });
  }
  /* The run picker is a GET form: a new choice loads the page for it. A run cannot be
   * overlaid on itself, so the compared list disables the run shown. */
  function picker() {
    var form = document.getElementById("run-picker");
    if (!form) return;
    var run = document.getElementById("run-select"), compare = document.getElementById("compare-select");
    function sync() {
      Array.prototype.forEach.call(compare.options, function (o) { o.disabled = o.value !== "" && o.value === run.value; });
      if (compare.value === run.value) compare.value = "";
    }
    run.addEventListener("change", function () { sync(); form.requestSubmit(); });
    compare.addEventListener("change", function () { form.requestSubmit(); });
    sync();
  }

  page = V.pageData();
  picker();
  var compared = page.urls.compare_series ? load(page.urls.compare_series) : Promise.resolve(null);
  var series = Promise.all([load(page.urls.series), compared]).then(function (both) {
    drawSeries(both[0], both[1]);
  }).catch(function (err) {
    ["step-time-chart", "loss-chart", "memory-chart"].forEach(function (id) { V.failed(id, err); });
  });
  load(page.urls.heatmap).then(drawHeatmap).catch(function (err) { V.failed("heatmap", err); });
  load(page.urls.bandwidth).then(drawBandwidth).catch(function (err) { V.failed("bandwidth-chart", err); });
  load(page.urls.overview).then(drawOverview).catch(function (err) { V.failed("goodput-chart", err); });
  series.then(live);
})();
