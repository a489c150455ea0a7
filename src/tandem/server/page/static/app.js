// Tandem's page: a chat through /v1/chat/completions (streamed), each token coloured by who
// proposed it (the stream's `origins`, asked for with `return_tokens`), per-answer speed and
// acceptance, a "compare" that reruns the answer with speculation off, and a live view of the
// server (/slots, /metrics). Conversations and settings stay in this browser (localStorage).
// No third-party code; no network beyond this server.
"use strict";

const $ = (sel) => document.querySelector(sel);
const ORIGINS = { target: "t", draft: "d", eagle3: "e", suffix: "s", ngram: "n", grammar: "g" };
const ORIGIN_NAMES = { t: "the target's own", d: "draft model", e: "EAGLE-3 head",
  s: "repetition (suffix)", n: "repetition (n-gram)", g: "forced by the grammar" };
const SAMPLING = ["temperature", "top_k", "top_p", "min_p", "max_tokens", "seed"];
const EMPTY_SETTINGS = { temperature: "", top_k: "", top_p: "", min_p: "", max_tokens: "",
  seed: "", spec_type: "", n_max: "", probs: false, system: "" };

// ---- storage ---------------------------------------------------------------------------------

const store = {
  get(key, fallback) {
    try {
      const v = localStorage.getItem("tandem." + key);
      return v === null ? fallback : JSON.parse(v);
    } catch {
      return fallback;
    }
  },
  set(key, value) {
    for (;;) {
      try {
        localStorage.setItem("tandem." + key, JSON.stringify(value));
        return;
      } catch (e) {
        // full: drop the oldest conversation that is not the open one, then try again
        const old = chats.findIndex((c) => c.id !== current);
        if (key !== "chats" || old < 0) return;
        chats.splice(old, 1);
        value = chats;
      }
    }
  },
};

let chats = store.get("chats", []); // [{id, title, messages: [...]}], oldest first
let current = store.get("current", null);
let settings = { ...EMPTY_SETTINGS, ...store.get("settings", {}) };
let apiKey = store.get("apiKey", "");
let props = null; // GET /props
let running = null; // {controller, msg} while an answer streams
const pageTotals = { drafted: 0, accepted: 0 }; // this page's answers (without --metrics)

function save() {
  store.set("chats", chats);
  store.set("current", current);
}

function chat() {
  let c = chats.find((x) => x.id === current);
  if (!c) {
    c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "",
      messages: [] };
    chats.push(c);
    current = c.id;
  }
  return c;
}

// ---- the API -----------------------------------------------------------------------------------

class ApiFailure extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path, init = {}, retried = false) {
  const headers = { ...(init.headers || {}) };
  if (init.body) headers["Content-Type"] = "application/json";
  if (apiKey) headers.Authorization = "Bearer " + apiKey;
  const res = await fetch(path, { ...init, headers });
  if (res.ok) return res;
  let message = res.statusText;
  try {
    const body = await res.json();
    message = (body.error && body.error.message) || message;
  } catch { /* not JSON */ }
  if (res.status === 401 && !retried && (await askKey(message))) {
    return api(path, init, true);
  }
  throw new ApiFailure(res.status, message);
}

let keyPrompt = null;
function askKey(why) {
  if (keyPrompt) return keyPrompt;
  const dialog = $("#key-dialog");
  $("#key-why").textContent = `This server needs an API key (${why}). It is kept in this ` +
    "browser only.";
  $("#key-input").value = apiKey;
  keyPrompt = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      keyPrompt = null;
      if (dialog.returnValue === "save" && $("#key-input").value.trim()) {
        apiKey = $("#key-input").value.trim();
        store.set("apiKey", apiKey);
        resolve(true);
      } else {
        resolve(false);
      }
    }, { once: true });
  });
  dialog.showModal();
  return keyPrompt;
}

