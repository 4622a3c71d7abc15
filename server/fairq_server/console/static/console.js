// fairq console: keeps the live part of a page current over server-sent events, and sorts
// and filters its tables.
// The server renders every fragment (escaped there); this script only applies it to the page,
// changing the nodes that differ and leaving the rest alone: a text selection, the focus and
// what a screen reader is reading survive a refresh, and only changed cells are touched.
"use strict";
(function () {
  const main = document.getElementById("main");
  const live = document.getElementById("live");
  const status = document.getElementById("status");
  const updated = document.getElementById("updated");
  if (!main || !document.querySelector("nav")) return; // the login page

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

  // Sorting and filtering: every table's rows, by a header (click, Enter or Space) and by
  // the filter field's text. Applied to the page, and to each pushed fragment before it is
  // merged in, so a refresh keeps the order and the filter without moving a node needlessly.
  const sorts = {}; // table key -> {column, descending}
  const filter = document.getElementById("filter");

  function tableKey(table, index) {
    const caption = table.querySelector("caption");
    return index + ":" + (caption ? caption.textContent : "");
  }

  function cellValue(row, column) {
    const cell = row.children[column];
    const text = cell ? cell.textContent.trim() : "";
    const number = parseFloat(text.replace(/[, ]/g, ""));
    return { text: text, number: /^[-+]?[0-9.]/.test(text) ? number : NaN };
  }

  function compare(a, b) {
    if (!isNaN(a.number) && !isNaN(b.number)) return a.number - b.number;
    if (!isNaN(a.number)) return -1; // figures before dashes and words
    if (!isNaN(b.number)) return 1;
    return a.text.localeCompare(b.text);
  }

  function arrange(root) {
    const words = filter ? filter.value.trim().toLowerCase() : "";
    root.querySelectorAll("table").forEach(function (table, index) {
      const sort = sorts[tableKey(table, index)];
      table.querySelectorAll("thead th").forEach(function (th, column) {
        th.setAttribute("tabindex", "0");
        th.classList.add("sortable");
        const state = sort && sort.column === column;
        th.setAttribute("aria-sort", state ? (sort.descending ? "descending" : "ascending") : "none");
      });
      const body = table.tBodies[0];
      if (!body) return;
      const rows = Array.from(body.rows);
      if (sort) {
        rows.sort(function (a, b) {
          const order = compare(cellValue(a, sort.column), cellValue(b, sort.column));
          return sort.descending ? -order : order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      }
      rows.forEach(function (row) {
        const hide = words !== "" && !row.textContent.toLowerCase().includes(words);
        if (hide !== row.hidden) row.hidden = hide;
      });
    });
  }

  function sortBy(th) {
    const table = th.closest("table");
    const tables = Array.from(main.querySelectorAll("table"));
    const key = tableKey(table, tables.indexOf(table));
    const column = Array.from(th.parentNode.children).indexOf(th);
    const now = sorts[key];
    sorts[key] = { column: column, descending: !!(now && now.column === column && !now.descending) };
    arrange(main);
  }

  main.addEventListener("click", function (event) {
    const th = event.target.closest && event.target.closest("thead th");
    if (th && main.contains(th) && !event.target.closest("a, button, input")) sortBy(th);
  });
  main.addEventListener("keydown", function (event) {
    const th = event.target.closest && event.target.closest("thead th");
    if (th && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      sortBy(th);
    }
  });
  if (filter) filter.addEventListener("input", function () { arrange(main); });
  arrange(main);
  if (!live || !main.dataset.view) return; // a page without live updates (the store's)

  function say(text) {
    // The status region is announced: it changes only when the connection does.
    if (status.textContent !== text) status.textContent = text;
  }

  const source = new EventSource("/console/events?view=" + encodeURIComponent(main.dataset.view));
  source.onmessage = function (event) {
    const frame = JSON.parse(event.data);
    const template = document.createElement("template");
    template.innerHTML = frame.html;
    arrange(template.content);
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
