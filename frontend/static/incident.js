/* Incident page: the evidence chart (named ranks' compute time vs the median). */
(function () {
  "use strict";
  var V = window.Vigil;

  document.addEventListener("DOMContentLoaded", function () {
    var page = V.pageData();
    V.fetchJSON(page.evidence_url).then(function (d) {
      if (!d.step.length) { V.noData("evidence-chart", "No step data around this incident."); return; }
      var traces = [{
        x: d.step, y: d.median, name: "median of all ranks", mode: "lines",
        line: { color: "#6b7280", width: 3 },
      }];
      d.ranks.forEach(function (r) {
        traces.push({ x: d.step, y: r.compute_s, name: "rank " + r.rank, mode: "lines" });
      });
      var shapes = [], annotations = [];
      if (d.first_step != null) {
        shapes.push({ type: "line", xref: "x", yref: "paper", x0: d.first_step, x1: d.first_step,
                      y0: 0, y1: 1, line: { color: "#dc2626", dash: "dot" } });
        annotations.push({ x: d.first_step, y: 1, xref: "x", yref: "paper", showarrow: false,
                           text: "first step", yanchor: "bottom", font: { color: "#dc2626" } });
      }
      return V.plot("evidence-chart", traces, {
        xaxis: { title: { text: "step" } }, yaxis: { title: { text: "compute time (s)" } },
        shapes: shapes, annotations: annotations, margin: { l: 55, r: 20, t: 20, b: 40 },
      });
    }).catch(function (err) { V.failed("evidence-chart", err); });
  });
})();
