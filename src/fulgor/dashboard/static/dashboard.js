// fulgor dashboard: live updates. Every few seconds a live page fetches itself again and swaps
// in its regions marked data-live-region (server-rendered and escaped; parsed with DOMParser, so
// nothing in them runs). Pausing: the "live" checkbox in the header.
(function () {
  "use strict";
  var INTERVAL_MS = 3000;
  function live() {
    var toggle = document.getElementById("live-toggle");
    return document.body.dataset.live === "1" && (!toggle || toggle.checked);
  }
  function refresh() {
    if (!live() || document.hidden) { return schedule(); }
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html");
        document.querySelectorAll("[data-live-region]").forEach(function (region) {
          if (!region.id) { return; }
          var next = fresh.getElementById(region.id);
          if (!next) { return; }
          // Keep open the span details a reader has opened.
          var open = Array.prototype.map.call(region.querySelectorAll("details[open]"), function (d) {
            return Array.prototype.indexOf.call(region.querySelectorAll("details"), d);
          });
          region.replaceWith(next);
          var details = next.querySelectorAll("details");
          open.forEach(function (i) { if (details[i]) { details[i].open = true; } });
        });
        if (fresh.body && fresh.body.dataset.live === "0") { document.body.dataset.live = "0"; }
        document.body.dataset.refreshed = String(Date.now());
      })
      .catch(function () { /* the server may be restarting: try again next time */ })
      .then(schedule);
  }
  function schedule() { window.setTimeout(refresh, INTERVAL_MS); }
  if (document.body.dataset.live === "1") { schedule(); }
})();
