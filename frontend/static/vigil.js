/* Vigil dashboard: helpers shared by every page. No framework, no build step.
 * User text always goes into the DOM with textContent, never innerHTML. */
(function () {
  "use strict";

  function pageData() {
    var el = document.getElementById("page-data");
    return el ? JSON.parse(el.textContent) : {};
  }

  function fetchJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error(url + ": HTTP " + r.status);
        return r.json();
      });
  }

  /* Plotly renders a few HTML-like tags in titles, legends and annotations: escape them. */
  function plotText(s) {
    return String(s == null ? "" : s)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  var BASE_LAYOUT = {
    margin: { l: 55, r: 20, t: 10, b: 40 },
    font: { family: "system-ui, sans-serif", size: 12 },
    hovermode: "closest",
    legend: { orientation: "h", y: -0.2 },
  };

  /* Draw a chart and mark its container data-ready="1" when Plotly is done. */
  function plot(id, traces, layout) {
    var el = document.getElementById(id);
    if (!el || !window.Plotly) return Promise.resolve(null);
    var merged = Object.assign({}, BASE_LAYOUT, layout || {});
    return window.Plotly.newPlot(el, traces, merged, { displaylogo: false, responsive: true })
      .then(function () { el.setAttribute("data-ready", "1"); return el; });
  }

  /* An empty chart with a message, still marked ready (there is nothing to wait for). */
  function noData(id, message) {
    var el = document.getElementById(id);
    if (!el) return;
    el.textContent = "";
    var p = document.createElement("p");
    p.className = "empty";
    p.textContent = message;
    el.appendChild(p);
    el.setAttribute("data-ready", "1");
  }

  function failed(id, err) {
    noData(id, "Could not load: " + (err && err.message ? err.message : err));
    var el = document.getElementById(id);
    if (el) el.setAttribute("data-error", "1");
  }

  function cell(row, text, className) {
    var td = document.createElement("td");
    td.textContent = text == null ? "" : String(text);
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  function link(parent, href, text) {
    var a = document.createElement("a");
    a.href = href;
    a.textContent = text;
    parent.appendChild(a);
    return a;
  }

  /* Tables with th[data-sort]: click to sort rows by the row's data-<key>. */
  function sortable(table) {
    var heads = table.querySelectorAll("th[data-sort]");
    heads.forEach(function (th) {
      th.classList.add("sort");
      th.addEventListener("click", function () {
        var key = th.getAttribute("data-sort");
        var numeric = th.getAttribute("data-type") === "number";
        var dir = th.getAttribute("data-dir") === "asc" ? "desc" : "asc";
        heads.forEach(function (h) { h.removeAttribute("data-dir"); });
        th.setAttribute("data-dir", dir);
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows).filter(function (r) {
          return r.hasAttribute("data-" + key);
        });
        rows.sort(function (a, b) {
          var x = a.getAttribute("data-" + key), y = b.getAttribute("data-" + key);
          var c;
          if (numeric) {
            var nx = x === "" ? -Infinity : Number(x), ny = y === "" ? -Infinity : Number(y);
            c = nx < ny ? -1 : nx > ny ? 1 : 0;
          } else {
            c = x.localeCompare(y);
          }
          return dir === "asc" ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }

  /* Forms with data-confirm ask first (approve, cancel, trigger, delete, revoke). */
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) ev.preventDefault();
  }, true);

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("table.sortable").forEach(sortable);
  });

  window.Vigil = {
    pageData: pageData, fetchJSON: fetchJSON, plot: plot, plotText: plotText,
    noData: noData, failed: failed, cell: cell, link: link,
  };
})();
