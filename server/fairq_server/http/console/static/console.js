// fairq console: keeps the live part of a page current over server-sent events.
// The server renders every fragment (escaped there); this script only applies it to the page,
// changing the nodes that differ and leaving the rest alone: a text selection, the focus and
// what a screen reader is reading survive a refresh, and only changed cells are touched.
"use strict";
(function () {
  const main = document.getElementById("main");
  const live = document.getElementById("live");
  const status = document.getElementById("status");
  const updated = document.getElementById("updated");
  if (!main || !live || !main.dataset.view) return; // the login page

  function syncAttributes(old, neu) {
    for (const attr of Array.from(old.attributes)) {
      if (!neu.hasAttribute(attr.name)) old.removeAttribute(attr.name);
    }
    for (const attr of Array.from(neu.attributes)) {
      if (old.getAttribute(attr.name) !== attr.value) old.setAttribute(attr.name, attr.value);
    }
  }

  // Make old's children equal new's, node by node; a node of another kind is replaced.
  function morph(old, neu) {
    const wanted = neu.childNodes;
    for (let i = 0; i < wanted.length; i++) {
      const have = old.childNodes[i];
      const want = wanted[i];
      if (!have) {
        old.appendChild(want.cloneNode(true));
      } else if (have.nodeType !== want.nodeType || have.nodeName !== want.nodeName) {
        old.replaceChild(want.cloneNode(true), have);
      } else if (have.nodeType === Node.ELEMENT_NODE) {
        syncAttributes(have, want);
        morph(have, want);
      } else if (have.nodeValue !== want.nodeValue) {
        have.nodeValue = want.nodeValue;
      }
    }
    while (old.childNodes.length > wanted.length) old.removeChild(old.lastChild);
  }

  function say(text) {
    // The status region is announced: it changes only when the connection does.
    if (status.textContent !== text) status.textContent = text;
  }

  const source = new EventSource("/console/events?view=" + encodeURIComponent(main.dataset.view));
  source.onmessage = function (event) {
    const frame = JSON.parse(event.data);
    const template = document.createElement("template");
    template.innerHTML = frame.html;
    morph(live, template.content);
    say("Live: updates as they happen.");
    if (updated) updated.textContent = "Updated " + new Date().toLocaleTimeString();
  };
  // The session ended (logged out elsewhere, key revoked): back to the login form.
  source.addEventListener("logout", function () {
    source.close();
    window.location.assign("/console/login");
  });
  source.onerror = function () {
    say("Connection lost: reconnecting…");
  };
})();