// One streamed chat answer. onUpdate(out) after every chunk; out = {content, tokens: [[id,
// origin code, piece, logprob]], timings, usage, finish, ttft, wall} (seconds).
async function streamChat(body, signal, onUpdate) {
  const t0 = performance.now();
  const out = { content: "", tokens: [], timings: null, usage: null, finish: null, ttft: null,
    wall: null };
  const res = await api("v1/chat/completions", { method: "POST", body: JSON.stringify(body),
    signal });
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const handle = (chunk) => {
    if (chunk.error) throw new ApiFailure(500, chunk.error.message || "the server failed");
    const choice = chunk.choices && chunk.choices[0];
    if (choice) {
      const text = choice.delta && choice.delta.content;
      const lps = (choice.logprobs && choice.logprobs.content) || [];
      if ((text || (chunk.tokens && chunk.tokens.length)) && out.ttft === null) {
        out.ttft = (performance.now() - t0) / 1e3;
      }
      if (text) out.content += text;
      (chunk.tokens || []).forEach((id, i) => {
        const lp = lps[i] ? lps[i].logprob : null;
        out.tokens.push([id, ORIGINS[chunk.origins[i]] || "t", chunk.pieces[i], lp]);
      });
      if (choice.finish_reason) out.finish = choice.finish_reason;
    }
    if (chunk.timings) out.timings = chunk.timings;
    if (chunk.usage) out.usage = chunk.usage;
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") {
          out.wall = (performance.now() - t0) / 1e3;
          return out;
        }
        handle(JSON.parse(data));
      }
      onUpdate(out);
    }
  }
  out.wall = (performance.now() - t0) / 1e3;
  return out;
}

// The request for an answer after `history`, with `request` (the sampling and speculation
// fields this answer used) and overrides.
function chatBody(history, request, overrides = {}) {
  const messages = [];
  if (request.system) messages.push({ role: "system", content: request.system });
  for (const m of history) messages.push({ role: m.role, content: m.content });
  const body = { messages, stream: true, return_tokens: true,
    stream_options: { include_usage: true } };
  if (Picker.model()) body.model = Picker.model(); // a router: the picked model answers
  for (const k of SAMPLING) if (request[k] !== undefined) body[k] = request[k];
  if (request.probs) body.logprobs = true;
  const spec = overrides.spec_type !== undefined ? overrides.spec_type : request.spec_type;
  if (spec) body["speculative.type"] = spec;
  if (request.n_max && spec !== "none") body["speculative.n_max"] = request.n_max;
  return body;
}

// The settings as sent for a new answer: numbers where set; a seed chosen here when sampling
// with a random seed, so "compare" can rerun the same draws.
function requestSettings() {
  const r = { spec_type: settings.spec_type, probs: settings.probs, system: settings.system.trim() };
  for (const k of SAMPLING) {
    if (settings[k] !== "" && settings[k] !== null && !Number.isNaN(Number(settings[k]))) {
      r[k] = Number(settings[k]);
    }
  }
  if (settings.n_max !== "") r.n_max = Number(settings.n_max);
  const temperature = r.temperature !== undefined ? r.temperature : serverDefault("temperature");
  const seed = r.seed !== undefined ? r.seed : serverDefault("seed");
  if (temperature > 0 && (seed === undefined || seed < 0 || seed >= 0xffffffff)) {
    r.seed = Math.floor(Math.random() * 0x7fffffff);
  }
  return r;
}

function serverDefault(key) {
  const p = props && props.default_generation_settings && props.default_generation_settings.params;
  if (!p) return undefined;
  return key === "max_tokens" ? p.n_predict : p[key];
}

// ---- answers ---------------------------------------------------------------------------------

async function send(text) {
  if (running) return;
  if (Picker.on && !Picker.model()) {
    $("#pick-status").textContent = "Load a model first.";
    return;
  }
  const c = chat();
  if (!c.title) c.title = text.slice(0, 60);
  c.messages.push({ role: "user", content: text });
  const msg = { role: "assistant", content: "", tokens: [], request: requestSettings() };
  c.messages.push(msg);
  save();
  renderAll();
  await answer(c, msg);
}

async function answer(c, msg) {
  const controller = new AbortController();
  running = { controller, msg };
  setRunning(true);
  const history = c.messages.slice(0, c.messages.indexOf(msg));
  const el = messageElement(msg);
  let pending = false;
  try {
    const out = await streamChat(chatBody(history, msg.request), controller.signal, (o) => {
      msg.content = o.content;
      msg.tokens = o.tokens;
      if (!pending) {
        pending = true;
        requestAnimationFrame(() => {
          pending = false;
          renderBody(el, msg);
        });
      }
    });
    msg.content = out.content;
    msg.tokens = out.tokens;
    msg.stats = { timings: out.timings, usage: out.usage, ttft: out.ttft, wall: out.wall,
      finish: out.finish };
    if (out.timings && out.timings.draft_n) {
      pageTotals.drafted += out.timings.draft_n;
      pageTotals.accepted += out.timings.draft_n_accepted;
    }
  } catch (e) {
    if (e.name === "AbortError") {
      msg.stopped = true;
    } else {
      msg.error = e.message;
    }
  } finally {
    running = null;
    setRunning(false);
    save();
    renderMessage(el, msg);
    poll();
  }
}

