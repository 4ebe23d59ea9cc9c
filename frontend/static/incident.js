/* Incident page: the evidence chart that fits the incident's kind (the JSON says which:
 * compute, numerics, liveness, bandwidth, or none for a Flight Recorder import). */
(function () {
  "use strict";
  var V = window.Vigil;
  var RED = "#dc2626", GREY = "#6b7280";

  var CAPTIONS = {
    compute: "Compute time per step (step − collective wait) of the named ranks against the median over all ranks, around the first step.",
    numerics: "Loss and gradient norm per step (median over ranks of the finite values); shaded red: steps where some rank reported NaN or Inf.",
    liveness: "Each rank's last steps (dots: when a step ended) and its latest heartbeat (diamond, with the collective it is in), in seconds relative to detection. Named ranks in red.",
    bandwidth: "Bandwidth per step of the slow process groups against the median of the job's other groups.",
  };

  function firstStepMark(step, layout) {
    if (step == null) return layout;
    layout.shapes = (layout.shapes || []).concat([{ type: "line", xref: "x", yref: "paper",
      x0: step, x1: step, y0: 0, y1: 1, line: { color: RED, dash: "dot" } }]);
    layout.annotations = (layout.annotations || []).concat([{ x: step, y: 1, xref: "x", yref: "paper",
      showarrow: false, text: "first step", yanchor: "bottom", font: { color: RED } }]);
    return layout;
  }

  // The legend goes below the x axis's title, not over it.
  var LEGEND = { orientation: "h", y: -0.32 };

  function base(yTitle) {
    return { xaxis: { title: { text: "step" } }, yaxis: { title: { text: yTitle } },
             legend: LEGEND, margin: { l: 60, r: 20, t: 20, b: 80 } };
  }

  /* [60, 61, 62, 70] -> [[60, 62], [70, 70]]: runs of consecutive steps. */
  function runs(steps) {
    var out = [];
    steps.slice().sort(function (a, b) { return a - b; }).forEach(function (s) {
      var last = out[out.length - 1];
      if (last && s <= last[1] + 1) { last[1] = Math.max(last[1], s); } else { out.push([s, s]); }
    });
    return out;
  }

  function drawCompute(d) {
    if (!d.step.length) { V.noData("evidence-chart", "No step data around this incident."); return; }
    var traces = [{ x: d.step, y: d.median, name: "median of all ranks", mode: "lines",
                    line: { color: GREY, width: 3 } }];
    d.ranks.forEach(function (r) {
      traces.push({ x: d.step, y: r.compute_s, name: "rank " + r.rank, mode: "lines" });
    });
    return V.plot("evidence-chart", traces, firstStepMark(d.first_step, base("compute time (s)")));
  }

  function drawNumerics(d) {
    if (!d.step.length) { V.noData("evidence-chart", "No loss or gradient norm reported around this incident."); return; }
    var traces = [{ x: d.step, y: d.loss, name: "loss", mode: "lines", line: { color: "#2563eb" } }];
    if (d.grad_norm.some(function (v) { return v != null; }) || d.nonfinite.grad_norm.length) {
      traces.push({ x: d.step, y: d.grad_norm, name: "grad norm", mode: "lines", yaxis: "y2",
                    line: { color: "#9333ea" } });
    }
    var layout = base("loss");
    layout.yaxis2 = { title: { text: "grad norm" }, overlaying: "y", side: "right", showgrid: false };
    layout.margin.r = 60;
    // Steps where some rank had NaN/Inf: shaded (a NaN has no y to plot).
    var bad = runs(d.nonfinite.loss.concat(d.nonfinite.grad_norm));
    layout.shapes = bad.map(function (r) {
      return { type: "rect", xref: "x", yref: "paper", x0: r[0] - 0.5, x1: r[1] + 0.5, y0: 0, y1: 1,
               fillcolor: RED, opacity: 0.15, line: { width: 0 } };
    });
    if (bad.length) {  // a legend entry for the shading
      traces.push({ x: [null], y: [null], name: "NaN/Inf on some rank", mode: "lines",
                    line: { color: RED, width: 8 }, opacity: 0.3 });
    }
    return V.plot("evidence-chart", traces, firstStepMark(d.first_step, layout));
  }

  function drawLiveness(d) {
    var ranks = d.liveness;
    if (!ranks.length) { V.noData("evidence-chart", "No rank has reported."); return; }
    var names = ranks.map(function (r) { return "rank " + r.rank; });
    var steps = { named: { x: [], y: [], text: [] }, other: { x: [], y: [], text: [] } };
    var beats = { x: [], y: [], text: [], label: [], color: [] };
    ranks.forEach(function (r, i) {
      var into = r.named ? steps.named : steps.other;
      r.step.forEach(function (s, j) {
        into.x.push(r.step_end_s[j]); into.y.push(names[i]); into.text.push("step " + s + " ended");
      });
      if (r.heartbeat_s != null) {
        var where = r.exited ? "exited" : r.inflight ? "in " + r.inflight : "in no collective";
        beats.x.push(r.heartbeat_s); beats.y.push(names[i]);
        beats.text.push(V.plotText("latest heartbeat · " + where + " · last step " + (r.last_step == null ? "—" : r.last_step)));
        beats.label.push(ranks.length <= 24 ? V.plotText(where) : "");
        beats.color.push(r.named ? RED : "#2563eb");
      }
    });
    var traces = [
      { x: steps.other.x, y: steps.other.y, text: steps.other.text, name: "step ended", mode: "markers",
        marker: { color: GREY, size: 7 }, hovertemplate: "%{y}: %{text} at %{x:.1f} s<extra></extra>" },
      { x: steps.named.x, y: steps.named.y, text: steps.named.text, name: "step ended (named rank)",
        mode: "markers", marker: { color: RED, size: 7 },
        hovertemplate: "%{y}: %{text} at %{x:.1f} s<extra></extra>" },
      { x: beats.x, y: beats.y, hovertext: beats.text, text: beats.label, name: "latest heartbeat",
        mode: "markers+text", textposition: "middle right", textfont: { size: 11 }, cliponaxis: false,
        marker: { symbol: "diamond", size: 11, color: beats.color },
        hovertemplate: "%{y}: %{hovertext} at %{x:.1f} s<extra></extra>" },
    ];
    var el = document.getElementById("evidence-chart");
    el.style.height = Math.max(300, 26 * ranks.length + 110) + "px";
    return V.plot("evidence-chart", traces, {
      xaxis: { title: { text: "seconds relative to detection" }, zeroline: false },
      yaxis: { type: "category", categoryorder: "array", categoryarray: names.slice().reverse(),
               automargin: true },
      legend: LEGEND, margin: { l: 70, r: 150, t: 20, b: 80 },
      shapes: [{ type: "line", xref: "x", yref: "paper", x0: 0, x1: 0, y0: 0, y1: 1,
                 line: { color: RED, dash: "dot" } }],
      annotations: [{ x: 0, y: 1, xref: "x", yref: "paper", showarrow: false, yanchor: "bottom",
                      text: "detected", font: { color: RED } }],
    });
  }

  function drawBandwidth(d) {
    if (!d.groups.length || !d.groups[0].step.length) {
      V.noData("evidence-chart", "No collectives reported around this incident."); return;
    }
    var traces = d.groups.map(function (g) {
      return { x: g.step, y: g.gbps, name: V.plotText(g.group), mode: "lines",
               line: g.slow ? { width: 2 } : { color: GREY, width: 3, dash: "dot" } };
    });
    return V.plot("evidence-chart", traces, firstStepMark(d.first_step, base("GB/s")));
  }

  function drawNone() {
    var box = document.getElementById("evidence-chart-box");
    if (box) box.hidden = true;
    document.getElementById("evidence-chart").setAttribute("data-ready", "1");
  }

  var DRAW = { compute: drawCompute, numerics: drawNumerics, liveness: drawLiveness,
               bandwidth: drawBandwidth, none: drawNone };

  document.addEventListener("DOMContentLoaded", function () {
    var page = V.pageData();
    V.fetchJSON(page.evidence_url).then(function (d) {
      var chart = document.getElementById("evidence-chart");
      chart.setAttribute("data-chart", d.chart);
      var caption = document.getElementById("evidence-caption");
      if (caption) caption.textContent = CAPTIONS[d.chart] || "";
      return (DRAW[d.chart] || drawCompute)(d);
    }).catch(function (err) { V.failed("evidence-chart", err); });
  });
})();
