// The durable-harness web console: plain JS, no build step. Everything it shows comes
// from the gateway's API: the session views of harness.views, the very JSON that
// `harness sessions --json` and `harness show --json` print, and each timeline line
// reads as `harness show` prints it (harness/cli/render.py). A session page follows
// the session's Server-Sent Events and re-reads its view on every record.
"use strict";

const main = document.getElementById("main");
const where = document.getElementById("where");
const tokenForm = document.getElementById("token-form");
// The token lives as long as the tab (sessionStorage): it is gone when the tab closes, not kept
// on the machine for whoever opens the browser next.
let token = sessionStorage.getItem("harness.token") || "";
let stopStream = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function headers(json) {
  const h = {};
  if (token) h["Authorization"] = "Bearer " + token;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

async function api(path, body) {
  const init = body === undefined ? { headers: headers(false) }
                                  : { method: "POST", headers: headers(true), body: JSON.stringify(body) };
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {  // no answer at all: the gateway is stopped, or the network is down
    throw new Error("the gateway cannot be reached (" + (err.message || err) + "): try again once it is back");
  }
  const data = await res.json().catch(() => ({}));
  if (res.status === 401) {
    tokenForm.hidden = false;
    // a token typed wrong says so (the gateway's words), not the same prompt as no token at all
    throw new Error(token ? "the token was refused (" + (typeof data.detail === "string" ? data.detail : "401") +
                            "): paste another above" : "sign in: paste a bearer token above");
  }
  if (!res.ok) throw new Error(typeof data.detail === "string" ? data.detail : res.status + " " + JSON.stringify(data.detail));
  return data;
}

tokenForm.addEventListener("submit", (e) => {
  e.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("harness.token", token);
  tokenForm.hidden = true;
  route();
});

function when(ms) { return ms ? new Date(ms).toLocaleString() : ""; }
function clock(ms) { return ms ? new Date(ms).toLocaleTimeString() : "-"; }
function badge(state) { return el("span", { class: "badge " + state, "data-state": state }, state); }
function problem(err) { return el("p", { class: "card receipt rejected" }, String(err.message || err)); }

// -- the sessions list -------------------------------------------------------------------

const STATES = ["running", "waiting", "sleeping", "idle", "failed"];
const PAGE = 100;

function sessionRow(s) {
  return el("tr", { "data-session": s.session_id },
    el("td", {}, el("a", { href: "#/s/" + encodeURIComponent(s.session_id) }, s.session_id)),
    el("td", {}, s.harness || ""), el("td", {}, badge(s.state)),
    el("td", {}, when(s.last_activity)), el("td", {}, String((s.open_asks || []).length)));
}

function listQuery(state, limit, cursor) {
  const q = new URLSearchParams({ limit: String(limit) });
  if (state) q.set("state", state);
  if (cursor) q.set("cursor", cursor);
  return "/v1/sessions?" + q.toString();
}

async function showList() {
  where.textContent = "sessions";
  // #/?state=waiting&limit=20: a bookmarkable filter and page size
  const query = new URLSearchParams(location.hash.replace(/^#\/?\??/, ""));
  const state = STATES.includes(query.get("state")) ? query.get("state") : "";
  const limit = Math.min(Math.max(parseInt(query.get("limit"), 10) || PAGE, 1), 500);
  const [page, known] = await Promise.all([api(listQuery(state, limit)), api("/v1/harnesses")]);
  const body = el("tbody", {}, page.sessions.length ? page.sessions.map(sessionRow)
    : el("tr", {}, el("td", { colspan: 5, class: "muted" }, state ? "no " + state + " sessions" : "no sessions yet")));
  const table = el("table", { id: "sessions" },
    el("thead", {}, el("tr", {}, ["session", "harness", "state", "last activity", "open asks"].map((h) => el("th", {}, h)))),
    body);
  // Older sessions page by page (the API's next_cursor), not all at once.
  let cursor = page.next_cursor;
  const more = el("button", { type: "button", id: "more-sessions", hidden: !cursor, onclick: async () => {
    try {
      const next = await api(listQuery(state, limit, cursor));
      body.append(...next.sessions.map(sessionRow));
      cursor = next.next_cursor;
      more.hidden = !cursor;
    } catch (err) { more.replaceWith(problem(err)); }
  } }, "more sessions");
  const filter = el("select", { id: "state-filter", name: "state", onchange: () => {
    location.hash = filter.value ? "#/?state=" + filter.value : "#/";
  } }, el("option", { value: "" }, "every state"), STATES.map((v) => el("option", { value: v, selected: v === state }, v)));
  const sid = el("input", { type: "text", name: "session_id", placeholder: "session id", required: true, maxlength: 512,
    // harness.ids.session_id_problem: printable, no space at either end (the gateway's 422 says the rest);
    // encodeURIComponent sends a '/' of it as %2F
    pattern: "\\S(.*\\S)?" });
  const harness = known.harnesses.length
    ? el("select", { name: "harness" }, known.harnesses.map((h) => el("option", { value: h }, h)))
    : el("input", { type: "text", name: "harness", placeholder: "harness name", required: true });
  const text = el("input", { type: "text", name: "text", placeholder: "first message", required: true });
  const out = el("span", { class: "receipt" });
  const form = el("form", { class: "card row", id: "new-session", onsubmit: async (e) => {
    e.preventDefault();
    try {
      const r = await api("/v1/sessions/" + encodeURIComponent(sid.value) + "/messages", { text: text.value, harness: harness.value });
      if (r.status === "rejected") { out.className = "receipt rejected"; out.textContent = r.reason; return; }
      location.hash = "#/s/" + encodeURIComponent(sid.value);
    } catch (err) { out.className = "receipt rejected"; out.textContent = err.message; }
  } }, sid, harness, text, el("button", { type: "submit" }, "start"), out);
  main.replaceChildren(el("p", { class: "row" }, filter), table, more, form);
}

// -- a form from an ask's JSON schema ------------------------------------------------------

function resolve(schema, root) {
  if (schema && schema.$ref && schema.$ref.startsWith("#/$defs/")) return (root.$defs || {})[schema.$ref.slice(8)] || {};
  if (schema && schema.allOf && schema.allOf.length === 1) return resolve(schema.allOf[0], root);
  if (schema && schema.anyOf) {  // `X | None`: a field of X, left out (null) when empty
    const some = schema.anyOf.filter((s) => !(s && s.type === "null"));
    if (some.length === 1 && some.length < schema.anyOf.length) {
      const { anyOf, ...rest } = schema;
      const s = { ...resolve(some[0], root), ...rest };
      if (s.default === null) delete s.default;
      return s;
    }
  }
  return schema || {};
}

function fieldFor(name, schema, root, required) {
  const s = resolve(schema, root);
  const label = s.title || name;
  let input, read;
  if (s.enum) {
    input = el("select", { name }, s.enum.map((v) => el("option", { value: JSON.stringify(v) }, String(v))));
    read = () => JSON.parse(input.value);
  } else if (s.type === "boolean") {
    input = el("input", { type: "checkbox", name, checked: s.default === true });
    read = () => input.checked;
  } else if (s.type === "integer" || s.type === "number") {
    input = el("input", { type: "number", name, step: s.type === "integer" ? "1" : "any", required, value: s.default,
      min: s.minimum, max: s.maximum });
    read = () => (input.value === "" ? undefined : Number(input.value));
  } else if (s.type === "string") {
    input = el("input", { type: "text", name, required, value: s.default });
    read = () => (input.value === "" && !required ? undefined : input.value);
  } else {
    input = el("textarea", { name, placeholder: "JSON" }, s.default !== undefined ? JSON.stringify(s.default) : "");
    read = () => (input.value.trim() === "" ? undefined : JSON.parse(input.value));
  }
  return { node: el("label", {}, el("span", {}, label + (required ? " *" : "")), input), read };
}

function askForm(sessionId, ask) {
  const root = ask.schema || {};
  const schema = resolve(root, root);
  let read;
  const fields = [];
  if (schema.type === "object" && schema.properties) {
    const required = new Set(schema.required || []);
    const parts = Object.entries(schema.properties).map(([n, s]) => [n, fieldFor(n, s, root, required.has(n))]);
    parts.forEach(([, f]) => fields.push(f.node));
    read = () => Object.fromEntries(parts.map(([n, f]) => [n, f.read()]).filter(([, v]) => v !== undefined));
  } else {
    const f = fieldFor("value", schema, root, true);
    fields.push(f.node);
    read = f.read;
  }
  const out = el("span", { class: "receipt" });
  const form = el("form", { class: "card ask", "data-ask": ask.name, onsubmit: async (e) => {
    e.preventDefault();
    try {
      const r = await api("/v1/sessions/" + encodeURIComponent(sessionId) + "/answers",
                          { tool_call_id: ask.tool_call_id, name: ask.name, value: read() });
      out.className = "receipt " + r.status;
      out.textContent = r.status === "rejected" ? r.reason : "answer " + r.status;
    } catch (err) { out.className = "receipt rejected"; out.textContent = err.message; }
  } }, el("h3", {}, ask.message), el("div", { class: "muted", "data-expires": ask.expires_at || null },
    ask.name + " · call " + ask.tool_call_id + (ask.expires_at ? " · expires " + when(ask.expires_at * 1000) : "")),
     fields, el("button", { type: "submit" }, "answer"), out);
  return form;
}

// -- a session page ------------------------------------------------------------------------

// harness.views.TimelineItem -> the words `harness show` prints for it.
const LABELS = { "input.message": "message", "input.answer": "answer", "input.records": "records",
  "input.settled": "settled", "model.response": "model", "model.usage": "usage", "model.retry": "retry",
  "tool.started": "tool", "step": "step", "sleep": "sleep", "ask": "ask", "ask.answered": "answered",
  "tool.result": "result", "record": "record" };

function label(it) {
  if (it.kind.startsWith("turn.")) return "turn " + it.turn;
  if (it.kind === "tool.result" && it.error) return "error";
  return LABELS[it.kind] || it.kind;
}

function quoted(text) {
  if (text === null || text === undefined) return "";
  const one = String(text).split(/\s+/).join(" ").trim();
  return '"' + (one.length > 100 ? one.slice(0, 99) + "…" : one) + '"';
}

function itemText(it) {
  const why = it.code ? " (" + it.code + ")" : "";
  if (it.status === "resent") {  // a later copy of an input: it has no effect
    return it.input_id + "  (resent; the first at position " + it.detail.first_position + " counts)";
  }
  switch (it.kind) {
    case "input.message": return it.input_id + " " + quoted(it.text) + (it.status ? "  → " + it.status : "  (not settled yet)");
    case "input.answer": return it.input_id + " for " + it.tool_call_id + "/" + it.name + " = " + it.preview;
    case "input.records": return it.input_id + " " + (it.text || "") + " " + it.preview;
    case "input.settled": return it.input_id + " " + it.status + (it.code ? " (" + it.code + ": " + it.text + ")" : "");
    case "turn.started": return "started (input " + it.input_id + ")";
    case "turn.resumed": return "taken over by a new owner (attempt " + it.attempt + ")";
    case "turn.finished":
      if (it.error) return "failed" + why + ": " + it.text;
      return it.status + " " + quoted(it.text);
    case "model.response":
      return (quoted(it.text) || "(no text)") + (it.preview ? "  → " + it.preview : "") +
        (it.status === "truncated" ? "  (cut at the output limit: its calls do not run)" : "");
    case "model.usage": return (it.name || "model") + ": " + it.preview;
    case "model.retry": return "failed" + why + ": " + it.text + "; retry " + it.attempt + " at " + clock(it.wake_at);
    case "tool.started": return it.name + " [" + it.tool_call_id + "] started (attempt " + it.attempt + ")";
    case "step": return it.name + " = " + it.preview;
    case "sleep": return it.name + " until " + clock(it.wake_at);
    case "ask": {
      const answer = it.status === "answered" ? " → " + it.preview
        : it.status === "open" ? " (open: waiting for an answer)" : " (" + it.status + ")";
      return it.name + " [" + it.tool_call_id + "] " + quoted(it.text) + answer;
    }
    case "ask.answered": return it.name + " [" + it.tool_call_id + "] = " + it.preview;
    case "tool.result": return it.name + " [" + it.tool_call_id + "]" + (it.error && it.code ? " (" + it.code + ")" : "") + " → " + it.preview;
    case "record": return it.name + " " + it.preview;
    default: return it.kind;
  }
}

const TIMELINE_LIMIT = 500; // the last items of a session page: a long session stays quick to load and refresh

function timelineView(items) {
  return el("ol", { class: "timeline", id: "timeline" }, items.map((it) => el("li", {
      class: "k-" + it.kind.replace(".", "-") + " d-" + it.depth + (it.error ? " error" : "") + (it.status ? " s-" + it.status : ""),
      "data-seq": it.seq, "data-kind": it.kind },
    el("span", { class: "seq", title: when(it.ts) }, "#" + it.seq), " ",
    el("span", { class: "kind" }, label(it)), " ",
    el("span", { class: "what" }, itemText(it)))));
}

function usageText(u) {
  if (!u || !u.calls) return null;
  const n = (x) => x.toLocaleString("en-US");
  return u.calls + " model call" + (u.calls === 1 ? "" : "s") + ": " + n(u.input_tokens) + " in / " +
    n(u.output_tokens) + " out tokens" + (u.cost !== null && u.cost !== undefined ? ", $" + Number(u.cost.toPrecision(4)) : "");
}

async function showSession(sessionId) {
  where.textContent = "session " + sessionId;
  const summary = el("div", { class: "card", id: "summary" });
  const asks = el("div", { id: "asks" });
  const live = el("div", { class: "live", id: "live" });
  const timeline = el("div", { class: "card" });
  const streamState = el("span", { class: "stream-state", id: "stream-state" }, "connecting…");
  const text = el("input", { type: "text", name: "text", placeholder: "message", required: true });
  const out = el("span", { class: "receipt" });
  const box = el("form", { class: "card row", id: "message-box", onsubmit: async (e) => {
    e.preventDefault();
    try {
      const r = await api("/v1/sessions/" + encodeURIComponent(sessionId) + "/messages", { text: text.value });
      out.className = "receipt " + r.status;
      out.textContent = r.status === "rejected" ? r.reason : "message " + r.status;
      if (r.status !== "rejected") text.value = "";
    } catch (err) { out.className = "receipt rejected"; out.textContent = err.message; }
  } }, text, el("button", { type: "submit" }, "send"), out);
  main.replaceChildren(summary, asks, live, timeline, box, streamState);
  let shownAsks = "";

  async function refresh() {
    const d = await api("/v1/sessions/" + encodeURIComponent(sessionId) + "?timeline_limit=" + TIMELINE_LIMIT);
    const s = d.summary;
    summary.replaceChildren(el("div", { class: "row" }, el("strong", {}, sessionId), badge(s.state),
      el("span", { class: "muted" }, (s.harness || "") + " · " + s.turns + " turn(s) · last activity " + when(s.last_activity)),
      s.sleeping_until ? el("span", { class: "muted" }, "sleeping until " + when(s.sleeping_until)) : null,
      usageText(s.usage) ? el("span", { class: "muted", id: "usage" }, usageText(s.usage)) : null));
    const key = JSON.stringify(d.open_asks.map((a) => [a.tool_call_id, a.name]));
    if (key !== shownAsks) { shownAsks = key; asks.replaceChildren(...d.open_asks.map((a) => askForm(sessionId, a))); }
    timeline.replaceChildren(...(d.timeline_skipped ? [el("p", { class: "muted", id: "skipped" },
      d.timeline_skipped + " earlier item(s) not shown (harness show " + sessionId + " prints them all)")] : []),
      timelineView(d.timeline));
    return d;
  }

  let pending = null;
  function refreshSoon() {
    if (pending) return;
    pending = setTimeout(() => { pending = null; refresh().catch((e) => main.prepend(problem(e))); }, 60);
  }

  // The model's answer: its text as it streams (each delta says where in the answer it
  // starts), then the whole text the log holds, so it stays readable once the turn is over.
  // A page opened (or reloaded) half-way through an answer gets the text so far first (one
  // delta from position 0); where the gateway cannot give it, the part missed is marked "…".
  let liveText = "", liveEnd = 0, liveWhole = false;
  function showAnswer(text) {
    liveText = typeof text === "string" ? text : "";
    liveEnd = liveText.length;
    liveWhole = true;
    live.textContent = liveText;
  }
  function onDelta(d) {
    const piece = d.text || "";
    const at = Number.isInteger(d.position) ? d.position : liveEnd;
    if (liveWhole || at === 0) { liveText = ""; liveEnd = 0; liveWhole = false; }  // a new answer
    if (at > liveEnd) liveText += "… ";  // its start came before this page listened
    liveText += at < liveEnd ? piece.slice(liveEnd - at) : piece;  // (never the same text twice)
    liveEnd = Math.max(liveEnd, at + piece.length);
    live.textContent = liveText;
  }

  const first = await refresh();
  const said = (first.transcript || []).filter((m) => m.role === "assistant");
  if (said.length) showAnswer(said[said.length - 1].content);
  stopStream = follow(sessionId, first.last_position, (event, data) => {
    if (event === "hello") { streamState.textContent = "live"; return; }
    if (event === "model.text.delta") { onDelta(data); return; }
    if (event === "harness.model.response") showAnswer((data.data || {}).text);
    refreshSoon();
  }, (state) => { streamState.textContent = state; });
}

// -- Server-Sent Events over fetch (so the bearer token goes in a header) ---------------------

function follow(sessionId, after, onEvent, onState) {
  let lastId = after;
  let stopped = false;
  const controller = new AbortController();
  async function run() {
    while (!stopped) {
      try {
        const h = headers(false);
        if (lastId !== null && lastId !== undefined) h["Last-Event-ID"] = String(lastId);
        const res = await fetch("/v1/sessions/" + encodeURIComponent(sessionId) + "/events", { headers: h, signal: controller.signal });
        if (res.status === 401) {  // the token was revoked or changed meanwhile: retrying cannot help
          tokenForm.hidden = false;
          onState("stopped: the token was refused; paste another above");
          return;
        }
        if (!res.ok) throw new Error("events: " + res.status);
        const reader = res.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true });
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const frame = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            let id = null, event = "message", data = "";
            for (const line of frame.split("\n")) {
              if (line.startsWith(":")) continue;
              const i = line.indexOf(":");
              const field = i < 0 ? line : line.slice(0, i);
              const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
              if (field === "id") id = val; else if (field === "event") event = val;
              else if (field === "data") data += (data ? "\n" : "") + val;
            }
            if (!data) continue;
            if (id !== null) lastId = Number(id);
            onEvent(event, JSON.parse(data));
          }
        }
      } catch (err) {
        if (stopped) return;
        onState("reconnecting…");
      }
      if (!stopped) await new Promise((r) => setTimeout(r, 1000));
    }
  }
  run();
  return () => { stopped = true; controller.abort(); };
}

// -- routing ---------------------------------------------------------------------------------

async function route() {
  if (stopStream) { stopStream(); stopStream = null; }
  const m = location.hash.match(/^#\/s\/(.+)$/);
  try {
    if (m) await showSession(decodeURIComponent(m[1]));
    else await showList();
  } catch (err) {
    main.replaceChildren(problem(err));
  }
}

window.addEventListener("hashchange", route);
route();
