// One token's attention: a layer × head grid of its weights, one head's full T × T matrix, and
// that head's steps for the query (q·k, ÷√d, mask, softmax, weighted sum of the values). Every
// number comes from /api/attention, which runs minitf.inspect: the model's own numbers. It is the
// first of the selected token's views (views.js holds the tabs and the others).
"use strict";

const Attention = (() => {
  const at = { ids: [], query: 0, layer: 0, head: 0 };
  const byId = (id) => document.getElementById(id);
  const fmt = (x) => (x === null ? "−∞" : x.toFixed(3));

  async function open(ids, query, layer = at.layer, head = at.head) {
    Object.assign(at, { ids, query, layer, head });
    byId("status").textContent = "inspecting…";
    let view;
    try {
      view = await getJSON("/api/attention", { ids, query, layer, head });
    } catch (e) {
      showError(e.message);
      byId("status").textContent = "";
      return;
    }
    showError("");
    byId("status").textContent = "";
    render(view);
  }

  function render(view) {
    const q = view.query, tokens = view.tokens;
    byId("query-label").textContent = `“${tokens[q]}”`;
    byId("window").textContent = view.offset ? `(tokens ${view.offset}…${view.offset + tokens.length - 1}: the model's window)` : "";
    drawGrid(view);
    byId("head-title").textContent = `Layer ${view.layer}, head ${view.head}: what “${tokens[q]}” attends to ` +
    "(colour scaled to the largest weight; hover a token for its weight)";
    drawContext(view);
    drawHeatmap(view);
    drawSteps(view);
  }

  function drawGrid(view) {
    const grid = byId("grid"), H = view.grid[0].length;
    grid.style.gridTemplateColumns = `auto repeat(${H}, minmax(60px, 1fr))`;
    grid.replaceChildren(el("span"), ...view.grid[0].map((_, h) => el("span", { className: "label" }, `head ${h}`)));
    view.grid.forEach((heads, l) => {
      grid.append(el("span", { className: "label" }, `layer ${l}`));
      heads.forEach((row, h) => {
        const c = el("canvas", { width: Math.max(row.length, 1), height: 1, title: `layer ${l}, head ${h}` });
        c.className = l === view.layer && h === view.head ? "chosen" : "";
        const g = c.getContext("2d"), top = Math.max(...row);
        row.forEach((w, j) => { g.fillStyle = shade(w / top); g.fillRect(j, 0, 1, 1); });
        c.addEventListener("click", () => open(at.ids, at.query, l, h));
        grid.append(c);
      });
    });
  }

  function drawContext(view) {
    const w = view.steps.weights, box = byId("context"), top = Math.max(...w);
    box.replaceChildren(...view.tokens.map((t, j) => {
      const s = el("span", { className: "tok", title: j <= view.query ? `weight ${w[j].toFixed(3)}` : "masked: a later token" }, t);
      s.style.setProperty("--a", j <= view.query ? (w[j] / top).toFixed(3) : 0);
      if (j === view.query) s.classList.add("query");
      if (j > view.query) s.classList.add("later");
      s.addEventListener("click", () => Views.select(at.ids, view.offset + j));
      return s;
    }));
  }

  function drawHeatmap(view) {
    const c = byId("heatmap"), g = c.getContext("2d"), T = view.tokens.length;
    const labels = T <= 40, margin = labels ? 70 : 4, cell = (c.width - margin) / T;
    g.clearRect(0, 0, c.width, c.height);
    view.heatmap.forEach((row, i) => row.forEach((w, j) => {
      g.fillStyle = w === null ? "#d0d7de" : shade(w);
      g.fillRect(margin + j * cell, margin + i * cell, Math.ceil(cell), Math.ceil(cell));
    }));
    g.strokeStyle = "#111";
    g.lineWidth = 2;
    g.strokeRect(margin, margin + view.query * cell, cell * T, cell);
    if (!labels) return;
    g.fillStyle = "#1f2328";
    g.font = `${Math.min(11, cell)}px monospace`;
    g.textBaseline = "middle";
    view.tokens.forEach((t, i) => {
      g.textAlign = "right";
      g.fillText(t.slice(0, 8), margin - 3, margin + (i + 0.5) * cell);
      g.save();
      g.translate(margin + (i + 0.5) * cell, margin - 3);
      g.rotate(-Math.PI / 2);
      g.textAlign = "left";
      g.fillText(t.slice(0, 8), 0, 0);
      g.restore();
    });
  }

  function drawSteps(view) {
    const s = view.steps, q = view.query, dims = Math.min(3, s.d), more = s.d > dims ? ", …" : "";
    const vec = (v) => `[${v.slice(0, dims).map((x) => x.toFixed(2)).join(", ")}${more}]`;
    const table = el("table");
    table.append(row("th", ["key", "q·k", `÷√${s.d}`, "masked", "softmax", `v (first ${dims} of ${s.d})`]));
    view.tokens.forEach((t, j) => {
      if (j > q + 1) return;  // after the query every key is masked: one row says so for all
      const later = j > q, tr = later
        ? row("td", [`${view.tokens.length - q - 1} later`, "", "", "−∞", "0", "hidden by the causal mask"])
        : row("td", [t, fmt(s.scores[j]), fmt(s.scaled[j]), fmt(s.masked[j]), fmt(s.weights[j]), vec(s.v[j])]);
      if (later) tr.className = "masked";
      if (j === q) tr.className = "query";
      table.append(tr);
    });
    const sum = row("td", ["Σ softmax · v", "", "", "", s.weights.slice(0, q + 1).reduce((a, b) => a + b, 0).toFixed(3), vec(s.out)]);
    sum.className = "sum";
    table.append(sum);
    byId("steps").replaceChildren(
      el("p", { className: "hint" }, `query q = ${vec(s.q)}; scores q·k, divided by √d = ${Math.sqrt(s.d).toFixed(3)}, ` +
        "later keys masked to −∞, softmax (the weights sum to 1), then the weighted sum of the values."),
      table);
  }

  function row(cell, values) {
    const tr = el("tr");
    for (const v of values) tr.append(el(cell, {}, String(v)));
    return tr;
  }

  function shade(w) {  // 0: white, 1: the attention colour
    const a = Math.max(0, Math.min(1, w));
    return `rgb(${Math.round(255 - 21 * a)}, ${Math.round(255 - 167 * a)}, ${Math.round(255 - 243 * a)})`;
  }

  return { open };
})();
