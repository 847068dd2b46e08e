// vox web: the operator's pages (docs/web.md): the send form, the inbox and its decisions,
// the requests and one request's page. Plain JS, no build step; app.js calls
// voxOperatorPages(ctx) with its helpers. Every text from an agent is put as text.
"use strict";

window.voxOperatorPages = function (ctx) {
  const el = ctx.el, clear = ctx.clear, setText = ctx.setText, nameOf = ctx.nameOf;
  const probe = ctx.probe, canSend = ctx.canSend, csrf = ctx.csrf;

  function getJSON(path) {
    return fetch(path, { credentials: "same-origin" }).then(function (r) { return r.json(); });
  }
  function postJSON(path, data) {
    return fetch(path, {
      method: "POST", credentials: "same-origin", body: JSON.stringify(data),
      headers: { "content-type": "application/json", "x-csrf-token": csrf },
    }).then(function (r) { return r.json(); });
  }
  function showError(id, text) {
    const node = document.getElementById(id);
    node.hidden = !text;
    node.textContent = text || "";
  }
  // A ledger time as a person reads it: the date and the second, not the microseconds.
  function when(ts) {
    if (typeof ts !== "string") return "";
    return ts.replace("T", " ").replace(/\.\d+/, "").replace(/\+00:00$|Z$/, "");
  }
  // Names everywhere, never raw ids: the server's name, the live view's, or "unknown agent".
  function named(id, given) {
    if (!id) return "";
    if (given) return given;
    const name = nameOf(id);
    return name === id ? "agent " + id.slice(0, 8) : name;
  }

  // --- the send form: the root's commands, their parameters when it describes them ---------

  let commandList = null, specs = {}, listed = "";
  function drawCommands(force) {
    if (!commandList) return;
    const root = ctx.rootEntry();
    const wanted = root && root.row.status === "ACTIVE" ? root.row.commands.slice().sort() : [];
    if (!force && wanted.join("\n") === listed) return;
    listed = wanted.join("\n");
    const chosen = commandList.value;
    clear(commandList);
    wanted.forEach(function (name) {
      const option = el("option", "", name);
      option.value = name;
      commandList.append(option);
    });
    if (wanted.includes(chosen)) commandList.value = chosen;
    // What the root says of each command's parameters (`params` in its status).
    getJSON("api/commands").then(function (data) { specs = data.specs || {}; drawFields(); })
      .catch(function () { specs = {}; drawFields(); });
  }

  let fieldsBox = null, docLine = null, params = null;
  function drawFields() {
    clear(fieldsBox);
    const spec = specs[commandList.value];
    setText(docLine, spec && spec.doc ? spec.doc : "");
    const fields = spec ? spec.fields : [];
    fieldsBox.hidden = !fields.length;
    params.placeholder = fields.length ? "other params as JSON (optional)" : '{"key": "value"}';
    fields.forEach(function (f) {
      const label = el("label", "param");
      const head = el("span", "param-head");
      head.append(el("span", "param-name", f.name), el("span", "param-type",
        " " + (f.type || "any") + (f.required ? ", required" : "")));
      label.append(head);
      const input = f.type === "boolean" ? el("select") : el("input");
      if (f.type === "boolean") {
        ["", "true", "false"].forEach(function (v) { const o = el("option", "", v); o.value = v; input.append(o); });
      }
      input.className = "param-value";
      input.dataset.name = f.name;
      input.dataset.type = f.type || "";
      input.dataset.required = f.required ? "1" : "0";
      if (f.doc) input.title = f.doc;
      if (f.type !== "boolean") input.placeholder = f.default !== undefined && f.default !== null ? "default " + JSON.stringify(f.default) : (f.doc || "");
      label.append(input);
      fieldsBox.append(label);
    });
  }

  // The same check as the server's (console/commandform.py): required, then typed.
  function typed(text, type) {
    if (type === "string") return { value: text };
    let value;
    const article = /^[aeiou]/.test(type || "") ? "an " : "a ";
    try { value = JSON.parse(text); } catch (e) { return { error: type ? "must be " + article + type : "is not JSON" }; }
    const ok = !type || (type === "integer" ? Number.isInteger(value)
      : type === "number" ? typeof value === "number"
      : type === "boolean" ? typeof value === "boolean"
      : type === "array" ? Array.isArray(value)
      : type === "object" ? value !== null && typeof value === "object" && !Array.isArray(value)
      : type === "null" ? value === null : true);
    return ok ? { value: value } : { error: "must be " + article + type };
  }
  function collect() {
    let parsed = {};
    if (params.value.trim()) {
      try { parsed = JSON.parse(params.value); } catch (err) { return { error: "params are not JSON: " + err.message }; }
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) return { error: "params are a JSON object" };
    }
    const inputs = fieldsBox.querySelectorAll(".param-value");
    for (const input of inputs) {
      const name = input.dataset.name, text = input.value.trim();
      if (!text) {
        if (input.dataset.required === "1" && !(name in parsed)) return { error: name + " is required" };
        continue;
      }
      const got = typed(text, input.dataset.type);
      if (got.error) return { error: name + " " + got.error };
      parsed[name] = got.value;
    }
    return { params: parsed };
  }

  function buildSendForm() {
    const area = document.getElementById("send-area");
    area.append(el("h2", "", "send a command to the root"));
    const form = el("form");
    form.id = "send-form";
    commandList = el("select");
    commandList.id = "send-command";
    params = el("input");
    params.id = "send-params";
    const ask = el("button", "", "send\u2026");
    ask.type = "submit";
    ask.id = "send-button";
    form.append(el("label", "", "command"), commandList, el("label", "", "params (JSON)"), params, ask);
    docLine = el("p", "empty");
    docLine.id = "send-doc";
    fieldsBox = el("div", "param-fields");
    fieldsBox.id = "send-fields";
    fieldsBox.hidden = true;
    const confirm = el("div", "confirm");
    confirm.id = "send-confirm";
    confirm.hidden = true;
    const question = el("span");
    const yes = el("button", "", "confirm");
    yes.type = "button";
    yes.id = "send-yes";
    const no = el("button", "", "cancel");
    no.type = "button";
    no.id = "send-no";
    confirm.append(question, yes, no);
    const answer = el("pre");
    answer.id = "send-answer";
    answer.hidden = true;
    area.append(form, docLine, fieldsBox, confirm, answer);
    commandList.addEventListener("change", drawFields);
    let pending = null;
    function refuse(text) {
      pending = null;
      confirm.hidden = true; // never a stale question beside an error
      answer.hidden = false; answer.dataset.ok = "0";
      answer.textContent = text;
    }
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      if (!commandList.value) { refuse("the root advertises no command now"); return; }
      const got = collect();
      if (got.error) { refuse(commandList.value + ": " + got.error); return; }
      pending = { command: commandList.value, params: got.params };
      answer.hidden = true;
      question.textContent = "send " + pending.command + " " + JSON.stringify(got.params) + " to " +
        nameOf((ctx.rootEntry() || { row: {} }).row.id) + "?";
      confirm.hidden = false;
    });
    no.addEventListener("click", function () { pending = null; confirm.hidden = true; });
    yes.addEventListener("click", function () {
      if (!pending) return;
      const body = pending;
      pending = null;
      confirm.hidden = true;
      answer.hidden = false; answer.dataset.ok = ""; answer.textContent = "sent, waiting for the answer\u2026";
      postJSON("api/send", body).then(function (a) {
        answer.dataset.ok = a.ok ? "1" : "0";
        answer.textContent = a.ok
          ? a.command + ": " + JSON.stringify(a.result) + (a.summary ? "\n" + a.summary : "")
          : (a.command ? a.command + ": " : body.command + ": ") + (a.code ? a.code + ": " : "") + a.error;
      }).catch(function (err) { answer.dataset.ok = "0"; answer.textContent = "failed: " + err; });
    });
  }

  // --- the inbox: numbered jobs, their decisions, decided here as `vox decide` does --------

  function drawUnread(n) {
    const count = document.getElementById("unread-count");
    count.textContent = String(n);
    count.dataset.n = String(n);
  }
  function loadInbox() {
    getJSON("api/inbox").then(drawInbox).catch(function (err) { showError("inbox-error", "failed: " + err); });
  }
  const decideAnswers = new Map(); // job number -> the last answer's line, kept across redraws
  const drafts = new Map(); // job number -> the note being typed: a redraw keeps it
  function jobLine(job) {
    if (job.decision) {
      return job.decision.word + " at " + when(job.decision.decided_at) +
        (job.decision.outcome ? ": " + job.decision.outcome : "");
    }
    const over = job.overlaps.map(function (o) { return "#" + o.number + " (" + o.state + ")"; });
    return "undecided; overlaps " + (over.length ? over.join(", ") : "no undecided job");
  }
  function decideControls(job) {
    const box = el("div", "decide");
    const note = el("input", "decide-note");
    note.placeholder = "a note for the record (optional)";
    note.maxLength = 2000;
    note.value = drafts.get(job.number) || "";
    note.addEventListener("input", function () { drafts.set(job.number, note.value); });
    const approve = el("button", "decide-approve", "approve #" + job.number);
    const reject = el("button", "decide-reject", "reject #" + job.number);
    approve.type = reject.type = "button";
    function decide(verdict) {
      approve.disabled = reject.disabled = true;
      decideAnswers.set(job.number, { ok: "", text: "deciding\u2026" });
      drawAnswer();
      postJSON("api/decide", { number: job.number, verdict: verdict, note: note.value || null })
        .then(function (a) {
          if (a.ok) drafts.delete(job.number);
          decideAnswers.set(job.number, a.ok
            ? { ok: "1", text: "job #" + job.number + " " + (verdict === "approve" ? "approved" : "rejected") + ": " + (a.outcome || "") }
            : { ok: "0", text: "decide #" + job.number + " " + verdict + ": " + (a.code ? a.code + ": " : "") + a.error });
          loadInbox();
        })
        .catch(function (err) { decideAnswers.set(job.number, { ok: "0", text: "failed: " + err }); loadInbox(); });
    }
    approve.addEventListener("click", function () { decide("approve"); });
    reject.addEventListener("click", function () { decide("reject"); });
    box.append(note, approve, reject);
    const line = el("p", "decide-answer");
    function drawAnswer() {
      const a = decideAnswers.get(job.number);
      line.hidden = !a;
      if (a) { line.dataset.ok = a.ok; line.textContent = a.text; }
    }
    drawAnswer();
    return [box, line];
  }
  let drawnInbox = "";
  function drawInbox(data) {
    const text = JSON.stringify(data) + JSON.stringify(Array.from(decideAnswers));
    if (text === drawnInbox) return; // unchanged: a note being typed keeps its focus
    drawnInbox = text;
    showError("inbox-error", data.error);
    const list = document.getElementById("inbox-list");
    clear(list);
    const entries = data.entries || [];
    drawUnread(data.unread || 0);
    setText(document.getElementById("inbox-summary"),
      "(" + (data.total || 0) + " kept, " + (data.unread || 0) + " new; `vox inbox` marks them read)");
    if (!entries.length) list.append(el("p", "empty", "no notification kept yet"));
    entries.forEach(function (n) {
      const box = el("div", "card notification");
      box.dataset.messageId = n.message_id || "";
      box.dataset.new = n.new ? "1" : "0";
      const head = el("p", "head");
      const at = n.emitted_at || (n.received_at ? new Date(n.received_at * 1000).toISOString() : "?");
      head.append(el("span", "new-mark", n.new ? "\u25cf new " : ""), el("span", "when", when(at) + " "),
        el("strong", "type", n.type || "?"), el("strong", "job-number", n.job ? " #" + n.job.number : ""),
        el("span", "", " from "),
        el("span", "from", named(n.source, n.source_name) || "?"));
      if (n.message_source) head.append(el("span", "", " via "), el("span", "via", n.message_source));
      box.append(head);
      if (n.job) {
        box.dataset.job = String(n.job.number);
        box.dataset.decision = n.job.decision ? n.job.decision.verdict || "" : "";
        const line = el("p", "job-state", jobLine(n.job));
        line.dataset.decided = n.job.decision ? "1" : "0";
        box.append(line);
      }
      if (n.note) box.append(el("pre", "note", n.note));
      else if (n.sealed) box.append(el("p", "sealed", "\u{1F512} " + n.sealed));
      box.append(el("code", "details", n.details));
      if (n.job && (canSend && !n.job.decision || decideAnswers.has(n.job.number))) {
        const parts = decideControls(n.job);
        if (!n.job.decision) box.append(parts[0]);
        box.append(parts[1]);
      }
      list.append(box);
    });
    probe.inboxDraws += 1;
  }

  // --- the requests, and one request: every level, cancel ----------------------------------

  function loadRequests() {
    getJSON("api/requests").then(drawRequests).catch(function (err) { showError("requests-error", "failed: " + err); });
  }
  function requestState(r) {
    return r.state + (r.overdue ? " (past its deadline)" : "");
  }
  let drawnRequests = "";
  function drawRequests(data) {
    const text = JSON.stringify(data);
    if (text === drawnRequests) return;
    drawnRequests = text;
    showError("requests-error", data.error);
    const body = document.querySelector("#requests-table tbody");
    clear(body);
    const rows = data.requests || [];
    if (!rows.length) {
      const tr = el("tr", "none");
      const td = el("td", "empty", "no request sent yet");
      td.colSpan = 9;
      tr.append(td);
      body.append(tr);
    }
    rows.forEach(function (r) {
      const tr = el("tr", "request");
      tr.dataset.messageId = r.message_id;
      tr.dataset.state = r.state;
      tr.dataset.command = r.command || "";
      const sent = el("td", "when");
      const link = el("a", "request-link", when(r.sent_at) || "?");
      link.href = "#request/" + encodeURIComponent(r.message_id);
      sent.append(link);
      tr.append(sent, el("td", "command", r.command || "?"), el("td", "params", r.params),
        el("td", "to", named(r.target, r.target_name)), el("td", "door", r.door || ""),
        el("td", "state", requestState(r)), el("td", "code", r.code || ""),
        el("td", "", r.handled_by ? named(r.handled_by, r.handled_by_name) : ""),
        el("td", "when", when(r.ended_at)));
      body.append(tr);
    });
    probe.requestsDraws += 1;
  }

  let pageRequest = null, shownRequest = null, levels = null;
  const cancelSaid = new Map(); // request id -> what its cancel answered, kept across redraws
  function loadRequest(id) {
    getJSON("api/request/" + encodeURIComponent(id)).then(function (data) {
      if (pageRequest === id) drawRequest(data);
    }).catch(function () {});
  }
  function loadLevels(id) {
    if (!canSend) return;
    postJSON("api/request/" + encodeURIComponent(id) + "/levels", {}).then(function (a) {
      if (pageRequest !== id) return;
      levels = a;
      drawLevels();
    }).catch(function (err) { levels = { ok: false, error: String(err) }; drawLevels(); });
  }
  // One line per level of the nested report, the root's first, as `vox request show` prints.
  function levelLines(report, rootName) {
    const lines = [];
    let part = report, depth = 0;
    while (part && typeof part === "object" && depth < 64) {
      const who = depth === 0 ? rootName : "level " + (depth + 1);
      let line = (depth ? "\u2514 " : "") + who + ": " + (part.state || "?");
      if (part.since) line += " since " + when(part.since);
      if (part.why) line += " \u2014 " + part.why;
      lines.push({ depth: depth, text: line, state: String(part.state || "") });
      part = part.below;
      depth += 1;
    }
    return lines;
  }
  function drawLevels() {
    const box = document.getElementById("request-levels");
    if (!box || !levels) return;
    clear(box);
    box.append(el("h3", "", "every level (as `vox request show` asks the root)"));
    if (!levels.ok) {
      box.append(el("p", "error", (levels.code ? levels.code + ": " : "") + (levels.error || "no answer")));
      return;
    }
    const rootName = shownRequest ? named(shownRequest.target, shownRequest.target_name) : "the root";
    levelLines(levels.report, rootName).forEach(function (l) {
      const p = el("p", "level", l.text);
      p.dataset.state = l.state;
      p.style.setProperty("--depth", String(l.depth));
      box.append(p);
    });
  }
  let drawnRequest = "";
  function drawRequest(data) {
    // Unchanged (the ledger moved for another reason): the page stays as it is, a reason
    // being typed with it.
    const text = JSON.stringify(data);
    if (text === drawnRequest) return;
    drawnRequest = text;
    const page = document.getElementById("page-request");
    clear(page);
    const back = el("a", "", "\u2190 requests");
    back.href = "#requests";
    page.append(back);
    if (!data.request) { page.append(el("p", "error", data.error || "no such request")); return; }
    const r = data.request;
    const first = !shownRequest || shownRequest.message_id !== r.message_id;
    shownRequest = r;
    page.append(el("h2", "request-title", r.command), el("pre", "request-params", r.params));
    const state = el("p", "request-state", requestState(r) + (r.code ? ": " + r.code : "") +
      (r.reason ? " (" + r.reason + ")" : ""));
    state.dataset.state = r.state;
    const facts = el("p", "request-facts", "to " + named(r.target, r.target_name) +
      (r.door ? ", through " + r.door : "") + ", sent " + when(r.sent_at) +
      ", deadline " + (when(r.deadline) || "-"));
    facts.title = r.message_id;
    page.append(state, facts);
    if (r.door) facts.dataset.door = r.door;
    if (canSend) {
      const acts = el("div", "request-acts");
      const reason = el("input", "cancel-reason");
      reason.placeholder = "why (optional)";
      const cancel = el("button", "", "cancel this request");
      cancel.type = "button";
      cancel.id = "request-cancel";
      cancel.disabled = !r.in_flight;
      const said = el("p", "cancel-answer");
      said.id = "cancel-answer";
      // The page may have been redrawn while the cancel was asked (its answer came first):
      // what it said goes to the element on the page now, not to the one drawn before.
      function drawSaid(on) {
        const box = on || document.getElementById("cancel-answer") || said;
        const a = cancelSaid.get(r.message_id);
        box.hidden = !a;
        if (a) { box.dataset.ok = a.ok; box.textContent = a.text; }
      }
      drawSaid(said);
      cancel.addEventListener("click", function () {
        cancel.disabled = true;
        cancelSaid.set(r.message_id, { ok: "", text: "cancelling\u2026" });
        drawSaid();
        postJSON("api/request/" + encodeURIComponent(r.message_id) + "/cancel", { reason: reason.value || null })
          .then(function (a) {
            cancelSaid.set(r.message_id, a.ok
              // What the cancel has done, in one line: `canceling` names the level not yet confirmed.
              ? { ok: "1", text: "cancel: " + (a.report.line || levelLines(a.report, named(r.target, r.target_name)).map(function (l) { return l.text; }).join("; ")) }
              : { ok: "0", text: "cancel: " + (a.code ? a.code + ": " : "") + a.error });
            if (pageRequest === r.message_id) drawSaid();
            loadLevels(r.message_id);
          }).catch(function (err) { cancelSaid.set(r.message_id, { ok: "0", text: "failed: " + err }); drawSaid(); });
      });
      acts.append(reason, cancel);
      page.append(acts, said);
      const box = el("div", "card levels");
      box.id = "request-levels";
      page.append(box);
      if (first) { levels = null; loadLevels(r.message_id); } else drawLevels();
    }
    const table = el("table", "timeline");
    table.id = "timeline";
    const head = el("tr");
    ["recorded", "what", "message", "from", "to", "note"].forEach(function (h) { head.append(el("th", "", h)); });
    const thead = el("thead");
    thead.append(head);
    const body = el("tbody");
    data.timeline.forEach(function (t) {
      const tr = el("tr", "step");
      tr.dataset.type = t.message_type || "";
      const note = Object.keys(t.note).map(function (k) { return k + "=" + t.note[k]; }).join(" ") +
        (t.reason ? " " + t.reason : "");
      tr.append(el("td", "when", when(t.recorded_at)), el("td", "", t.actions.join(", ")),
        el("td", "type", t.message_type || ""), el("td", "", named(t.source, t.source_name)),
        el("td", "", named(t.target, t.target_name)), el("td", "desc", note));
      body.append(tr);
    });
    table.append(thead, body);
    page.append(el("h3", "", "what the operator's ledger holds"), table);
  }

  return {
    buildSendForm: buildSendForm,
    drawCommands: drawCommands,
    drawUnread: drawUnread,
    show: function (which, requestId) {
      pageRequest = requestId;
      drawnInbox = drawnRequests = drawnRequest = ""; // a page shown again is drawn again
      if (which !== "request") shownRequest = null;
      if (which === "inbox") loadInbox();
      if (which === "requests") loadRequests();
      if (requestId) loadRequest(requestId);
    },
    changed: function (data, which) {
      if (typeof data.unread === "number") drawUnread(data.unread);
      if (data.inbox && which === "inbox") loadInbox();
      if (data.requests && which === "requests") loadRequests();
      if (data.requests && which === "request" && pageRequest) loadRequest(pageRequest);
    },
    // The names came (a page opened by its address before the first snapshot): redraw.
    named: function (which) {
      drawnInbox = drawnRequests = drawnRequest = ""; // the live view's names: draw again
      getJSON("api/inbox").then(function (data) { drawUnread(data.unread || 0); }).catch(function () {});
      if (which === "inbox") loadInbox();
      if (which === "requests") loadRequests();
      if (which === "request" && pageRequest) loadRequest(pageRequest);
    },
  };
};
