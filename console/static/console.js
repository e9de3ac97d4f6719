// nodelane console: progressive enhancement only. Every page is complete
// without this script. With it, a job's timeline and logs open in a
// terminal-style viewer that renders only the lines in view (so a job of
// 100,000 lines opens as fast as one of ten) and follows the job live;
// the dispatch form puts the cursor where its payload stops being JSON.
(function () {
  "use strict";

  // The dispatch form: a payload that is not JSON comes back with the
  // byte offset of the error; select the character there.
  var payload = document.querySelector("textarea[data-error-offset]");
  if (payload) {
    var bytes = parseInt(payload.dataset.errorOffset, 10) || 0;
    // The offset counts UTF-8 bytes; the textarea counts UTF-16 units.
    var text = payload.value, pos = 0, seen = 0;
    while (pos < text.length && seen < bytes) {
      var cp = text.codePointAt(pos);
      seen += cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      pos += cp >= 0x10000 ? 2 : 1;
    }
    payload.focus();
    payload.setSelectionRange(pos, Math.min(pos + 1, text.length));
  }

  var table = document.getElementById("events");
  var mount = document.getElementById("log-viewer-mount");
  if (!table || !mount) {
    return;
  }
  var started = performance.now();
  var src = table.dataset.src;
  var ended = table.dataset.ended === "true";
  var state = document.getElementById("job-state");
  var more = document.getElementById("events-more");
  var ROW = 18; // px, as .log-line's height in console.css
  var OVERSCAN = 20;
  var lines = []; // {t, kind, type, msg, epoch}
  // The lines the page came with (the first page of events) show at
  // once; the rest load after the last of them.
  var after = table.dataset.after || "0";
  Array.prototype.forEach.call(table.tBodies[0].rows, function (tr) {
    var c = tr.cells;
    if (c.length < 5) {
      return;
    }
    var type = c[2].textContent;
    lines.push({ t: c[0].textContent.slice(11, 19), kind: tr.className.replace(/^ev-/, ""), type: type === "—" ? null : type,
      msg: c[3].textContent.replace(/\r?\n/g, " ⏎ "), epoch: c[4].textContent });
  });

  // The viewer: a scroll box holding a spacer as tall as all the lines and,
  // in it, only the rows in view.
  var viewer = document.createElement("div");
  viewer.className = "log-viewer";
  viewer.id = "log-viewer";
  viewer.tabIndex = 0;
  viewer.setAttribute("role", "log");
  viewer.setAttribute("aria-label", "Timeline and logs");
  var spacer = document.createElement("div");
  spacer.className = "log-spacer";
  var rows = document.createElement("div");
  rows.className = "log-rows";
  spacer.appendChild(rows);
  viewer.appendChild(spacer);
  var status = document.createElement("p");
  status.className = "log-status";
  status.id = "log-status";
  mount.appendChild(viewer);
  mount.appendChild(status);
  table.hidden = true;
  if (more) {
    more.hidden = true;
  }
  var firstPaint = null;
  var follow = true; // stuck to the bottom until the operator scrolls up
  var scheduled = false;

  function pad(n) {
    return n < 10 ? "0" + n : String(n);
  }
  function clock(iso) {
    var d = new Date(iso);
    return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
  }
  function span(cls, text) {
    var s = document.createElement("span");
    s.className = cls;
    s.textContent = text;
    return s;
  }

  function render() {
    scheduled = false;
    spacer.style.height = lines.length * ROW + "px";
    if (follow) {
      viewer.scrollTop = viewer.scrollHeight;
    }
    var first = Math.max(0, Math.floor(viewer.scrollTop / ROW) - OVERSCAN);
    var last = Math.min(lines.length, Math.ceil((viewer.scrollTop + viewer.clientHeight) / ROW) + OVERSCAN);
    rows.style.transform = "translateY(" + first * ROW + "px)";
    var frag = document.createDocumentFragment();
    for (var i = first; i < last; i++) {
      var l = lines[i];
      var div = document.createElement("div");
      div.className = "log-line ev-" + l.kind;
      div.dataset.n = String(i + 1);
      div.appendChild(span("t", l.t + " "));
      div.appendChild(span("k", (l.type === null ? l.kind : l.type) + " "));
      div.appendChild(document.createTextNode(l.msg));
      div.title = "#" + (i + 1) + " · epoch " + l.epoch;
      frag.appendChild(div);
    }
    rows.replaceChildren(frag);
    if (firstPaint === null && lines.length > 0) {
      firstPaint = performance.now() - started;
      viewer.dataset.firstPaintMs = firstPaint.toFixed(1);
    }
    viewer.dataset.lines = String(lines.length);
    viewer.dataset.rendered = String(last - first);
  }
  function schedule() {
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(render);
    }
  }
  viewer.addEventListener("scroll", function () {
    follow = viewer.scrollTop + viewer.clientHeight >= viewer.scrollHeight - ROW;
    schedule();
  });
  window.addEventListener("resize", schedule);

  function say(text) {
    status.textContent = lines.length + " lines. " + text;
  }

  function poll() {
    fetch(src + "?after=" + encodeURIComponent(after), { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (resp) {
        if (!resp.ok) {
          throw new Error("HTTP " + resp.status);
        }
        return resp.json();
      })
      .then(function (ans) {
        var evs = ans.events || [];
        for (var i = 0; i < evs.length; i++) {
          var ev = evs[i];
          // A line holds one row: its line breaks are shown as ⏎.
          lines.push({ t: clock(ev.created_at), kind: ev.kind, type: ev.event_type, msg: String(ev.message).replace(/\r?\n/g, " ⏎ "), epoch: ev.lease_epoch });
          after = String(ev.id);
        }
        if (evs.length > 0 || firstPaint === null) {
          render();
        }
        if (state && ans.state) {
          state.textContent = ans.state;
          state.className = "badge state-" + ans.state;
        }
        if (ans.next !== null && ans.next !== undefined) {
          after = String(ans.next);
          say("Loading…");
          setTimeout(poll, 0);
          return;
        }
        viewer.dataset.loadedMs = (performance.now() - started).toFixed(1);
        if (ans.ended) {
          say("The job has ended (" + ans.state + ")." + (ended ? "" : " Reload the page for its cost and receipts."));
          status.classList.add("ended");
          return;
        }
        say("Following live…");
        setTimeout(poll, 1500);
      })
      .catch(function (err) {
        say("Stopped following: " + err.message + ". Reload the page.");
      });
  }
  render();
  say("Loading…");
  poll();
})();
