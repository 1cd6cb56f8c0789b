// Refreshes the counts of a queue page (and of its shards) from its JSON view every few
// seconds.
(function () {
  "use strict";
  var root = document.querySelector("[data-dq-stats-url]");
  if (!root) { return; }
  var url = root.getAttribute("data-dq-stats-url");
  var every = parseInt(root.getAttribute("data-dq-refresh-ms") || "5000", 10);
  function refresh() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) {
        if (!data) { return; }
        var queues = data.queues || { _: data };
        Object.keys(queues).forEach(function (name) {
          var stats = queues[name];
          var scope = name === "_" ? document : document.querySelector('[data-dq-queue="' + CSS.escape(name) + '"]');
          if (!scope) { return; }
          // A sharded queue's shards, each on its own: those that answered are shown
          // even while another cannot be reached.
          Object.keys(stats.shards || {}).forEach(function (shard) {
            var figures = stats.shards[shard];
            var row = scope.querySelector('[data-dq-shard="' + CSS.escape(shard) + '"]');
            // (A row drawn unreachable has no counts to refresh: a reload redraws it.)
            var cells = row ? row.querySelectorAll("[data-dq-shard-stat]") : [];
            if (!cells.length) { return; }
            row.classList.toggle("dq-unreachable", !figures.ok);
            if (!figures.ok) { return; }
            cells.forEach(function (cell) {
              var key = cell.getAttribute("data-dq-shard-stat");
              if (key in figures) { cell.textContent = String(figures[key]); }
            });
          });
          // The totals, while they cover as many shards as the page says (its warning
          // names those left out); else a reload redraws the page.
          var drawn = (name === "_" ? root : scope).getAttribute("data-dq-shards-down");
          if (!("pending" in stats) || String(stats.shards_down) !== drawn) { return; }
          scope.querySelectorAll("[data-dq-stat]").forEach(function (cell) {
            var key = cell.getAttribute("data-dq-stat");
            if (key in stats) { cell.textContent = String(stats[key]); }
          });
        });
      })
      .catch(function () { /* keep the last counts; the next round may work */ });
  }
  window.setInterval(refresh, every);
}());
