/* Serving page: latency percentiles, SLOs and replicas from /api/v1/jobs/{job}/serving and
 * …/serving/status, redrawn every page.refresh_s seconds. User text (SLO and replica names,
 * summaries) goes into the DOM with textContent and into plotly through plotText. */
(function () {
  "use strict";
  var V = window.Vigil;
  var page = V.pageData();
  var lastUntil = null, lastStatus = null;
  var COLORS = { p50: "#2563eb", p90: "#d97706", p99: "#dc2626" };
  var PALETTE = ["#2563eb", "#16a34a", "#9333ea", "#0891b2", "#ca8a04", "#db2777", "#4b5563"];
  var TIME_AXIS = { type: "date" };

  function secs(x) {
    if (x == null) return "—";
    return x < 1 ? (1000 * x).toFixed(x < 0.01 ? 1 : 0) + " ms" : x.toFixed(2) + " s";
  }
  function pct(x) { return x == null ? "—" : (100 * x).toFixed(2) + "%"; }
  function dates(ts) { return ts.map(function (t) { return new Date(t * 1000); }); }

  /* Plotly.react once drawn (keeps zoom cheap on refresh), newPlot the first time. */
  function draw(id, traces, layout) {
    var el = document.getElementById(id);
    if (el && el.data && window.Plotly && el.getAttribute("data-ready") === "1") {
      var merged = Object.assign({}, el.layout, layout || {});
      return window.Plotly.react(el, traces, merged);
    }
    if (el) { el.textContent = ""; el.removeAttribute("data-error"); }
    return V.plot(id, traces, layout);
  }

  function empty(id, message) {
    var el = document.getElementById(id);
    if (el && window.Plotly && el.data) window.Plotly.purge(el);
    V.noData(id, message);
  }

  function hline(y, color, text, x0, x1) {
    return {
      shape: { type: "line", xref: x0 == null ? "paper" : "x", yref: "y", x0: x0 == null ? 0 : x0,
               x1: x1 == null ? 1 : x1, y0: y, y1: y, line: { color: color, dash: "dash", width: 1.5 } },
      annotation: { xref: x0 == null ? "paper" : "x", yref: "y", x: x0 == null ? 1 : x1, y: y,
                    xanchor: "right", yanchor: "bottom", showarrow: false,
                    font: { color: color, size: 11 }, text: V.plotText(text) },
    };
  }

  function withLines(layout, lines) {
    layout.shapes = lines.map(function (l) { return l.shape; });
    layout.annotations = lines.map(function (l) { return l.annotation; });
    return layout;
  }

  function thresholds(key) {
    return ((lastStatus && lastStatus.slos) || []).filter(function (s) { return s[key] != null; })
      .map(function (s) { return hline(s[key], "#991b1b", "SLO " + s.name + ": " + secs(s[key])); });
  }

  function drawLatency(d, metric, id) {
    var lines = d.latency[metric];
    var any = lines.p50.some(function (v) { return v != null; });
    if (!any) { empty(id, "No requests in this range."); return; }
    var x = dates(d.t);
    var traces = ["p50", "p90", "p99"].map(function (p) {
      return { x: x, y: lines[p], name: p, mode: "lines", connectgaps: false,
               line: { color: COLORS[p], width: p === "p99" ? 1.5 : 2, dash: p === "p99" ? "dot" : "solid" } };
    });
    draw(id, traces, withLines({ xaxis: TIME_AXIS, yaxis: { title: { text: "seconds" }, rangemode: "tozero" },
                                 showlegend: true }, thresholds(metric)));
  }

  function drawTraffic(d) {
    if (!d.requests.some(function (n) { return n > 0; })) { empty("traffic-chart", "No requests in this range."); return; }
    var x = dates(d.t);
    var perS = function (n) { return n / d.bin_s; };
    draw("traffic-chart", [
      { x: x, y: d.requests.map(perS), name: "requests/s", mode: "lines", line: { color: "#2563eb" } },
      { x: x, y: d.errors.map(perS), name: "errors/s", mode: "lines", line: { color: "#dc2626" } },
      { x: x, y: d.output_tokens_per_s, name: "output tokens/s", mode: "lines", yaxis: "y2",
        line: { color: "#9ca3af", dash: "dot" } },
    ], { xaxis: TIME_AXIS, yaxis: { title: { text: "per second" }, rangemode: "tozero" },
         yaxis2: { title: { text: "tokens/s" }, overlaying: "y", side: "right", rangemode: "tozero" },
         margin: { l: 55, r: 60, t: 10, b: 40 } });
  }

  function drawSloSeries(d) {
    if (!d.slos.length) {
      empty("attainment-chart", "No SLOs defined for this job.");
      empty("goodput-chart", "No SLOs defined for this job.");
      return;
    }
    var x = dates(d.t);
    var lines = [];
    var att = d.slos.map(function (s, i) {
      var color = PALETTE[i % PALETTE.length];
      lines.push(hline(100 * s.objective, color, s.name + " objective " + pct(s.objective)));
      return { x: x, y: s.attainment.map(function (a) { return a == null ? null : 100 * a; }),
               name: V.plotText(s.name), mode: "lines+markers", marker: { size: 4 }, line: { color: color } };
    });
    draw("attainment-chart", att, withLines({ xaxis: TIME_AXIS, yaxis: { title: { text: "% good" } },
                                              showlegend: true }, lines));
    // Requests/s on the left; tokens/s on the right: the good requests' output tokens, and
    // smooth goodput (each request's benefit in tokens, less its latency penalty, per second).
    var good = [{ x: x, y: d.requests.map(function (n) { return n / d.bin_s; }), name: "all requests/s",
                  mode: "lines", line: { color: "#9ca3af", width: 1 } }];
    d.slos.forEach(function (s, i) {
      var color = PALETTE[i % PALETTE.length];
      good.push({ x: x, y: s.goodput_rps, name: V.plotText(s.name + " goodput req/s"), mode: "lines",
                  line: { color: color } });
      good.push({ x: x, y: s.goodput_tokens_per_s, name: V.plotText(s.name + " goodput tok/s"), mode: "lines",
                  yaxis: "y2", line: { color: color, dash: "dash", width: 1 } });
      good.push({ x: x, y: s.smooth_goodput, name: V.plotText(s.name + " smooth goodput tok/s"), mode: "lines",
                  yaxis: "y2", line: { color: color, dash: "dot" } });
    });
    draw("goodput-chart", good, { xaxis: TIME_AXIS, yaxis: { title: { text: "requests/s" }, rangemode: "tozero" },
                                  yaxis2: { title: { text: "tokens/s" }, overlaying: "y", side: "right",
                                            rangemode: "tozero" },
                                  margin: { l: 55, r: 60, t: 10, b: 40 }, showlegend: true });
  }

  function drawReplicas(d) {
    var reps = d.replicas;
    var note = d.replicas_total > reps.length ? "the " + reps.length + " slowest of " + d.replicas_total : "";
    document.getElementById("replicas-note").textContent = note;
    document.getElementById("stat-replicas").textContent = String(d.replicas_total);
    fillReplicaTable(reps);
    if (!reps.length) {
      empty("replica-bars", "No replica has reported in this range.");
      empty("replica-ttft-chart", "No replica has reported in this range.");
      return;
    }
    var names = reps.map(function (r) { return V.plotText(r.replica); });
    draw("replica-bars", [
      { type: "bar", x: names, y: reps.map(function (r) { return r.ttft_mean_s; }), name: "mean TTFT (s)",
        offsetgroup: "ttft", marker: { color: "#2563eb" } },
      { type: "bar", x: names, y: reps.map(function (r) { return r.tpot_mean_s; }), name: "mean TPOT (s, right)",
        offsetgroup: "tpot", yaxis: "y2", marker: { color: "#f59e0b" } },
    ], { barmode: "group", yaxis: { title: { text: "TTFT (s)" }, rangemode: "tozero" },
         yaxis2: { title: { text: "TPOT (s)" }, overlaying: "y", side: "right", rangemode: "tozero" },
         margin: { l: 55, r: 60, t: 10, b: 60 }, showlegend: true });
    var x = dates(d.t);
    draw("replica-ttft-chart", d.replica_series.map(function (s, i) {
      return { x: x, y: s.ttft_mean_s, name: V.plotText(s.replica), mode: "lines",
               line: { color: PALETTE[i % PALETTE.length] } };
    }), { xaxis: TIME_AXIS, yaxis: { title: { text: "seconds" }, rangemode: "tozero" }, showlegend: true });
  }

  function fillReplicaTable(reps) {
    var body = document.querySelector("#replicas-table tbody");
    body.textContent = "";
    var means = reps.map(function (r) { return r.ttft_mean_s || 0; }).sort(function (a, b) { return a - b; });
    var median = means.length ? means[Math.floor(means.length / 2)] : 0;
    reps.forEach(function (r) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-replica", r.replica);
      [["requests", r.requests], ["errors", r.errors], ["ttft", r.ttft_mean_s], ["p90", r.ttft_p90_s],
       ["tpot", r.tpot_mean_s], ["queue", r.queue_mean_s]].forEach(function (kv) {
        tr.setAttribute("data-" + kv[0], kv[1] == null ? "" : String(kv[1]));
      });
      if (reps.length > 1 && r.ttft_mean_s != null && r.ttft_mean_s > 1.5 * median) tr.className = "slowest";
      V.cell(tr, r.replica);
      V.cell(tr, r.requests, "num");
      V.cell(tr, r.errors, "num");
      V.cell(tr, secs(r.ttft_mean_s), "num");
      V.cell(tr, secs(r.ttft_p90_s), "num");
      V.cell(tr, secs(r.tpot_mean_s), "num");
      V.cell(tr, secs(r.queue_mean_s), "num");
      body.appendChild(tr);
    });
    if (!reps.length) {
      var tr = document.createElement("tr");
      V.cell(tr, "No replica has reported in this range.", "empty").colSpan = 7;
      body.appendChild(tr);
    }
  }

  function lastWith(values) {
    for (var i = values.length - 1; i >= 0; i--) if (values[i] != null) return i;
    return -1;
  }

  function drawStats(d) {
    var i = lastWith(d.requests.map(function (n) { return n > 0 ? n : null; }));
    var set = function (id, text) { document.getElementById(id).textContent = text; };
    if (i < 0) { ["stat-rps", "stat-errors", "stat-tokens", "stat-ttft", "stat-tpot"].forEach(function (id) { set(id, "—"); }); return; }
    set("stat-rps", (d.requests[i] / d.bin_s).toFixed(2));
    set("stat-errors", d.errors[i] + " (" + (100 * d.errors[i] / d.requests[i]).toFixed(1) + "%)");
    set("stat-tokens", d.output_tokens_per_s[i] == null ? "—" : d.output_tokens_per_s[i].toFixed(0));
    var j = lastWith(d.latency.ttft_s.p90);
    set("stat-ttft", j < 0 ? "—" : secs(d.latency.ttft_s.p90[j]));
    var k = lastWith(d.latency.tpot_s.p90);
    set("stat-tpot", k < 0 ? "—" : secs(d.latency.tpot_s.p90[k]));
  }

  function drawChart(d) {
    lastUntil = d.until;
    var note = "bins of " + (d.bin_s / 60) + " min";
    if (d.sampled) note += "; percentiles from " + d.requests_read + " sampled requests";
    document.getElementById("latency-note").textContent = note;
    document.getElementById("range-note").textContent =
      new Date(d.since * 1000).toLocaleString() + " – " + new Date(d.until * 1000).toLocaleString();
    guard(["ttft-chart"], function () { drawLatency(d, "ttft_s", "ttft-chart"); });
    guard(["tpot-chart"], function () { drawLatency(d, "tpot_s", "tpot-chart"); });
    guard(["e2e-chart"], function () { drawLatency(d, "e2e_s", "e2e-chart"); });
    guard(["traffic-chart"], function () { drawTraffic(d); });
    guard(["attainment-chart", "goodput-chart"], function () { drawSloSeries(d); });
    guard(["replica-bars", "replica-ttft-chart"], function () { drawReplicas(d); });
    guard([], function () { drawStats(d); });
  }

  /* One chart that cannot draw says so; the others still draw. */
  function guard(ids, fn) {
    try { fn(); } catch (err) {
      if (window.console) window.console.error(err);
      ids.forEach(function (id) { V.failed(id, err); });
    }
  }

  function drawBudget(slos) {
    var known = slos.filter(function (s) { return s.error_budget_remaining != null; });
    if (!known.length) { empty("budget-chart", slos.length ? "No requests judged yet." : "No SLOs defined for this job."); return; }
    var values = known.map(function (s) { return 100 * s.error_budget_remaining; });
    draw("budget-chart", [{ type: "bar", x: known.map(function (s) { return V.plotText(s.name); }), y: values,
      marker: { color: values.map(function (v) { return v < 0 ? "#dc2626" : v < 25 ? "#d97706" : "#16a34a"; }) },
      text: values.map(function (v) { return v.toFixed(1) + "%"; }), textposition: "auto" }],
      withLines({ yaxis: { title: { text: "% of budget left" } }, showlegend: false },
                [hline(0, "#6b7280", "budget spent")]));
  }

  function drawBurn(slos) {
    var withRates = slos.filter(function (s) { return s.burn_rates && s.burn_rates.length; });
    if (!withRates.length) { empty("burn-chart", slos.length ? "No burn rates yet." : "No SLOs defined for this job."); return; }
    var tiers = withRates[0].burn_rates;
    var labels = tiers.map(function (b) {
      return b.tier + " " + duration(b.long_window_s) + "/" + duration(b.short_window_s);
    });
    var traces = [];
    withRates.forEach(function (s, i) {
      var color = PALETTE[i % PALETTE.length];
      traces.push({ type: "bar", x: labels, y: s.burn_rates.map(function (b) { return b.long_burn_rate; }),
                    name: V.plotText(s.name + " long window"), marker: { color: color } });
      traces.push({ type: "bar", x: labels, y: s.burn_rates.map(function (b) { return b.short_burn_rate; }),
                    name: V.plotText(s.name + " short window"), marker: { color: color, opacity: 0.5 } });
    });
    var lines = tiers.map(function (b, i) {
      return hline(b.factor, "#dc2626", "alert at " + b.factor + "×", i - 0.45, i + 0.45);
    });
    var top = Math.max.apply(null, tiers.map(function (b) { return b.factor; }));
    traces.forEach(function (t) { t.y.forEach(function (v) { if (v != null && v > top) top = v; }); });
    draw("burn-chart", traces, withLines({ barmode: "group", yaxis: { title: { text: "× budget rate" },
                                           range: [0, top * 1.15] }, showlegend: true }, lines));
  }

  function duration(s) {
    var m = Math.round(s / 60), d = Math.floor(m / 1440), h = Math.floor((m % 1440) / 60), mm = m % 60;
    return (d ? d + "d" : "") + (h ? h + "h" : "") + (mm ? mm + "m" : "") || "0m";
  }

  function drawStatus(st) {
    lastStatus = st;
    var h = document.getElementById("slo-headline");
    h.textContent = st.headline.text;
    h.className = "headline level-" + st.headline.level;
    guard(["budget-chart"], function () { drawBudget(st.slos); });
    guard(["burn-chart"], function () { drawBurn(st.slos); });
    guard([], function () { renderIncidents(st.incidents); });
  }

  function renderIncidents(incidents) {
    var body = document.querySelector("#incidents tbody");
    body.textContent = "";
    incidents.forEach(function (i) {
      var tr = document.createElement("tr");
      tr.className = "incident status-" + i.status;
      tr.setAttribute("data-id", String(i.id));
      V.link(V.cell(tr, ""), "/incidents/" + encodeURIComponent(i.id), String(i.id));
      V.cell(tr, i.kind);
      var sev = document.createElement("span");
      sev.className = "sev sev-" + i.severity;
      sev.textContent = i.severity;
      V.cell(tr, "").appendChild(sev);
      V.cell(tr, i.status);
      V.cell(tr, i.detected_at.replace("T", " ").slice(0, 19));
      V.cell(tr, i.summary, "summary");
      body.appendChild(tr);
    });
    if (!incidents.length) {
      var tr = document.createElement("tr");
      tr.className = "empty-row";
      V.cell(tr, "No incidents.", "empty").colSpan = 6;
      body.appendChild(tr);
    }
  }

  /* The default hour needs no since (the server ends it with the last request); a longer
   * range starts that long before the end of the last answer. */
  function chartUrl() {
    var range = Number(document.getElementById("range").value);
    var url = page.urls.chart + "?max_points=120";
    if (lastUntil == null || range === 3600) return url;
    return url + "&since=" + encodeURIComponent(lastUntil - range);
  }

  var plotlyReady = new Promise(function (resolve) {
    if (window.Plotly) { resolve(); } else { window.addEventListener("load", resolve); }
  });
  function load(url) {
    return Promise.all([V.fetchJSON(url), plotlyReady]).then(function (both) { return both[0]; });
  }

  var CHARTS = ["ttft-chart", "tpot-chart", "e2e-chart", "traffic-chart", "attainment-chart",
                "goodput-chart", "replica-bars", "replica-ttft-chart"];
  var busy = false;
  function refresh() {
    if (busy) return Promise.resolve();
    busy = true;
    var live = document.getElementById("live-status");
    // Status first: the latency charts draw the SLO thresholds it names.
    var status = load(page.urls.status).then(drawStatus).catch(function (err) {
      ["budget-chart", "burn-chart"].forEach(function (id) { V.failed(id, err); });
      throw err;
    });
    var chart = status.catch(function () {}).then(function () { return load(chartUrl()); }).then(drawChart)
      .catch(function (err) { CHARTS.forEach(function (id) { V.failed(id, err); }); throw err; });
    return Promise.all([status, chart]).then(function () {
      live.textContent = "updated " + new Date().toLocaleTimeString() + " · every " + page.refresh_s + " s";
    }).catch(function () {
      live.textContent = "update failed; retrying";
    }).then(function () { busy = false; });
  }

  document.getElementById("range").addEventListener("change", function () {
    load(chartUrl()).then(drawChart).catch(function (err) { CHARTS.forEach(function (id) { V.failed(id, err); }); });
  });
  refresh();
  setInterval(function () { if (!document.hidden) refresh(); }, 1000 * (page.refresh_s || 10));
})();
