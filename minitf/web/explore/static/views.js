// The selected token's views, one tab each: its attention (attention.js), the next token under the
// sampler, the logit lens and the position signal. Every number comes from the server, which
// computes it with the library (minitf.sampling, minitf.inspection, the model's own positions):
// the page only draws. The selection (the ids on the page and one index) is shared by all tabs.
"use strict";

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

  const VIEWS = { next: nextToken, lens, positions };
  document.querySelectorAll(".tabs button").forEach((b) => b.addEventListener("click", () => show(b.dataset.view)));
  return { select, show };
})();
