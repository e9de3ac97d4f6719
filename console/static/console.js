// nodelane console: progressive enhancement only. Every page is complete
// without this script; with it, a job's timeline and logs follow live.
(function () {
  "use strict";
  var table = document.getElementById("events");
  if (!table || table.dataset.ended === "true") {
    return;
  }
  var src = table.dataset.src;
  var after = table.dataset.after || "0";
  var body = table.tBodies[0];
  var state = document.getElementById("job-state");
  var more = document.getElementById("events-more");
  if (more) {
    more.textContent = "Following live…";
  }

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
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
        (ans.events || []).forEach(function (ev) {
          var row = document.createElement("tr");
          row.className = "ev-" + ev.kind;
          cell(row, new Date(ev.created_at).toISOString().replace(/\.\d+Z$/, "Z").replace("T", " "));
          cell(row, ev.kind);
          cell(row, ev.event_type === null ? "—" : ev.event_type);
          cell(row, ev.message).className = "msg";
          cell(row, String(ev.lease_epoch));
          body.appendChild(row);
          after = String(ev.id);
        });
        if (state && ans.state) {
          state.textContent = ans.state;
          state.className = "state-" + ans.state;
        }
        if (ans.next !== null && ans.next !== undefined) {
          after = String(ans.next);
          setTimeout(poll, 0);
          return;
        }
        if (ans.ended) {
          if (more) {
            more.textContent = "The job has ended (" + ans.state + "). Reload the page for its cost and receipts.";
          }
          return;
        }
        setTimeout(poll, 1500);
      })
      .catch(function (err) {
        if (more) {
          more.textContent = "Stopped following: " + err.message + ". Reload the page.";
        }
      });
  }
  setTimeout(poll, 1000);
})();
