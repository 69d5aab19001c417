// The selected token's views, one tab each: its attention (attention.js), the next token under the
// sampler, the logit lens, the position signal, the heads and the logit attribution (Interpret,
// below). Every number comes from the server, which computes it with the library
// (minitf.sampling, minitf.inspection, minitf.interpret, the model's own positions): the page only draws. The selection (the ids on the page and one index) is shared by all tabs.
"use strict";

// Two views of the selected token made from minitf.interpret: "Heads" (every head's score on the
// text as a layers × heads grid; click heads to switch them off and see the next token without
// them) and "Attribution" (each head's, feed-forward's and bias's direct share of one next
// token's logit). Views calls heads(ask) and attribution(ask); ask sends the selection along.

const Interpret = (() => {
  const byId = (id) => document.getElementById(id);
  const off = new Set();  // the heads switched off, as "layer,head"
  let scoreName = "induction", mode = "zero", target = null, lastAsk = null;
  const SCORES = { induction: "induction", previous_token: "previous token", duplicate_token: "duplicate token" };
  const fmt = (x) => (x === null ? "–" : x.toFixed(3));
  const pct = (p) => `${(100 * p).toFixed(p < 0.01 ? 2 : 1)}%`;

  // ---- heads: scores, and the next token with the chosen heads off ----
  function heads(ask) {
    lastAsk = ask;
    const pairs = [...off].map((k) => k.split(",").map(Number));
    ask("heads", "/api/heads", { heads: pairs, mode, top: 8 }, drawHeads);
  }

  function drawHeads(d) {
    const names = Object.keys(SCORES), pick = byId("h-score"), modes = byId("h-mode");
    if (!pick.options.length) {
      for (const n of names) pick.append(el("option", { value: n }, SCORES[n]));
      pick.addEventListener("change", () => { scoreName = pick.value; heads(lastAsk); });
      modes.addEventListener("change", () => { mode = modes.value; heads(lastAsk); });
      byId("h-clear").addEventListener("click", () => { off.clear(); heads(lastAsk); });
    }
    pick.value = scoreName;
    drawGrid(byId("h-grid"), d.scores[scoreName], (l, h, v) => {
      const cell = el("button", { type: "button", className: "cell", title: `layer ${l}, head ${h}: click to switch it ${off.has(`${l},${h}`) ? "on" : "off"}` }, v.toFixed(2));
      cell.style.setProperty("--a", Math.min(1, Math.max(0, v)).toFixed(3));
      if (off.has(`${l},${h}`)) cell.classList.add("off");
      cell.addEventListener("click", () => {
        const k = `${l},${h}`;
        if (off.has(k)) off.delete(k); else off.add(k);
        heads(lastAsk);
      });
      return cell;
    });
    const n = d.heads.length;
    byId("h-summary").textContent = n === 0
      ? "Every head is on: click heads in the grid to switch them off."
      : `${n} head${n > 1 ? "s" : ""} off (${d.mode === "zero" ? "output zeroed" : "output set to its mean over this text"}): ` +
        `${d.heads.map(([l, h]) => `L${l}H${h}`).join(", ")}. Mean next-token loss over the text: ${fmt(d.loss.before)} → ${fmt(d.loss.after)}.`;
    const table = byId("h-table");
    table.replaceChildren(tr("th", ["rank", "token", "every head", n ? "heads off" : "", "change"]));
    for (const t of d.tokens) {
      table.append(tr("td", [t.rank, t.label, pct(t.before), n ? pct(t.after) : "", n ? signed(100 * (t.after - t.before), "pt") : ""]));
    }
  }

  // ---- attribution: who pushes the logit of one next token ----
  function attribution(ask) {
    lastAsk = ask;
    ask("attribution", "/api/attribution", target === null ? {} : { token: target }, drawAttribution);
  }

  function drawAttribution(d) {
    target = null;  // the next selection starts again from the token that follows
    byId("a-target").textContent = `“${d.target.label}”`;
    const choices = byId("a-choices");
    choices.replaceChildren(el("span", { className: "hint" }, "attribute instead: "));
    for (const c of d.choices) {
      const b = el("button", { type: "button" }, c.label);
      b.addEventListener("click", () => { target = c.id; attribution(lastAsk); });
      choices.append(b);
    }
    const big = Math.max(...d.heads.flat().map(Math.abs), 1e-9);
    drawGrid(byId("a-grid"), d.heads, (l, h, v) => {
      const cell = el("span", { className: "cell", title: `layer ${l}, head ${h}: ${signed(v)} to the logit` }, signed(v));
      cell.style.background = diverging(v / big);
      return cell;
    });
    const rows = [["token embedding", d.parts.embedding], ["position vectors", d.parts.positions]];
    d.ffn.forEach((v, l) => rows.push([`layer ${l}: attention output bias`, d.attn_bias[l]], [`layer ${l}: feed-forward`, v]));
    rows.push(["all heads (the grid)", d.heads.flat().reduce((a, b) => a + b, 0)], ["final norm's bias", d.parts.norm_bias]);
    const table = byId("a-table");
    table.replaceChildren(tr("th", ["part", "share of the logit"]));
    for (const [name, v] of rows) table.append(tr("td", [name, signed(v)]));
    const sum = tr("td", ["sum: the logit", `${signed(d.total)} (the model's: ${signed(d.logit)})`]);
    sum.classList.add("sum");
    table.append(sum);
    byId("a-note").textContent = d.softcap ? `This model caps its logits (logit_softcap=${d.softcap}): the logit split here is the one before the cap.` : "";
  }

  function drawGrid(grid, values, cell) {
    const H = values[0].length;
    grid.style.gridTemplateColumns = `auto repeat(${H}, minmax(48px, 1fr))`;
    grid.replaceChildren(el("span"), ...values[0].map((_, h) => el("span", { className: "label" }, `head ${h}`)));
    values.forEach((row, l) => {
      grid.append(el("span", { className: "label" }, `layer ${l}`));
      row.forEach((v, h) => grid.append(cell(l, h, v)));
    });
  }

  function signed(x, unit = "") {
    return `${x >= 0 ? "+" : "−"}${Math.abs(x).toFixed(3)}${unit}`;
  }

  function diverging(x) {  // -1: blue, 0: white, 1: red
    const a = Math.min(1, Math.abs(x));
    const rgb = x >= 0 ? [255 - 40 * a, 255 - 200 * a, 255 - 210 * a] : [255 - 220 * a, 255 - 150 * a, 255 - 20 * a];
    return `rgb(${rgb.map(Math.round).join(",")})`;
  }

  function tr(cell, values) {
    const row = el("tr");
    for (const v of values) row.append(el(cell, {}, String(v)));
    return row;
  }

  return { heads, attribution };
})();

