// The period page's live counts: while the period runs, read its progress every few seconds and
// fill the cells that carry a data-field. No framework, nothing loaded from elsewhere.
"use strict";
(function () {
  var INTERVAL_MS = 2000;
  var section = document.querySelector("[data-poll]");
  if (!section) return;
  var url = section.getAttribute("data-poll");

  function fill(row) {
    section.querySelectorAll("[data-field]").forEach(function (cell) {
      var name = cell.getAttribute("data-field");
      if (!(name in row)) return;
      if (name === "percent") { cell.value = row.percent; cell.textContent = row.percent + "%"; return; }
      if (name === "planned") { cell.textContent = row.planned ? "yes" : "walking"; return; }
      cell.textContent = String(row[name]);
    });
  }

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (answer) {
        if (!answer.ok) throw new Error(answer.status);
        return answer.json();
      })
      .then(function (row) {
        fill(row);
        if (!row.complete) window.setTimeout(poll, INTERVAL_MS);
      })
      .catch(function () { window.setTimeout(poll, INTERVAL_MS * 5); });
  }

  window.setTimeout(poll, INTERVAL_MS);
})();
