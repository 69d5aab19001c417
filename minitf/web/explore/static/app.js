// The page: the run panel, generation as it streams, and the token tooltips. Clicking a token
// selects it for views.js (attention, next token, logit lens, positions). No framework and no
// build step: plain DOM calls, read top-down.
"use strict";

const $ = (id) => document.getElementById(id);
const SETTINGS = ["temperature", "top_k", "top_p", "max_new_tokens", "seed"];
// every token shown so far (prompt then generated), the running request; a chat run's conversation
const state = { ids: [], stream: null, chat: false, history: [], answer: "" };
const FEW_POINTS = 20;  // a loss series this short gets a dot per evaluation (as figures.py marks it)

function el(tag, props = {}, text = "") {
  const e = Object.assign(document.createElement(tag), props);
  if (text) e.textContent = text;
  return e;
}

async function getJSON(url, body) {
  const opts = body ? { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) } : {};
  const res = await fetch(url, opts);
  const data = await res.json();
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}

function showError(message) {
  $("error").textContent = message || "";
  $("error").hidden = !message;
}

// ---- the run: config summary, checkpoint, loss curve ----
async function loadRun() {
  const run = await getJSON("/api/run");
  const c = run.config, m = c.model;
  $("run-name").textContent = run.run;
  const rows = [
    ["run", run.run], ["checkpoint", run.downloaded ? run.checkpoint : `${run.checkpoint}, step ${run.step ?? "?"}`],
    ["parameters", run.params.toLocaleString()],
    ["model", `${m.n_layer} layers × ${m.n_head} heads, width ${m.n_embd}`],
    ["context", `${m.block_size} tokens, vocab ${m.vocab_size}`],
    ["blocks", `${m.positions} positions, ${m.norm}, ${m.ffn}, ${m.attention} attention`],
    ["data", c.data.source], ["training", `${run.budget}, lr ${c.train.lr}, batch ${c.train.batch_size}`],
  ];
  if (run.downloaded) rows.splice(-2, 2);  // not trained here: the defaults' data and budget are not its own
  for (const [k, v] of rows) $("run-info").append(el("dt", {}, k), el("dd", {}, String(v)));
  $("config").textContent = JSON.stringify(c, null, 2);
  $("prompt").value = c.sample.prompt;
  $("prompt").maxLength = run.limits.prompt_chars;
  $("max_new_tokens").max = run.limits.max_new_tokens;
  for (const name of SETTINGS) $(name).value = c.sample[name] ?? "";
  if (run.chat) startChat(run.limits.block_size);
  const metrics = await getJSON("/api/metrics"), points = metrics.points;
  drawCurves($("loss"), points, [["train_loss", "#2563eb"], ["val_loss", "#ea580c"]]);
  // a chat run's held-out exact answers, and an RL run's mean reward of its sampled answers
  const answers = [["reward_mean", "#16a34a"], ["val_exact", "#7c3aed"]].filter(([k]) => points.some((p) => k in p));
  if (answers.length) {
    $("answers").hidden = $("answers-title").hidden = false;
    drawCurves($("answers"), points, answers);
  }
  if (metrics.watched.length) showWatched(metrics.watched);
}

// an RL run: a few fixed prompts' groups at each evaluation, each answer shaded by its advantage
function showWatched(watched) {
  $("watched").hidden = $("watched-title").hidden = false;
  const select = $("watched-step");
  watched.forEach((w, i) => select.append(el("option", { value: String(i) }, `step ${w.step}`)));
  select.value = String(watched.length - 1);
  const draw = () => {
    const boxes = watched[Number(select.value)].groups.map((g) => {
      const box = el("div", { className: "group" });
      box.append(el("p", { className: "prompt" }, g.expected === null ? g.prompt : `${g.prompt} (expected: ${g.expected})`));
      for (const a of g.answers) {
        const row = el("p", { className: "answer" }), shade = Math.min(1, Math.abs(a.advantage)) * 0.45;
        row.style.background = a.advantage > 0 ? `rgba(22,163,74,${shade})` : `rgba(220,38,38,${shade})`;
        row.title = `tokens: ${a.tokens.join(" | ")}`;
        row.append(el("b", {}, `${a.advantage >= 0 ? "+" : ""}${a.advantage.toFixed(2)} `), el("span", {}, a.text || "(empty)"),
                   el("span", { className: "hint" }, `  reward ${a.reward}`));
        box.append(row);
      }
      return box;
    });
    $("watched-groups").replaceChildren(...boxes);
  };
  select.addEventListener("change", draw);
  draw();
}

