// fairq console: keeps the live part of a page current over server-sent events.
// The server renders every fragment (escaped there); this script only swaps it in.
"use strict";
(function () {
  const main = document.getElementById("main");
  const live = document.getElementById("live");
  const status = document.getElementById("status");
  if (!main || !live || !main.dataset.view) return; // the login page
  const source = new EventSource("/console/events?view=" + encodeURIComponent(main.dataset.view));
  source.onmessage = function (event) {
    const frame = JSON.parse(event.data);
    live.innerHTML = frame.html;
    status.textContent = "Live: updated " + new Date().toLocaleTimeString();
  };
  // The session ended (logged out elsewhere, key revoked): back to the login form.
  source.addEventListener("logout", function () {
    source.close();
    window.location.assign("/console/login");
  });
  source.onerror = function () {
    status.textContent = "Connection lost: reconnecting…";
  };
})();
