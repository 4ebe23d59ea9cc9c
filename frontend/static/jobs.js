/* Jobs page: filter, and goodput filled in per row from /api/v1/jobs/{job}/overview. */
(function () {
  "use strict";

  function applyFilter() {
    var text = (document.getElementById("job-filter").value || "").toLowerCase();
    var onlyOpen = document.getElementById("only-incidents").checked;
    var shown = 0;
    document.querySelectorAll("#jobs-table tbody tr.job").forEach(function (row) {
      var name = (row.getAttribute("data-name") || "").toLowerCase();
      var ok = name.indexOf(text) !== -1 && (!onlyOpen || Number(row.getAttribute("data-open")) > 0);
      row.hidden = !ok;
      if (ok) shown += 1;
    });
    document.getElementById("job-count").textContent = shown + " jobs";
  }

  function fillGoodput(rows, i) {
    if (i >= rows.length) return Promise.resolve();
    var row = rows[i];
    return window.Vigil.fetchJSON(row.getAttribute("data-overview")).then(function (data) {
      var g = data.goodput && data.goodput.goodput;
      var td = row.querySelector("td.goodput");
      if (g == null) { td.textContent = "—"; return; }
      td.textContent = (100 * g).toFixed(1) + "%";
      row.setAttribute("data-goodput", String(g));
    }).catch(function () {
      row.querySelector("td.goodput").textContent = "—";
    }).then(function () { return fillGoodput(rows, i + 4); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var table = document.getElementById("jobs-table");
    if (!table) return;
    document.getElementById("job-filter").addEventListener("input", applyFilter);
    document.getElementById("only-incidents").addEventListener("change", applyFilter);
    var rows = Array.prototype.slice.call(table.querySelectorAll("tbody tr.job"));
    for (var k = 0; k < 4; k++) fillGoodput(rows, k);  // four requests at a time
  });
})();