async function compare(c, msg) {
  if (running || !msg.stats) return;
  const controller = new AbortController();
  running = { controller, msg };
  setRunning(true);
  msg.compare = { state: "running" };
  const el = messageElement(msg);
  renderMessage(el, msg);
  const history = c.messages.slice(0, c.messages.indexOf(msg));
  try {
    const out = await streamChat(chatBody(history, msg.request, { spec_type: "none" }),
      controller.signal, () => {});
    let first = -1;
    const a = msg.content, b = out.content;
    if (a !== b) {
      first = 0;
      while (first < a.length && first < b.length && a[first] === b[first]) first++;
    }
    msg.compare = { state: "done", timings: out.timings, wall: out.wall, ttft: out.ttft,
      identical: a === b, firstDifference: first };
  } catch (e) {
    msg.compare = { state: e.name === "AbortError" ? "stopped" : "failed", error: e.message };
  } finally {
    running = null;
    setRunning(false);
    save();
    renderMessage(el, msg);
  }
}

function setRunning(on) {
  $("#send").disabled = on;
  $("#stop").hidden = !on;
  document.querySelectorAll(".compare-button").forEach((b) => { b.disabled = on; });
}

// ---- rendering -------------------------------------------------------------------------------

function renderAll() {
  renderChats();
  const box = $("#messages");
  box.querySelectorAll(".msg").forEach((m) => m.remove());
  const c = chats.find((x) => x.id === current);
  $("#empty").hidden = Boolean(c && c.messages.length);
  if (!c) return;
  for (const msg of c.messages) {
    const el = document.createElement("article");
    el.className = "msg " + msg.role;
    el._msg = msg;
    box.append(el);
    renderMessage(el, msg);
  }
  box.scrollTop = box.scrollHeight;
}

function messageElement(msg) {
  for (const el of document.querySelectorAll("#messages .msg")) if (el._msg === msg) return el;
  return null;
}

function renderMessage(el, msg) {
  if (!el) return;
  el.replaceChildren();
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = msg.role === "user" ? "You" : "Model";
  const body = document.createElement("div");
  body.className = "body";
  el.append(who, body);
  renderBody(el, msg);
  if (msg.role !== "assistant") return;
  if (msg.error) el.append(note("error", "Error: " + msg.error, "alert"));
  if (msg.stopped) el.append(note("stats", `Stopped after ${msg.tokens.length} tokens.`));
  if (msg.stats) el.append(statsLine(msg));
  if (msg.compare) el.append(compareLine(msg));
}

function note(cls, text, role) {
  const p = document.createElement("p");
  p.className = cls;
  p.textContent = text;
  if (role) p.setAttribute("role", role);
  return p;
}

function renderBody(el, msg) {
  if (!el) return;
  const body = el.querySelector(".body");
  body.replaceChildren();
  if (msg.role === "user") {
    body.textContent = msg.content;
    return;
  }
  const text = msg.content;
  const spans = [];
  let at = 0;
  for (const t of msg.tokens || []) {
    spans.push([at, at + t[2].length, t]);
    at += t[2].length;
  }
  for (const block of blocks(text)) {
    let target;
    if (block.code) {
      const pre = document.createElement("pre");
      pre.className = "code";
      target = document.createElement("code");
      pre.append(target);
      if (block.lang) {
        const label = document.createElement("span");
        label.className = "lang";
        label.setAttribute("aria-hidden", "true");
        label.textContent = block.lang;
        pre.append(label);
        target.dataset.lang = block.lang;
      }
      body.append(pre);
    } else {
      target = document.createElement("div");
      target.className = "prose";
      body.append(target);
    }
    fill(target, text, block.start, block.end, spans);
  }
  const box = $("#messages");
  if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
}

