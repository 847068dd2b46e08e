// vox web: the fleet in a browser (docs/web.md). Plain JS, no build step, no library.
// Everything that comes from agents is put in the page with textContent, never as markup.
"use strict";

(function () {
  const csrf = document.querySelector('meta[name="vox-csrf"]').content;
  const canSend = document.querySelector('meta[name="vox-send"]').content === "1";
  const hasOperator = document.querySelector('meta[name="vox-operator"]').content === "1";
  const agents = new Map(); // id -> {row, heardAt (ms on this page's clock), tr, cells}
  const folded = new Set();
  let top = { id: "", name: "" };
  let warroom = { open: [], resolved: [] };
  let links = [];
  let structureDirty = true;
  let skew = 0; // server wall clock - this page's, in ms
  // Read by the tests and the bench: when the first snapshot was drawn, batches taken.
  const probe = (window.voxConsole = {
    loadedAt: Date.now(), firstPaint: null, batches: 0, snapshots: 0, lastBatchAt: null,
    operatorEvents: 0, inboxDraws: 0, requestsDraws: 0,
    epochs: function () { const out = {}; agents.forEach((a, id) => { out[id] = a.row.epoch; }); return out; },
    versions: function () { const out = {}; agents.forEach((a) => { out[a.row.name] = a.row.version; }); return out; },
  });

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function fixed(v, digits) { return typeof v === "number" ? v.toFixed(digits) : "-"; }
  function mib(v) { return typeof v === "number" ? (v / 1048576).toFixed(0) + " MiB" : "-"; }
  function ago(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "-";
    if (seconds < 60) return seconds.toFixed(1) + "s";
    if (seconds < 3600) return Math.floor(seconds / 60) + "m " + Math.floor(seconds % 60) + "s";
    return Math.floor(seconds / 3600) + "h " + Math.floor((seconds % 3600) / 60) + "m";
  }
  function nameOf(id) {
    const a = agents.get(id);
    if (a && a.row.name) return a.row.name;
    if (id === top.id) return top.name;
    return id;
  }
  function stateText(row) {
    let text = row.status + (row.error_code ? " (" + row.error_code + ")" : "");
    if (row.misbehaving) text += " misbehaving";
    return text;
  }

  // --- the tree ---------------------------------------------------------------------------

  const tbody = document.getElementById("tree");
  const CELLS = ["state", "age", "cpu", "mem", "disk", "rss", "rate", "errors", "p50"];

  function makeRow(id) {
    const tr = el("tr", "agent");
    tr.dataset.id = id;
    const name = el("td", "name");
    const fold = el("button", "fold", "\u25be");
    fold.type = "button";
    fold.title = "collapse or expand this branch";
    fold.addEventListener("click", function () {
      if (folded.has(id)) folded.delete(id); else folded.add(id);
      fold.textContent = folded.has(id) ? "\u25b8" : "\u25be";
      applyVisibility();
    });
    const link = el("a", "agent-link");
    link.href = "#agent/" + encodeURIComponent(id);
    name.append(fold, link);
    tr.append(name);
    const cells = { name: link, fold: fold };
    CELLS.forEach(function (key) {
      const td = el("td", key === "state" ? "state" : (key === "age" ? "" : "num"));
      td.dataset.col = key;
      cells[key] = td;
      tr.append(td);
    });
    return { tr: tr, cells: cells };
  }

  function setText(node, text) { if (node.textContent !== text) node.textContent = text; }

  function drawRow(entry) {
    const row = entry.row, c = entry.cells, tr = entry.tr;
    setText(c.name, row.name || row.id);
    tr.dataset.state = row.status;
    tr.dataset.misbehaving = row.misbehaving ? "1" : "0";
    tr.title = row.id + (row.rejected ? " \u2014 status refused: " + row.rejected : "");
    const since = unknownSince();
    tr.dataset.unknown = since ? "1" : "0";
    if (since) {
      // The link is down: nothing shown is known now, so no state, no figure, no age.
      setText(c.state, "unknown since " + since);
      CELLS.forEach(function (key) { if (key !== "state") setText(c[key], "-"); });
      return;
    }
    setText(c.state, stateText(row));
    setText(c.cpu, fixed(row.cpu, 0));
    setText(c.mem, fixed(row.mem, 0));
    setText(c.disk, fixed(row.disk, 0));
    setText(c.rss, mib(row.rss));
    setText(c.rate, fixed(row.rate, 1));
    setText(c.errors, row.errors === null || row.errors === undefined ? "-" : String(row.errors));
    setText(c.p50, typeof row.p50_ms === "number" ? row.p50_ms.toFixed(1) + "ms" : "-");
    drawAge(entry, performance.now());
  }

  function drawAge(entry, now) {
    const row = entry.row;
    if (unknownSince()) { setText(entry.cells.age, "-"); return; } // ages stop
    const age = row.age_s === null ? null : row.age_s + (now - entry.heardAt) / 1000;
    setText(entry.cells.age, row.status === "ACTIVE" || row.status === "STALE" ? ago(age) : "-");
  }

  function take(rows, now) {
    rows.forEach(function (row) {
      let entry = agents.get(row.id);
      if (!entry) {
        entry = makeRow(row.id);
        agents.set(row.id, entry);
        structureDirty = true;
      } else if (entry.row.master_id !== row.master_id || entry.row.name !== row.name ||
                 entry.row.site !== row.site) {
        structureDirty = true;
      }
      entry.row = row;
      entry.heardAt = now;
      drawRow(entry);
    });
  }

  function childrenOf() {
    const kids = new Map();
    agents.forEach(function (entry, id) {
      const master = entry.row.master_id;
      const parent = master && agents.has(master) && master !== id ? master : "";
      if (!kids.has(parent)) kids.set(parent, []);
      kids.get(parent).push(id);
    });
    kids.forEach(function (list) {
      list.sort(function (a, b) { return nameOf(a) < nameOf(b) ? -1 : (nameOf(a) > nameOf(b) ? 1 : 0); });
    });
    return kids;
  }

  function layout() {
    // Rows in depth-first order, each indented by its depth; sites (federation) as groups.
    const kids = childrenOf();
    const order = [];
    const seen = new Set();
    function walk(id, depth) {
      if (seen.has(id) || depth > 64) return;
      seen.add(id);
      const entry = agents.get(id);
      entry.depth = depth;
      entry.tr.style.setProperty("--depth", String(depth));
      const own = kids.get(id) || [];
      entry.cells.fold.disabled = own.length === 0;
      order.push(entry.tr);
      own.forEach(function (child) { walk(child, depth + 1); });
    }
    (kids.get("") || []).forEach(function (id) { walk(id, 0); });
    agents.forEach(function (_e, id) { walk(id, 0); }); // a loop in what statuses claim
    const frag = document.createDocumentFragment();
    let site = null;
    order.forEach(function (tr) {
      const entry = agents.get(tr.dataset.id);
      const own = entry.row.site || null;
      if (own !== site && own !== null) {
        const head = el("tr", "site-row");
        const td = el("td", "", "site " + own);
        td.colSpan = 10;
        head.append(td);
        frag.append(head);
      }
      site = own;
      frag.append(tr);
    });
    clear(tbody);
    tbody.append(frag);
    structureDirty = false;
    applyVisibility();
  }

  const search = document.getElementById("search");
  search.addEventListener("input", function () {
    if (summary && structureDirty && search.value.trim()) layout(); else applyVisibility();
    drawSummary();
  });

  // A fleet too big to draw row by row (more agents than the server's threshold): its
  // counts per state and per site, the worst first, and the unhealthy named; the rows
  // are drawn only for what the search box finds (docs/web.md).
  let summary = null;
  function drawSummary() {
    const box = document.getElementById("summary");
    const table = document.getElementById("tree-table");
    const searching = !!search.value.trim();
    box.hidden = !summary;
    table.hidden = !!summary && !searching;
    if (!summary) return;
    clear(box);
    const since = unknownSince();
    const states = function (list) { return list.map(function (p) { return p[1] + " " + p[0]; }).join(", "); };
    box.append(el("p", "summary-head", summary.total + " agents: " +
      (since ? "every one unknown since " + since : states(summary.states)) +
      " (summarised; find one by name to see its row)"));
    if (since) return;
    const sites = el("table", "summary-sites");
    const head = el("tr");
    ["site", "agents", "unhealthy", "by state"].forEach(function (h) { head.append(el("th", "", h)); });
    sites.append(head);
    summary.sites.forEach(function (t) {
      const tr = el("tr", "summary-site");
      tr.dataset.unhealthy = String(t.unhealthy);
      tr.append(el("td", "", t.site), el("td", "num", t.total), el("td", "num", t.unhealthy), el("td", "", states(t.states)));
      sites.append(tr);
    });
    box.append(sites);
    if (summary.unhealthy.length) {
      const more = summary.unhealthy_total - summary.unhealthy.length;
      box.append(el("h3", "", "unhealthy, the worst first (" + summary.unhealthy_total +
        (more ? "; " + more + " more not named" : "") + ")"));
      summary.unhealthy.forEach(function (u) {
        const p = el("p", "summary-unhealthy");
        const name = el(u[3] ? "a" : "span", "", u[0]);
        if (u[3]) name.href = "#agent/" + encodeURIComponent(u[3]);
        p.append(name, el("span", "", " " + u[1] + " (site " + u[2] + ")"));
        box.append(p);
      });
    }
  }

  function applyVisibility() {
    const query = search.value.trim().toLowerCase();
    const shown = new Set();
    agents.forEach(function (entry, id) {
      if (!query || (entry.row.name || "").toLowerCase().includes(query) || id.startsWith(query)) {
        // A match shows its whole way up to the top.
        let at = id, hops = 0;
        while (at && agents.has(at) && !shown.has(at) && hops++ < 64) {
          shown.add(at);
          at = agents.get(at).row.master_id;
        }
      }
    });
    agents.forEach(function (entry, id) {
      let hidden = !shown.has(id);
      let at = entry.row.master_id, hops = 0;
      while (!hidden && at && agents.has(at) && hops++ < 64) {
        if (folded.has(at)) hidden = true;
        at = agents.get(at).row.master_id;
      }
      entry.tr.hidden = hidden;
    });
    drawCounts();
  }

  function drawCounts() {
    const by = {};
    agents.forEach(function (entry) { by[entry.row.status] = (by[entry.row.status] || 0) + 1; });
    const parts = [agents.size + " agents"];
    const since = unknownSince();
    if (since) parts.push("every one unknown since " + since);
    else Object.keys(by).sort().forEach(function (k) { parts.push(by[k] + " " + k); });
    setText(document.getElementById("counts"), parts.join(", "));
    const sites = document.getElementById("sites");
    clear(sites);
    links.forEach(function (l) { sites.append(el("span", "site site-" + l.state, "site " + l.site + ": link " + l.state + " ")); });
  }

  // --- the war room -----------------------------------------------------------------------

  function drawWarroom() {
    const open = document.querySelector("#incidents-open tbody");
    const resolved = document.querySelector("#incidents-resolved tbody");
    clear(open);
    clear(resolved);
    const now = Date.now() + skew;
    warroom.open.forEach(function (i) {
      const tr = el("tr", "incident");
      tr.dataset.subject = i.subject;
      tr.dataset.code = i.error_code;
      const posted = Date.parse(i.emitted_at);
      tr.append(el("td", "sev-" + i.severity, i.severity), el("td", "code", i.error_code),
        el("td", "subject", i.subject_name || nameOf(i.subject)),
        el("td", "source", i.source_name || nameOf(i.source)),
        el("td", "age", ago(isFinite(posted) ? (now - posted) / 1000 : null)),
        el("td", "desc", i.description));
      open.append(tr);
    });
    if (!warroom.open.length) {
      const tr = el("tr", "none");
      const td = el("td", "empty", "no open incident");
      td.colSpan = 6;
      tr.append(td);
      open.append(tr);
    }
    warroom.resolved.forEach(function (i) {
      const tr = el("tr", "resolved");
      tr.dataset.subject = i.subject;
      tr.dataset.code = i.error_code;
      tr.append(el("td", "code", i.error_code), el("td", "subject", i.subject_name || nameOf(i.subject)),
        el("td", "source", i.source_name || nameOf(i.source)), el("td", "age", ago((now - i.received * 1000) / 1000) + " ago"),
        el("td", "desc", i.description));
      resolved.append(tr);
    });
    const count = document.getElementById("open-count");
    count.textContent = String(warroom.open.length);
    count.dataset.n = String(warroom.open.length);
  }

  // --- live updates -----------------------------------------------------------------------

  function apply(data, isSnapshot) {
    const now = performance.now();
    if (typeof data.now === "number") skew = data.now * 1000 - Date.now();
    if (isSnapshot) {
      top = data.top;
      setText(document.getElementById("top"), "as seen by " + top.name);
      const ids = new Set(data.agents.map(function (r) { return r.id; }));
      agents.forEach(function (_e, id) { if (!ids.has(id)) { agents.delete(id); structureDirty = true; } });
    }
    take(data.agents, now);
    if (data.warroom) { warroom = data.warroom; links = data.links || []; drawWarroom(); }
    if (typeof data.connected === "boolean") {
      brokerUp = data.connected;
      downSince = data.down_since;
      connectedOnce = true;
    }
    drawLink();
    if ("summary" in data) summary = data.summary;
    // A summarised fleet lays its rows out only for a search (10,000 rows are not drawn).
    if (structureDirty && (!summary || search.value.trim())) layout(); else drawCounts();
    drawSummary();
    if (isSnapshot) {
      probe.snapshots += 1;
      if (probe.firstPaint === null) probe.firstPaint = performance.now();
    } else {
      probe.batches += 1;
    }
    probe.lastBatchAt = Date.now();
    refreshAgentPage(data.agents);
    if (canSend) operator.drawCommands(false);
    if (isSnapshot && !named) { named = true; operator.named(current); }
  }

  // Two links: this page's event stream to the console, and the console's to the broker.
  // While either is down nothing is known: every row says "unknown since", greyed, ages
  // stop, and the banner says so above everything (docs/web.md), as `vox watch` does.
  const linkState = document.getElementById("link");
  const banner = document.getElementById("banner");
  let streamUp = false, brokerUp = false, connectedOnce = false;
  let downSince = null; // the console's wall clock (s) when its broker link went down
  let streamLostAt = null; // this page's clock (ms) when the console stopped answering
  let drawnUnknown = null;
  function clock(ms) {
    const d = new Date(ms), two = function (n) { return String(n).padStart(2, "0"); };
    return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }
  function unknownSince() {
    if (!connectedOnce) return null; // nothing was known yet: "connecting"
    if (!streamUp) return clock(streamLostAt || Date.now());
    if (!brokerUp) return clock(typeof downSince === "number" ? downSince * 1000 : Date.now() + skew);
    return null;
  }
  function drawLink() {
    const state = !streamUp ? "lost" : (brokerUp ? "live" : "lost");
    const since = unknownSince();
    linkState.dataset.state = state;
    linkState.textContent = !streamUp ? "console unreachable, reconnecting"
      : (brokerUp ? "live" : "broker link down, retrying");
    banner.hidden = !since;
    if (since) {
      banner.textContent = (!streamUp ? "console unreachable since " + since + ", reconnecting"
        : "broker link down since " + since + ", retrying") + ": every agent unknown since " + since;
    }
    if (since !== drawnUnknown) {
      drawnUnknown = since;
      agents.forEach(function (entry) { drawRow(entry); });
      drawCounts();
      drawSummary();
    }
  }
  function connect() {
    const source = new EventSource("api/events");
    source.addEventListener("snapshot", function (e) { apply(JSON.parse(e.data), true); });
    source.addEventListener("batch", function (e) { apply(JSON.parse(e.data), false); });
    source.addEventListener("operator", function (e) { operatorChanged(JSON.parse(e.data)); });
    source.onopen = function () { streamUp = true; streamLostAt = null; drawLink(); };
    source.onerror = function () {
      if (streamUp) streamLostAt = Date.now();
      streamUp = false;
      drawLink();
    };
  }

  setInterval(function () {
    const now = performance.now();
    agents.forEach(function (entry) { drawAge(entry, now); });
    if (!document.getElementById("page-warroom").hidden) drawWarroom();
  }, 1000);

  function rootEntry() {
    let found = null;
    agents.forEach(function (entry) { if (entry.row.master_id === top.id) found = entry; });
    return found;
  }

  // --- an agent's page --------------------------------------------------------------------

  let pageAgent = null;
  function refreshAgentPage(rows) {
    if (!pageAgent) return;
    if (rows.some(function (r) { return r.id === pageAgent; })) loadAgent(pageAgent);
  }
  let loading = false;
  function loadAgent(id) {
    if (loading) return;
    loading = true;
    fetch("api/agent/" + encodeURIComponent(id), { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (data) { loading = false; if (pageAgent === id) drawAgent(data); })
      .catch(function () { loading = false; });
  }
  function chart(title, points, key, format) {
    const box = el("div", "chart");
    const values = points.map(function (p) { return p[key]; }).filter(function (v) { return typeof v === "number"; });
    box.append(el("div", "", title + (values.length ? " (last " + format(values[values.length - 1]) + ")" : "")));
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 320 80");
    if (values.length > 1) {
      const max = Math.max.apply(null, values) || 1;
      const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
      line.setAttribute("points", values.map(function (v, i) {
        return (i * 320 / (values.length - 1)).toFixed(1) + "," + (78 - v / max * 74).toFixed(1);
      }).join(" "));
      svg.append(line);
    }
    box.append(svg);
    return box;
  }
  function drawAgent(data) {
    const page = document.getElementById("page-agent");
    clear(page);
    if (data.error) { page.append(el("p", "empty", data.error)); return; }
    const a = data.agent;
    page.append(el("h2", "agent-name", a.name), el("p", "", a.id + " \u2014 " + stateText(a) + ", epoch " + a.epoch + ", version " + a.version));
    const cmds = el("div", "card");
    cmds.append(el("h3", "", "commands"), el("p", "", a.commands.length ? a.commands.join(", ") : "none advertised"));
    const kids = el("div", "card");
    kids.append(el("h3", "", "children"));
    if (!data.children.length) kids.append(el("p", "empty", "none"));
    data.children.forEach(function (c) {
      const p = el("p");
      const link = el("a", "", c.name);
      link.href = "#agent/" + encodeURIComponent(c.id);
      p.append(link, el("span", "", " " + stateText(c)));
      kids.append(p);
    });
    const charts = el("div", "card charts");
    charts.append(chart("rss", data.history, "rss", mib), chart("msg/s", data.history, "rate", function (v) { return v.toFixed(1); }));
    const inc = el("div", "card");
    inc.append(el("h3", "", "open incidents"));
    if (!data.incidents.length) inc.append(el("p", "empty", "none"));
    data.incidents.forEach(function (i) { inc.append(el("p", "sev-" + i.severity, i.severity + " " + i.error_code + ": " + i.description)); });
    page.append(cmds, kids, charts, inc);
  }

  // --- the operator's pages (operator.js): sending, the inbox, the requests ---------------

  let current = "tree";
  let named = false; // whether a snapshot brought the names yet
  const operator = window.voxOperatorPages({
    el: el, clear: clear, setText: setText, nameOf: nameOf, probe: probe,
    canSend: canSend, csrf: csrf, rootEntry: rootEntry,
  });
  function operatorChanged(data) {
    probe.operatorEvents += 1;
    operator.changed(data, current);
  }

  // --- pages ------------------------------------------------------------------------------

  function route() {
    const hash = location.hash.replace(/^#/, "");
    const pages = {
      tree: "page-tree", warroom: "page-warroom", agent: "page-agent",
      inbox: "page-inbox", requests: "page-requests", request: "page-request",
    };
    let which = "tree";
    let pageRequest = null;
    pageAgent = null;
    if (hash === "warroom") which = "warroom";
    else if (hash.startsWith("agent/")) { which = "agent"; pageAgent = decodeURIComponent(hash.slice(6)); }
    else if (hasOperator && hash === "inbox") which = "inbox";
    else if (hasOperator && hash === "requests") which = "requests";
    else if (hasOperator && hash.startsWith("request/")) { which = "request"; pageRequest = decodeURIComponent(hash.slice(8)); }
    current = which;
    Object.keys(pages).forEach(function (k) { document.getElementById(pages[k]).hidden = k !== which; });
    ["tree", "warroom", "inbox", "requests"].forEach(function (k) {
      document.getElementById("nav-" + k).classList.toggle("current", which === k || (k === "requests" && which === "request"));
    });
    if (which === "warroom") drawWarroom();
    if (pageAgent) loadAgent(pageAgent);
    operator.show(which, pageRequest);
  }
  window.addEventListener("hashchange", route);

  if (canSend) operator.buildSendForm();
  if (hasOperator) {
    document.getElementById("nav-inbox").hidden = false;
    document.getElementById("nav-requests").hidden = false;
  }
  route();
  connect();
})();