function drawCurves(svg, points, series) {
  // T: a strip above the plot for the legend, which can then never sit on a curve
  const W = 320, H = 180, L = 34, B = 22, T = 22;
  const all = points.flatMap((p) => series.map(([k]) => p[k]).filter((v) => v !== undefined));
  if (!all.length) { svg.append(svgEl("text", { x: 10, y: 20 }, "no evaluations in metrics.jsonl yet")); return; }
  const steps = points.map((p) => p.step), s0 = Math.min(...steps), s1 = Math.max(...steps, s0 + 1);
  const last = Math.max(...steps);
  const lo = Math.min(...all), hi = Math.max(...all, lo + 1e-6);
  const x = (s) => L + (W - L - 8) * (s - s0) / (s1 - s0), y = (v) => T + (H - B - T) * (hi - v) / (hi - lo);
  svg.append(svgEl("path", { d: `M${L} ${T}V${H - B}H${W - 8}`, stroke: "#adb5bd", fill: "none" }));
  for (const v of [hi, lo]) svg.append(svgEl("text", { x: 2, y: y(v) + 3 }, v.toFixed(2)));
  svg.append(svgEl("text", { x: L, y: H - 6 }, `step ${s0}`));
  if (last > s0) svg.append(svgEl("text", { x: W - 60, y: H - 6 }, `step ${last}`));
  series.forEach(([key, colour], i) => {
    const have = points.filter((p) => p[key] !== undefined);
    svg.append(svgEl("polyline", {
      points: have.map((p) => `${x(p.step)},${y(p[key])}`).join(" "), stroke: colour, fill: "none", "stroke-width": 1.5,
    }));
    // a few evaluations are marked one by one: a single one draws no line at all
    if (have.length <= FEW_POINTS) for (const p of have) svg.append(svgEl("circle", { cx: x(p.step), cy: y(p[key]), r: 2.5, fill: colour }));
    const lx = L + 6 + 90 * i;  // side by side in the strip: a stroke of the curve's colour, then its name
    svg.append(svgEl("line", { x1: lx, y1: 9, x2: lx + 14, y2: 9, stroke: colour, "stroke-width": 2, class: "legend" }));
    svg.append(svgEl("text", { x: lx + 18, y: 13, style: `fill:${colour}`, class: "legend" }, key.replace("_", " ")));
  });
}

function svgEl(tag, attrs, text = "") {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  e.textContent = text;
  return e;
}

// ---- generation, streamed as NDJSON: one event per line ----
// ---- a chat run: the page keeps the conversation, the server renders it with the run's template ----
function startChat(block) {
  state.chat = true;
  // a turn's answer is short beside the context: half of it leaves the other half to the conversation
  $("max_new_tokens").value = Math.min(Number($("max_new_tokens").value) || block, Math.floor(block / 2));
  $("chat").hidden = false; $("reset").hidden = false;
  $("generate-title").textContent = "Chat";
  $("go").textContent = "Send";
  $("prompt").value = "";
  $("prompt").placeholder = "Your message (Ctrl+Enter sends)";
}

function conversation() {
  const system = $("system").value.trim();
  return [...(system ? [{ role: "system", content: system }] : []), ...state.history,
          { role: "user", content: $("prompt").value }];
}

function say(role, text) {
  $("transcript").append(el("li", { className: role }, text));
  state.history.push({ role, content: text });
}

function resetChat() {
  state.history = [];
  $("transcript").replaceChildren();
  $("tokens").replaceChildren();
  state.ids = [];
}