// The text's blocks: prose, and code between ``` fences (an unclosed fence runs to the end,
// as while it streams). The fence lines themselves are not shown.
function blocks(text) {
  const out = [];
  let start = 0, code = false, lang = "", pos = 0;
  while (pos <= text.length) {
    let end = text.indexOf("\n", pos);
    if (end < 0) end = text.length;
    const line = text.slice(pos, end);
    const fence = /^\s*```(.*)$/.exec(line);
    if (fence) {
      const stop = code ? Math.max(start, pos - 1) : pos;
      if (stop > start) out.push({ start, end: stop, code, lang });
      code = !code;
      lang = code ? fence[1].trim() : "";
      start = Math.min(end + 1, text.length);
    }
    pos = end + 1;
  }
  if (start < text.length || (code && !out.length)) out.push({ start, end: text.length, code, lang });
  return out;
}

// text[start:end] into target, each token's part as a span coloured by its origin.
function fill(target, text, start, end, spans) {
  let lo = 0, hi = spans.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (spans[mid][1] <= start) lo = mid + 1; else hi = mid;
  }
  let pos = start;
  for (let i = lo; i < spans.length && pos < end; i++) {
    const [a, b, t] = spans[i];
    if (b <= pos) continue;
    if (a > pos) {
      target.append(text.slice(pos, Math.min(a, end)));
      pos = Math.min(a, end);
      if (pos >= end) break;
    }
    const stop = Math.min(b, end);
    if (stop > pos) {
      const span = document.createElement("span");
      span.className = "tok o-" + (t[1] === "n" ? "s" : t[1]);
      span.dataset.origin = t[1];
      span.textContent = text.slice(pos, stop);
      let title = `token ${t[0]} · ${ORIGIN_NAMES[t[1]] || t[1]}`;
      if (t[3] !== null && t[3] !== undefined) title += ` · p = ${Math.exp(t[3]).toFixed(4)}`;
      span.title = title;
      target.append(span);
      pos = stop;
    }
  }
  if (pos < end) target.append(text.slice(pos, end));
}

function fmt(x, digits = 1) {
  return x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(digits);
}

function statsLine(msg) {
  const s = msg.stats, t = s.timings || {};
  const div = document.createElement("div");
  div.className = "stats";
  const parts = [];
  parts.push(`${fmt(t.predicted_per_second)} tok/s`);
  parts.push(`first token ${fmt(s.ttft, 2)} s`);
  parts.push(`${t.predicted_n ?? msg.tokens.length} tokens in ${fmt(s.wall, 2)} s`);
  if (t.prompt_n !== undefined) {
    parts.push(`prompt ${t.prompt_n} tokens at ${fmt(t.prompt_per_second)} tok/s` +
      (t.cache_n ? ` (${t.cache_n} cached)` : ""));
  }
  if (t.draft_n !== undefined) {
    const acc = t.draft_n ? (100 * t.draft_n_accepted) / t.draft_n : 0;
    const passes = Math.max(1, t.predicted_n - t.draft_n_accepted);
    parts.push(`acceptance ${fmt(acc, 0)}% (${t.draft_n_accepted}/${t.draft_n})`);
    parts.push(`${fmt(t.predicted_n / passes, 2)} tokens per verification`);
  } else {
    parts.push("speculation off");
  }
  const counts = {};
  for (const tok of msg.tokens) counts[tok[1]] = (counts[tok[1]] || 0) + 1;
  const byOrigin = ["d", "s", "n", "g"].filter((o) => counts[o])
    .map((o) => `${ORIGIN_NAMES[o]} ${counts[o]}`);
  if (byOrigin.length) parts.push("accepted from " + byOrigin.join(", "));
  if (msg.request && msg.request.seed !== undefined) parts.push(`seed ${msg.request.seed}`);
  for (const p of parts) {
    const span = document.createElement("span");
    span.textContent = p;
    div.append(span);
  }
  const button = document.createElement("button");
  button.type = "button";
  button.className = "compare-button";
  button.textContent = "Compare without speculation";
  button.disabled = Boolean(running);
  button.addEventListener("click", () => compare(chats.find((x) => x.id === current), msg));
  div.append(button);
  return div;
}

function compareLine(msg) {
  const c = msg.compare;
  const div = document.createElement("div");
  div.className = "compare";
  div.setAttribute("role", "status");
  if (c.state === "running") {
    div.textContent = "Comparing: the same conversation with speculation off…";
    return div;
  }
  if (c.state !== "done") {
    div.textContent = c.state === "stopped" ? "Comparison stopped." : "Comparison failed: " + c.error;
    return div;
  }
  // generation time against generation time: the rerun's prompt may come from the cache, so
  // the walls are shown but not divided
  const on = msg.stats.timings || {}, off = c.timings || {};
  const gen = on.predicted_ms && off.predicted_ms ? off.predicted_ms / on.predicted_ms : null;
  const lines = [
    `Speculation off: ${fmt(off.predicted_per_second)} tok/s, generated in ` +
      `${fmt(off.predicted_ms / 1e3, 2)} s (${fmt(c.wall, 2)} s in all). With it: ` +
      `${fmt(on.predicted_per_second)} tok/s, ${fmt(on.predicted_ms / 1e3, 2)} s ` +
      `(${fmt(msg.stats.wall, 2)} s in all).`,
    `Speculation made generating ${fmt(gen, 2)}x as fast` +
      (off.predicted_n !== on.predicted_n ? ` (${on.predicted_n} against ${off.predicted_n} tokens)` : "") +
      (off.cache_n > (on.cache_n || 0) ? "; the rerun read its prompt from the cache." : "."),
  ];
  for (const l of lines) div.append(note("", l));
  const same = note("same", c.identical ? "Same text: yes, identical." :
    `Same text: no, they differ from character ${c.firstDifference}.`);
  same.dataset.identical = String(c.identical);
  div.append(same);
  if (!c.identical) {
    const sampled = (msg.request.temperature ?? serverDefault("temperature")) > 0;
    div.append(note("hint", sampled ?
      "Sampled answers with a draft model follow the target's distribution but not the same " +
      "draws; greedy answers (temperature 0) are always identical." :
      "A greedy answer should not change with speculation: please report this."));
  }
  return div;
}

function renderChats() {
  const list = $("#chat-list");
  list.replaceChildren();
  for (const c of [...chats].reverse()) {
    const li = document.createElement("li");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = c.title || "New chat";
    open.setAttribute("aria-current", String(c.id === current));
    open.addEventListener("click", () => {
      if (running) return;
      current = c.id;
      save();
      renderAll();
      closePanels();
    });
    const del = document.createElement("button");
    del.type = "button";
    del.className = "delete";
    del.textContent = "×";
    del.setAttribute("aria-label", `Delete conversation “${c.title || "New chat"}”`);
    del.addEventListener("click", () => {
      if (running) return;
      chats = chats.filter((x) => x.id !== c.id);
      if (current === c.id) current = chats.length ? chats[chats.length - 1].id : null;
      save();
      renderAll();
    });
    li.append(open, del);
    list.append(li);
  }
}

// ---- settings ----------------------------------------------------------------------------------

function loadSettingsForm() {
  const form = $("#settings");
  for (const [k, v] of Object.entries(settings)) {
    const input = form.elements[k];
    if (!input) continue;
    if (input.type === "checkbox") input.checked = Boolean(v); else input.value = v;
  }
  placeholders();
}

function placeholders() {
  const form = $("#settings");
  for (const k of SAMPLING) {
    const d = serverDefault(k);
    form.elements[k].placeholder = d === undefined ? "" : String(d === 4294967295 ? -1 : d);
  }
  const spec = props && props.speculative;
  if (spec) {
    form.elements.n_max.placeholder = String(spec.n_max ?? "");
    form.elements.spec_type.options[0].textContent =
      `server default (${specName(spec)})`;
  }
}

function specName(spec) {
  if (!spec.enabled) return "off";
  return spec.adaptive ? `auto (${spec.type.split(",").join(", ")})` : spec.type;
}

function saveSettingsForm() {
  const form = $("#settings");
  for (const k of Object.keys(EMPTY_SETTINGS)) {
    const input = form.elements[k];
    settings[k] = input.type === "checkbox" ? input.checked : input.value;
  }
  store.set("settings", settings);
}

// ---- the server --------------------------------------------------------------------------------

async function connect() {
  for (;;) {
    try {
      props = await (await api("props" + Picker.query())).json();
      break;
    } catch (e) {
      $("#model").textContent = e.status === 503 ? "Loading the model…" :
        e.status === 401 ? "An API key is needed (Settings: API key…)" : "Cannot reach the server: " + e.message;
      if (e.status === 401) return;
      await new Promise((r) => setTimeout(r, 1500));
    }
  }
  if (props.role === "router") { // many models: the picker chooses which answers
    if (!Picker.on) await Picker.start();
    if (!Picker.model()) {
      props = null;
      $("#model").textContent = "Pick a model and Load it (Models)";
      return;
    }
    props = await (await api("props" + Picker.query())).json();
  }
  const spec = props.speculative || {};
  const name = (props.model_alias || props.model_path || "").split("/").pop();
  const draft = props.draft_model_path ? ", draft " + props.draft_model_path.split("/").pop() : "";
  $("#model").textContent = `${name} · speculation ${specName(spec)}${draft}`;
  placeholders();
  poll();
}

let metricsOff = false;
async function poll() {
  if (document.hidden || !props) return;
  const rows = [];
  try {
    const slots = await (await api("slots" + Picker.query())).json();
    const busy = slots.filter((s) => s.is_processing).length;
    rows.push(["Slots busy", `${busy} of ${slots.length}`]);
  } catch (e) {
    rows.push(["Slots", e.status === 501 ? "off (--no-slots)" : "–"]);
  }
  let m = null;
  if (!metricsOff) {
    try {
      m = parseMetrics(await (await api("metrics" + Picker.query())).text());
    } catch (e) {
      if (e.status === 501 || e.status === 404) metricsOff = true;
    }
  }
  if (m) {
    rows.push(["Queue", String(m.requests_deferred ?? 0)]);
    rows.push(["Processing", String(m.requests_processing ?? 0)]);
    const d = m.spec_decode_num_draft_tokens_total || 0, a = m.spec_decode_num_accepted_tokens_total || 0;
    rows.push(["Acceptance, this run", d ? `${fmt((100 * a) / d, 0)}% (${a}/${d})` : "nothing drafted yet"]);
    rows.push(["Tokens generated", String(m.tokens_predicted_total ?? 0)]);
  } else {
    const { drafted: d, accepted: a } = pageTotals;
    rows.push(["Acceptance, this page", d ? `${fmt((100 * a) / d, 0)}% (${a}/${d})` : "nothing drafted yet"]);
    rows.push(["Queue", "start the server with --metrics"]);
  }
  const dl = $("#live");
  dl.replaceChildren();
  for (const [k, v] of rows) {
    const dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = k;
    dd.textContent = v;
    dl.append(dt, dd);
  }
}

function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    const hit = /^llamacpp:(\w+) ([-+0-9.eE]+|NaN)$/.exec(line);
    if (hit) out[hit[1]] = Number(hit[2]);
  }
  return out;
}

// ---- wiring ------------------------------------------------------------------------------------

function closePanels() {
  for (const [panel, button] of [["#chats", "#toggle-chats"], ["#side", "#toggle-side"]]) {
    $(panel).classList.remove("open");
    $(button).setAttribute("aria-expanded", "false");
  }
}

function togglePanel(panel, button) {
  const open = !$(panel).classList.contains("open");
  closePanels();
  $(panel).classList.toggle("open", open);
  $(button).setAttribute("aria-expanded", String(open));
}

function start() {
  loadSettingsForm();
  renderAll();
  $("#composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("#input").value.trim();
    if (!text || running) return;
    $("#input").value = "";
    send(text);
  });
  $("#input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("#composer").requestSubmit();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && running && !$("#key-dialog").open) running.controller.abort();
  });
  $("#stop").addEventListener("click", () => running && running.controller.abort());
  $("#new-chat").addEventListener("click", () => {
    if (running) return;
    current = null;
    renderAll();
    $("#input").focus();
  });
  $("#settings").addEventListener("input", saveSettingsForm);
  $("#settings").addEventListener("change", saveSettingsForm);
  $("#settings").addEventListener("submit", (e) => e.preventDefault());
  $("#reset-settings").addEventListener("click", () => {
    settings = { ...EMPTY_SETTINGS };
    store.set("settings", settings);
    loadSettingsForm();
  });
  $("#set-key").addEventListener("click", async () => {
    if (await askKey("set with the server's --api-key")) connect();
  });
  $("#toggle-chats").addEventListener("click", () => togglePanel("#chats", "#toggle-chats"));
  $("#toggle-side").addEventListener("click", () => togglePanel("#side", "#toggle-side"));
  fetch("_app/version.json").then((r) => r.json()).then((v) => {
    $("#version").textContent = `Tandem ${v.version}`;
  }).catch(() => {});
  setInterval(poll, 2000);
  document.addEventListener("visibilitychange", poll);
  if ("serviceWorker" in navigator && window.isSecureContext) {
    navigator.serviceWorker.register("sw.js").catch(() => {});
  }
  connect();
}

start();