const Views = (() => {
  const sel = { ids: [], index: 0 };
  let active = "attention";
  const byId = (id) => document.getElementById(id);
  const RULES = ["temperature", "top_k", "top_p", "repetition_penalty"];
  const OFF = { top_k: 0, top_p: 1 };  // the slider value that turns a rule off (sent as null)
  const latest = {};  // per view, the number of its newest request: an older answer is dropped

  function select(ids, index) {
    Object.assign(sel, { ids, index });
    byId("token").hidden = false;
    document.querySelectorAll("#tokens .tok").forEach((t) => t.classList.toggle("query", +t.dataset.index === index));
    show(active);
  }

  function show(name) {
    active = name;
    document.querySelectorAll(".tabs button").forEach((b) => b.setAttribute("aria-selected", b.dataset.view === name));
    document.querySelectorAll("#token .view").forEach((v) => { v.hidden = v.id !== name; });
    if (name === "attention") Attention.open(sel.ids, sel.index);
    else VIEWS[name]();
  }

  // one request of a view; the answer is drawn only if no newer request of that view was made
  async function ask(view, url, body, draw) {
    const n = latest[view] = (latest[view] || 0) + 1;
    byId("status").textContent = "inspecting…";
    try {
      const answer = await getJSON(url, { ids: sel.ids, position: sel.index, ...body });
      if (n !== latest[view]) return;
      showError("");
      byId("status").textContent = "";
      labelSelection(answer);
      draw(answer);
    } catch (e) {
      if (n !== latest[view]) return;
      showError(e.message);
      byId("status").textContent = "";
    }
  }

  function labelSelection(answer) {
    document.querySelectorAll(".sel-label").forEach((s) => { s.textContent = `“${answer.token.label}”`; });
    const note = answer.offset ? `(position ${sel.index}; the model reads tokens ${answer.offset}…${sel.index}, its window)` : "";
    document.querySelectorAll(".sel-window").forEach((s) => { s.textContent = note; });
  }

  // ---- next token: the distribution the sampler draws from, under live settings ----
  let rulesSet = false;

  function nextToken() {
    if (!rulesSet) {  // first time: the settings the text on the page was generated with
      for (const name of RULES) {
        const given = byId(name) ? byId(name).value.trim() : "", input = byId(`n-${name}`);  // no field: 1, off
        if (name === "top_k") input.max = Math.max(100, Number(given));
        input.value = given === "" || (name === "top_k" && Number(given) === 0) ? OFF[name] ?? 1 : given;
        showRule(name);
        byId(`n-${name}`).addEventListener("input", () => { showRule(name); nextSoon(); });
      }
      rulesSet = true;
    }
    ask("next", "/api/distribution", { ...rules(), top: 20 }, drawNext);
  }

  let timer = null;
  function nextSoon() {  // while a slider moves: one request per pause, not one per pixel
    clearTimeout(timer);
    timer = setTimeout(nextToken, 80);
  }

  function rules() {
    const body = {};
    for (const name of RULES) {
      const v = Number(byId(`n-${name}`).value);
      body[name] = name in OFF && v === OFF[name] ? null : v;
    }
    return body;
  }

  function showRule(name) {
    const v = Number(byId(`n-${name}`).value);
    byId(`n-${name}-v`).textContent = name in OFF && v === OFF[name] ? "off" : name === "temperature" && v === 0 ? "0 (greedy)" : String(v);
  }

  function drawNext(d) {
    const s = d.settings, e = d.entropy, pct = (x) => `${(100 * x).toFixed(x < 0.01 ? 2 : 1)}%`;
    byId("n-summary").textContent = `${d.kept.toLocaleString()} of ${d.vocab.toLocaleString()} tokens can be drawn ` +
      `(they hold ${pct(d.kept_mass)} of the model's probability). Spread (entropy): the model ${e.model.toFixed(2)} bits, ` +
      `after temperature ${e.tempered.toFixed(2)} bits, after the cuts ${e.sampled.toFixed(2)} bits.`;
    const top = Math.max(...d.tokens.map((t) => Math.max(t.model, t.prob)), 1e-9);
    const table = byId("n-table");
    table.replaceChildren(row("th", ["#", "token", "logit", "model", "sampler", ""]));
    for (const t of d.tokens) {
      const bars = el("td", { className: "barcell" });
      bars.append(bar("model", t.model / top), bar("drawn", t.prob / top));
      const follows = d.next && t.id === d.next.id, label = follows ? `${t.label}  ← follows on the page` : t.label;
      const tr = row("td", [t.rank, label, t.logit.toFixed(2), pct(t.model), t.kept ? pct(t.prob) : cutBy(t, s)]);
      tr.append(bars);
      if (!t.kept) tr.classList.add("cut");
      if (follows) tr.classList.add("follows");
      table.append(tr);
    }
  }

  // why a token cannot be drawn: the sampler's own rules decided it (prob 0); this only names one
  function cutBy(t, s) {
    if (s.temperature === 0) return "cut: greedy";
    if (s.top_k && t.rank > s.top_k) return "cut: top-k";
    return "cut: top-p";
  }

  function bar(kind, fraction) {
    const b = el("span", { className: `bar ${kind}` });
    b.style.width = `${(100 * fraction).toFixed(1)}%`;
    return b;
  }

  // ---- logit lens: the prediction after every block ----
  function lens() {
    ask("lens", "/api/lens", { top: 5 }, drawLens);
  }

  function drawLens(d) {
    const table = byId("lens-table"), last = d.layers.length - 1;
    const head = ["layer", "1st", "2nd", "3rd", "4th", "5th"];
    if (d.next) head.push(`“${d.next.label}” (follows)`);
    table.replaceChildren(row("th", head));
    d.layers.forEach((layer, i) => {
      const tr = el("tr");
      tr.append(el("th", {}, i === last ? `${layer.name}: the output` : layer.name));
      for (const t of layer.top) {
        const td = el("td", { className: "tok-cell", title: `p = ${t.prob.toFixed(4)}` });
        td.append(el("span", { className: "lbl" }, t.label), el("span", { className: "p" }, t.prob.toFixed(3)));
        td.style.setProperty("--a", Math.min(1, t.prob / Math.max(layer.top[0].prob, 1e-9)).toFixed(3));
        if (d.next && t.id === d.next.id) td.classList.add("follows");
        tr.append(td);
      }
      if (d.next) tr.append(el("td", { className: "rank" }, `rank ${layer.next.rank}, p = ${small(layer.next.prob)}`));
      if (i === last) tr.classList.add("output");
      table.append(tr);
    });
  }

  // ---- positions: the learned or sinusoidal table the model adds, or rotary's angles ----
  function positions() {
    ask("positions", "/api/positions", {}, drawPositions);
  }

  function drawPositions(d) {
    const rope = d.kind === "rope", values = rope ? d.angles : d.table;
    const R = values.length, C = values[0].length, n = d.n;
    if (rope) {
      byId("p-summary").textContent = `Rotary positions add nothing to the embeddings: in every layer and head, each of the ` +
        `${C} pairs of query and key dimensions is turned by an angle that grows with the position, so q·k depends on how far ` +
        `apart two tokens are. “${d.token.label}” is at position ${d.position}.`;
      byId("p-caption").textContent = `rows: positions 0…${R - 1} (the window on the page: 0…${n - 1}, above the dashed line; ` +
        `outlined: position ${d.position}); columns: dimension pairs 0…${C - 1}; colour: the angle, position × ${d.base}^(−2i/${d.head_dim}), ` +
        "around the colour wheel once per full turn: the first pairs turn fast, the last ones slowly";
    } else {
      byId("p-summary").textContent = `The model adds a ${d.kind} vector to each token's embedding, one per position. ` +
        `“${d.token.label}” is at position ${d.position}: its position vector has norm ${d.norms.position.toFixed(3)}, ` +
        `its token embedding ${d.norms.token.toFixed(3)}.`;
      byId("p-caption").textContent = `rows: positions 0…${R - 1} (the window on the page: 0…${n - 1}, above the dashed line; ` +
        `outlined: position ${d.position}); columns: dimensions 0…${C - 1}; red positive, blue negative` +
        (d.kind === "learned" ? " (trained values)" : ": sin and cos of position / 10000^(2i/d)");
    }
    drawMap(values, n, d.position, rope);
    drawRow(values[d.position], rope, d);
  }

  function drawMap(values, n, position, rope) {
    const R = values.length, C = values[0].length, c = byId("p-map"), g = c.getContext("2d");
    // the colour scale: the 99th percentile of |value| (rotary: unused), so one outlier does not wash out the rest
    const sizes = values.flat().map(Math.abs).sort((a, b) => a - b), big = Math.max(sizes[Math.floor(0.99 * (sizes.length - 1))], 1e-9);
    const image = g.createImageData(C, R);
    values.forEach((r, i) => r.forEach((v, j) => {
      image.data.set([...(rope ? wheel(v) : diverging(v / big)), 255], 4 * (i * C + j));
    }));
    const cells = document.createElement("canvas");
    Object.assign(cells, { width: C, height: R });
    cells.getContext("2d").putImageData(image, 0, 0);
    const left = 40, top = 4, W = c.width - left - 4, H = c.height - top - 18;
    g.clearRect(0, 0, c.width, c.height);
    g.imageSmoothingEnabled = false;
    g.drawImage(cells, left, top, W, H);
    const rowH = H / R;
    g.strokeStyle = "#111";
    g.lineWidth = 2;
    g.strokeRect(left - 1, top + position * rowH - 1, W + 2, Math.max(rowH, 1) + 2);
    if (n < R) {  // where the window on the page ends: the rows below it are the rest of the table
      g.setLineDash([4, 3]);
      g.lineWidth = 1;
      g.beginPath();
      g.moveTo(left - 6, top + n * rowH);
      g.lineTo(left + W, top + n * rowH);
      g.stroke();
      g.setLineDash([]);
    }
    g.fillStyle = "#57606a";
    g.font = "10px system-ui, sans-serif";
    g.textAlign = "right";
    g.textBaseline = "middle";
    for (const p of [0, position, R - 1]) g.fillText(String(p), left - 4, top + (p + 0.5) * rowH);
    g.textAlign = "left";
    g.textBaseline = "alphabetic";
    g.fillText("0", left, c.height - 4);
    g.textAlign = "right";
    g.fillText(`${rope ? "pair" : "dimension"} ${C - 1}`, left + W, c.height - 4);
  }

  function drawRow(v, rope, d) {
    const shown = v.slice(0, 8).map((x) => (rope ? `${((x * 180) / Math.PI % 360).toFixed(1)}°` : x.toFixed(3)));
    const what = rope ? `its angles (mod 360°), pairs 0…${Math.min(8, v.length) - 1}` : `its first ${shown.length} values`;
    byId("p-row").replaceChildren(el("p", { className: "hint" },
      `Position ${d.position}, ${what}: [${shown.join(", ")}${v.length > 8 ? ", …" : ""}]`));
  }

  function small(p) {  // a probability, readable however small
    return p >= 0.001 ? p.toFixed(3) : p > 0 ? p.toExponential(1) : "< 1e-6";
  }

  function diverging(x) {  // -1: blue, 0: white, 1: red
    const a = Math.min(1, Math.abs(x));
    return x >= 0 ? [255 - 40 * a, 255 - 200 * a, 255 - 210 * a] : [255 - 220 * a, 255 - 150 * a, 255 - 20 * a];
  }

  function wheel(angle) {  // an angle (radians) to a hue: a full turn goes once around the colours
    const h = ((angle / (2 * Math.PI)) % 1) * 6, x = 1 - Math.abs((h % 2) - 1);
    const [r, g, b] = [[1, x, 0], [x, 1, 0], [0, 1, x], [0, x, 1], [x, 0, 1], [1, 0, x]][Math.floor(h) % 6];
    return [r, g, b].map((u) => Math.round(90 + 150 * u));
  }

  function row(cell, values) {
    const tr = el("tr");
    for (const v of values) tr.append(el(cell, {}, String(v)));
    return tr;
  }

  const VIEWS = { next: nextToken, lens, positions, heads: () => Interpret.heads(ask), attribution: () => Interpret.attribution(ask) };
  document.querySelectorAll(".tabs button").forEach((b) => b.addEventListener("click", () => show(b.dataset.view)));
  return { select, show };
})();