function settings() {
  const body = state.chat ? { messages: conversation() } : { prompt: $("prompt").value };
  for (const name of SETTINGS) {
    const v = $(name).value.trim();
    body[name] = v === "" ? null : Number(v);
  }
  if (body.top_k === 0) body.top_k = null;
  return body;
}

async function generate() {
  if (state.stream) state.stream.abort();
  const stream = state.stream = new AbortController();
  showError("");
  $("tokens").replaceChildren();
  state.ids = []; state.answer = "";
  $("go").disabled = true; $("stop").disabled = false; $("status").textContent = "generating…";
  try {
    const res = await fetch("/api/generate", { method: "POST", headers: { "Content-Type": "application/json" },
                                               body: JSON.stringify(settings()), signal: stream.signal });
    if (!res.ok) throw new Error((await res.json()).error || res.statusText);
    await readLines(res.body, handleEvent);
  } catch (e) {
    if (e.name !== "AbortError") showError(e.message);
    $("status").textContent = e.name === "AbortError" ? "stopped" : "";
  } finally {
    if (state.stream === stream) { state.stream = null; $("go").disabled = false; $("stop").disabled = true; }
  }
}

async function readLines(body, onLine) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    const lines = buffer.split("\n");
    buffer = lines.pop();
    for (const line of lines) if (line) onLine(JSON.parse(line));
  }
}

function handleEvent(event) {
  if (event.prompt) event.prompt.forEach((t) => addToken(t, "prompt"));
  if (event.token) addToken(event.token, "gen");
  if (event.error) showError(event.error);
  if (event.done) {
    const n = state.ids.length - document.querySelectorAll("#tokens .prompt").length;
    const ended = state.chat ? "the model ended its turn" : "the model ended the document";
    const why = { eot: ended, context: "the model's context is full (/reset or shorten)" }[event.done];
    $("status").textContent = `${n} tokens, ${why || "max new tokens reached"}`;
    if (state.chat) { say("user", $("prompt").value); say("assistant", state.answer); $("prompt").value = ""; }
  }
}

function addToken(t, kind) {
  const index = state.ids.length;
  state.ids.push(t.id);
  // the text itself, so the output reads as text; a token holding half a character shows its label
  const span = el("span", { className: `tok ${kind}` }, readable(t.text) || t.label);
  span.dataset.index = index;
  if (kind === "gen") {
    state.answer += t.text;
    span.style.setProperty("--a", (0.08 + 0.62 * t.prob).toFixed(3));
    span.addEventListener("mouseenter", () => showTip(span, t));
    span.addEventListener("mouseleave", () => { $("tip").hidden = true; });
  }
  span.addEventListener("click", () => Views.select(state.ids.slice(), index));
  $("tokens").append(span);
}

// newlines as ↵ and one line break, so a run of blank lines stays one clickable line
function readable(text) {
  return text.includes("\n") ? text.replace(/\n/g, "\u21b5") + "\n" : text;
}

function showTip(span, t) {
  const tip = $("tip"), table = el("table");
  table.append(caption(`${t.label} · p = ${t.prob.toFixed(3)}`));
  for (const [label, p] of t.top) {
    const row = el("tr");
    const bar = el("span", { className: "bar" });
    bar.style.width = `${Math.round(60 * p)}px`;
    row.append(el("td", {}, label), el("td", {}, p.toFixed(3)), el("td"));
    row.lastChild.append(bar);
    table.append(row);
  }
  tip.replaceChildren(table);
  const r = span.getBoundingClientRect();
  tip.style.left = `${Math.min(r.left, innerWidth - 260)}px`;
  tip.style.top = `${r.bottom + 6}px`;
  tip.hidden = false;
}

function caption(text) {
  const c = el("caption", {}, text);
  c.style.textAlign = "left";
  return c;
}

$("go").addEventListener("click", generate);
$("stop").addEventListener("click", () => state.stream && state.stream.abort());
$("reset").addEventListener("click", resetChat);
$("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) generate(); });
loadRun().catch((e) => showError(`could not load the run: ${e.message}`));
