/* Stack dumps (job and incident pages): one block per rank, the training thread open with
 * its innermost frame highlighted, every other thread collapsed. Ranks whose training
 * threads stand in the same place are folded under the first of them. Text only through
 * textContent: stack lines come from the ranks. */
(function () {
  "use strict";

  function el(tag, className, text) {
    var e = document.createElement(tag);
    if (className) e.className = className;
    if (text != null) e.textContent = String(text);
    return e;
  }

  function where(f) {
    return f.file == null ? (f.code || "") : f.file + ":" + f.line + " in " + f.function;
  }

  function ranksText(ranks) {
    return (ranks.length === 1 ? "rank " : "ranks ") + ranks.join(", ");
  }

  var SHOWN_FRAMES = 10;  // innermost frames listed; the outer ones fold away

  function frameList(t) {
    var box = el("div"), ol = el("ol", "frames");
    box.appendChild(ol);
    // Innermost first: where the thread is now is the first line read.
    var keep = Math.max(SHOWN_FRAMES, t.frames.length - 1 - (t.user_frame == null ? t.frames.length : t.user_frame) + 1);
    for (var i = t.frames.length - 1; i >= 0; i--) {
      if (t.frames.length - 1 - i === keep) {
        var outer = el("details", "outer-frames");
        outer.appendChild(el("summary", "small muted", (i + 1) + " outer frames"));
        ol = el("ol", "frames");
        outer.appendChild(ol);
        box.appendChild(outer);
      }
      var f = t.frames[i];
      var li = el("li", "frame");
      li.appendChild(el("span", "where mono", where(f)));
      if (i === t.hung_frame) {
        li.classList.add("hung");
        li.appendChild(el("span", "tag", "innermost frame: where this rank is"));
      } else if (i === t.user_frame) {
        li.classList.add("user");
        li.appendChild(el("span", "tag", "innermost frame in your code"));
      }
      if (f.file != null && f.code) li.appendChild(el("code", "code", f.code));
      ol.appendChild(li);
    }
    return box;
  }

  function threadBlock(t) {
    var d = el("details", "thread" + (t.training ? " training" : "") + (t.infra ? " infra" : ""));
    d.open = t.training;
    var s = el("summary", null, t.thread);
    var note = t.training ? "training thread · " : t.infra ? "Vigil's collector · " : "";
    s.appendChild(el("span", "muted small", " " + note + t.frames.length + " frames, innermost first"));
    d.appendChild(s);
    d.appendChild(frameList(t));
    return d;
  }

  function dumpBlock(dump, same, open) {
    var d = el("details", "stack-dump");
    d.setAttribute("data-rank", String(dump.rank));
    d.open = open;
    var s = el("summary");
    s.appendChild(el("strong", null, "rank " + dump.rank));
    var meta = [];
    if (dump.step != null) meta.push("step " + dump.step);
    if (dump.pid != null) meta.push("pid " + dump.pid);
    if (dump.ts != null) meta.push(new Date(dump.ts * 1000).toISOString().replace("T", " ").slice(0, 19));
    meta.push(dump.threads.length + " threads");
    s.appendChild(el("span", "muted small", " · " + meta.join(" · ")));
    var main = dump.threads.filter(function (t) { return t.training; })[0];
    if (main && main.hung_frame != null) {
      s.appendChild(el("div", "mono small hung-line", "stuck in " + where(main.frames[main.hung_frame])));
      if (main.user_frame != null && main.user_frame !== main.hung_frame) {
        s.appendChild(el("div", "mono small user-line", "from your code at " + where(main.frames[main.user_frame])));
      }
    }
    if (same.length) s.appendChild(el("div", "small muted", "same place as this rank: " + ranksText(same)));
    d.appendChild(s);
    if (dump.reason) d.appendChild(el("p", "small muted", "reason: " + dump.reason));
    dump.threads.forEach(function (t) { d.appendChild(threadBlock(t)); });
    return d;
  }

  function render(box, data) {
    box.textContent = "";
    if (!data.dumps.length) {
      box.appendChild(el("p", "empty", "No stack dumps. Trigger the dump_stacks action to see where every rank's threads are."));
      return;
    }
    if (data.groups.length > 1) {
      box.appendChild(el("p", "small", "Training threads stand in " + data.groups.length + " different places: " +
        data.groups.map(function (g) { return ranksText(g.ranks); }).join("; ") + "."));
    }
    var byRank = {};
    data.dumps.forEach(function (d) { byRank[d.rank] = d; });
    var shown = {};
    // One block per group (its first rank, the others named in it), odd ones out first;
    // then dumps without a training thread.
    data.groups.forEach(function (g, i) {
      var first = byRank[g.ranks[0]];
      shown[first.rank] = true;
      g.ranks.slice(1).forEach(function (r) { shown[r] = true; });
      box.appendChild(dumpBlock(first, g.ranks.slice(1), i === 0));
    });
    data.dumps.forEach(function (d) { if (!shown[d.rank]) box.appendChild(dumpBlock(d, [], false)); });
    if (data.ranks_with_dumps > data.dumps.length) {
      box.appendChild(el("p", "small muted", "Showing " + data.dumps.length + " of " + data.ranks_with_dumps + " ranks' dumps."));
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var section = document.getElementById("stacks");
    if (!section) return;
    var box = document.getElementById("stacks-body");
    window.Vigil.fetchJSON(section.getAttribute("data-url")).then(function (data) {
      render(box, data);
      section.setAttribute("data-ready", "1");
    }).catch(function (err) {
      box.textContent = "";
      box.appendChild(el("p", "error", "Could not load the stack dumps: " + (err && err.message ? err.message : err)));
      section.setAttribute("data-ready", "1");
      section.setAttribute("data-error", "1");
    });
  });
})();
