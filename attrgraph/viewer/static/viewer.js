// attrgraph viewer: plain JavaScript and SVG, no libraries and no network beyond the server
// that served this page (or none: `attrgraph.show` inlines the data as window.ATTRGRAPH_DATA).
//
// Layout: rows bottom to top (embeddings, layers, logits), columns left to right (positions);
// nodes sharing a (row, column) cell are spread horizontally and a column is as wide as its
// fullest cell. Edges are blue when positive, red when negative; width and opacity grow with
// sqrt(|weight| / max |weight|). Hover a node to highlight its edges and see it in the side
// panel; click to keep it there; shift-click (or "pin") pins it; pinned nodes can be shown alone
// and grouped into supernodes, which "save" posts to the server (the whole list of the graph).
"use strict";
(function () {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const EMBEDDED = window.ATTRGRAPH_DATA || null;
  const PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6",
    "#9a6324", "#469990", "#808000"];
  const ROW_H = [48, 140], GAP = 14, MIN_COL = 56, MARGIN_L = 58, MARGIN_T = 24, MARGIN_B = 70, N_EDGES_LISTED = 15;
  const HINT = "Hover a node to see it; click to keep it here. Shift-click pins a node.";

  const state = {
    data: null, selected: null, hovered: null, pinned: new Set(), supernodes: [], zoom: 1,
    incoming: [], outgoing: [], nodeEls: [], edgeEls: [], xy: [], cols: null, size: [0, 0],
    keyIndex: new Map(), highlighted: [],
  };

  const $ = (id) => document.getElementById(id);

  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const c of children.flat()) {
      if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  function s(tag, attrs) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }

  function fmt(x, digits = 3) {
    if (x === null || x === undefined) return "–";
    const a = Math.abs(x);
    if (a !== 0 && (a < 1e-3 || a >= 1e4)) return x.toExponential(2);
    return x.toFixed(digits);
  }

  const keyStr = (k) => JSON.stringify(k);

  function note(text, isError) {
    $("notes").append(h("p", { class: isError ? "error" : "" }, text));
  }

  function say(text, isError) {
    const el = $("save-status");
    el.textContent = text;
    el.className = isError ? "error" : "ok";
  }

  async function getJSON(url, options) {
    const r = await fetch(url, options);
    let body = null;
    try {
      body = await r.json();
    } catch (e) {
      body = null;
    }
    if (!r.ok) throw new Error((body && body.error) || `${url}: HTTP ${r.status}`);
    return body;
  }

  // ------------------------------------------------------------------ loading
  async function init() {
    wireControls();
    const pick = $("pick");
    if (EMBEDDED) {
      pick.append(h("option", { value: "graph:" + EMBEDDED.name }, EMBEDDED.name));
      pick.disabled = true;
      render(EMBEDDED);
      return;
    }
    let index;
    try {
      index = await getJSON("api/graphs");
    } catch (e) {
      note(e.message, true);
      return;
    }
    document.title = `${index.file} – attrgraph viewer`;
    const option = (kind) => (n) => h("option", { value: `${kind}:${n}` }, n);
    if (index.graphs.length) pick.append(h("optgroup", { label: "graphs" }, index.graphs.map(option("graph"))));
    if (index.circuits.length) {
      pick.append(h("optgroup", { label: "circuits" }, index.circuits.map(option("circuit"))));
    }
    const wanted = decodeURIComponent(location.hash.slice(1));
    if (wanted && [...pick.options].some((o) => o.value === wanted)) pick.value = wanted;
    pick.addEventListener("change", () => load(pick.value));
    await load(pick.value);
  }

  async function load(value) {
    const i = value.indexOf(":");
    const kind = value.slice(0, i), name = value.slice(i + 1);
    history.replaceState(null, "", "#" + encodeURIComponent(value));
    try {
      render(await getJSON(`api/${kind}?name=${encodeURIComponent(name)}`));
    } catch (e) {
      $("notes").replaceChildren();
      note(e.message, true);
    }
  }

  function render(data) {
    Object.assign(state, { data, selected: null, hovered: null, pinned: new Set(), keyIndex: new Map() });
    data.nodes.forEach((n) => {
      const k = keyStr(n.key);
      if (!state.keyIndex.has(k)) state.keyIndex.set(k, []);
      state.keyIndex.get(k).push(n.id);
    });
    state.supernodes = (data.supernodes || []).map((sn, i) => ({
      name: sn.name, members: sn.members, color: PALETTE[i % PALETTE.length],
    }));
    $("notes").replaceChildren();
    (data.notes || []).forEach((t) => note(t));
    if (data.kind === "graph" && !Object.keys(data.dashboards).length) note(data.dashboards_note);
    $("summary").textContent = summary(data);
    $("group-controls").style.display = data.kind === "graph" ? "" : "none";
    $("save").style.display = data.editable ? "" : "none";
    $("save-status").textContent = "";
    layout(data);
    draw(data);
    showDetails(null);
    renderPins();
    renderSupernodes();
  }

  function summary(d) {
    if (d.kind === "circuit") return `circuit ${d.name}: ${d.method}, ${d.n_edges} edges, ${d.nodes.length} nodes`;
    const parts = [`${d.nodes.length} nodes, ${d.edges.length} edges`];
    if (d.stored.n_nodes !== d.nodes.length || d.stored.n_edges !== d.edges.length) {
      parts[0] += ` (stored: ${d.stored.n_nodes} nodes, ${d.stored.n_edges} edges)`;
    }
    parts.push(`replacement ${fmt(d.scores.replacement)}`, `completeness ${fmt(d.scores.completeness)}`);
    parts.push("logits " + d.logits.map((l) => `${JSON.stringify(l.token)} ${fmt(l.prob)}`).join(" "));
    const hi = d.hierarchical;
    if (hi) {
      parts.push(`hierarchical (tau ${fmt(hi.tau, 4)}): root ${fmt(hi.root_value, 4)} = leaves + bias ` +
        `${fmt(hi.bias_attribution, 4)} + detached ${fmt(hi.detached_attribution, 4)}`);
    }
    return parts.join(" · ");
  }

  // ------------------------------------------------------------------ layout and drawing
  function layout(data) {
    const nRows = data.row_labels.length, nCols = Math.max(data.col_labels.length, 1);
    const cells = new Map();
    for (const n of data.nodes) {
      const k = `${n.row},${n.col}`;
      if (!cells.has(k)) cells.set(k, []);
      cells.get(k).push(n.id);
    }
    const width = new Array(nCols).fill(MIN_COL);
    for (const [k, ids] of cells) {
      const col = Number(k.split(",")[1]);
      width[col] = Math.max(width[col], ids.length * GAP + 16);
    }
    const x0 = [MARGIN_L];
    for (let c = 0; c < nCols; c++) x0.push(x0[c] + width[c]);
    state.cols = { x0, width };
    // fit the canvas at first, within reason: the width by zooming out, the height by taller rows
    const canvas = $("canvas"), W = x0[nCols] + 12;
    state.zoom = canvas.clientWidth > 4 ? Math.min(1, Math.max(0.5, (canvas.clientWidth - 4) / W)) : 1;
    const fill = (canvas.clientHeight - 4) / state.zoom - MARGIN_T - MARGIN_B;
    state.rowH = Math.min(ROW_H[1], Math.max(ROW_H[0], fill / nRows || 0));
    state.xy = new Array(data.nodes.length);
    const rank = (n) => (n.kind === "error" ? 0 : 1);
    for (const [k, ids] of cells) {
      const [row, col] = k.split(",").map(Number);
      ids.sort((a, b) => rank(data.nodes[a]) - rank(data.nodes[b]) || a - b);
      const cx = x0[col] + width[col] / 2, y = rowY(row, nRows);
      ids.forEach((id, j) => {
        state.xy[id] = [cx + (j - (ids.length - 1) / 2) * GAP, y];
      });
    }
    state.size = [W, MARGIN_T + nRows * state.rowH + MARGIN_B];
  }

  const rowY = (row, nRows) => MARGIN_T + (nRows - 1 - row) * state.rowH + state.rowH / 2;

  function shape(kind) {
    if (kind === "feature" || kind === "component") return s("circle", { class: "shape", r: 5 });
    if (kind === "logit") return s("polygon", { class: "shape", points: "0,-7 7,0 0,7 -7,0" });
    if (kind === "embedding") return s("rect", { class: "shape", x: -5, y: -5, width: 10, height: 10, rx: 2 });
    return s("rect", { class: "shape", x: -4, y: -4, width: 8, height: 8 });
  }

  function applyZoom() {
    const svg = $("graph"), [W, H] = state.size;
    svg.setAttribute("width", Math.round(W * state.zoom));
    svg.setAttribute("height", Math.round(H * state.zoom));
  }

  function draw(data) {
    const svg = $("graph");
    svg.replaceChildren();
    svg.classList.remove("focus");
    const [W] = state.size, nRows = data.row_labels.length;
    svg.setAttribute("viewBox", `0 0 ${state.size[0]} ${state.size[1]}`);
    applyZoom();
    const axes = s("g", { class: "axes" });
    data.row_labels.forEach((label, row) => {
      const y = rowY(row, nRows);
      axes.append(s("line", { class: "row-line", x1: MARGIN_L, x2: W, y1: y, y2: y }));
      const t = s("text", { class: "row-label", x: 4, y: y + 3 });
      t.textContent = label;
      axes.append(t);
    });
    data.col_labels.forEach((label, c) => {
      const x = state.cols.x0[c] + state.cols.width[c] / 2, y = MARGIN_T + nRows * state.rowH + 8;
      const t = s("text", { class: "col-label", x: x - 3, y, transform: `rotate(40 ${x - 3} ${y})` });
      t.textContent = label.length > 14 ? label.slice(0, 13) + "…" : label;
      axes.append(t);
    });
    svg.append(axes);

    state.incoming = data.nodes.map(() => []);
    state.outgoing = data.nodes.map(() => []);
    state.edgeEls = new Array(data.edges.length);
    let maxW = 1e-30;
    for (const e of data.edges) maxW = Math.max(maxW, Math.abs(e[2] || 0));
    const order = data.edges.map((e, i) => i);
    order.sort((a, b) => Math.abs(data.edges[a][2] || 0) - Math.abs(data.edges[b][2] || 0));
    const edges = s("g", { class: "edges" });
    for (const i of order) {
      const [src, tgt, w] = data.edges[i];
      const [sx, sy] = state.xy[src], [tx, ty] = state.xy[tgt];
      const r = Math.sqrt(Math.abs(w || 0) / maxW), my = (sy + ty) / 2;
      const p = s("path", {
        class: "edge " + ((w || 0) >= 0 ? "pos" : "neg"),
        d: `M${sx},${sy} C${sx},${my} ${tx},${my} ${tx},${ty}`,
        "stroke-width": (0.4 + 3.6 * r).toFixed(2),
        opacity: (0.12 + 0.78 * r).toFixed(2),
      });
      edges.append(p);
      state.edgeEls[i] = p;
      state.outgoing[src].push(i);
      state.incoming[tgt].push(i);
    }
    svg.append(edges, s("g", { class: "groups" }));

    const nodes = s("g", { class: "nodes" });
    state.nodeEls = data.nodes.map((n) => {
      const [x, y] = state.xy[n.id];
      const g = s("g", { class: "node " + n.kind + (n.site === "attn" ? " attn" : ""), "data-id": n.id, transform: `translate(${x},${y})` });
      const title = s("title");
      title.textContent = n.label;
      g.append(shape(n.kind), title);
      g.addEventListener("mouseenter", () => hover(n.id));
      g.addEventListener("mouseleave", () => hover(null));
      g.addEventListener("click", (ev) => {
        ev.stopPropagation();
        if (ev.shiftKey) togglePin(n.id);
        else select(state.selected === n.id ? null : n.id);
      });
      nodes.append(g);
      return g;
    });
    svg.append(nodes);
    svg.onclick = () => select(null);
  }

  // ------------------------------------------------------------------ focus and details
  function hover(id) {
    state.hovered = id;
    refreshFocus();
    if (state.selected === null) showDetails(id);
  }

  function select(id) {
    if (state.selected !== null) state.nodeEls[state.selected].classList.remove("selected");
    state.selected = id;
    if (id !== null) state.nodeEls[id].classList.add("selected");
    refreshFocus();
    showDetails(id);
  }

  function refreshFocus() {
    for (const el of state.highlighted) el.classList.remove("hl");
    state.highlighted = [];
    const id = state.hovered !== null ? state.hovered : state.selected;
    const svg = $("graph");
    svg.classList.toggle("focus", id !== null);
    if (id === null) return;
    const mark = (el) => {
      el.classList.add("hl");
      state.highlighted.push(el);
    };
    mark(state.nodeEls[id]);
    for (const e of state.incoming[id]) {
      mark(state.edgeEls[e]);
      mark(state.nodeEls[state.data.edges[e][0]]);
    }
    for (const e of state.outgoing[id]) {
      mark(state.edgeEls[e]);
      mark(state.nodeEls[state.data.edges[e][1]]);
    }
  }

  function showDetails(id) {
    const box = $("details");
    if (id === null || id === undefined) {
      box.replaceChildren(h("p", { class: "hint" }, HINT));
      return;
    }
    const d = state.data, n = d.nodes[id];
    const kv = h("dl", { class: "kv" });
    const add = (k, v) => {
      if (v !== undefined && v !== null && v !== "") kv.append(h("dt", {}, k), h("dd", {}, v));
    };
    if (d.kind === "graph") {
      add("kind", n.kind);
      add("layer", n.kind === "embedding" ? "embeddings" : n.kind === "logit" ? "logits" : n.layer);
      add("position", `${n.position} ${JSON.stringify(d.prompt_tokens[n.position])}`);
      if (n.kind === "feature") add("feature", `L${n.layer}/F${n.feature}`);
      if (n.kind === "logit") add("probability", fmt(n.prob));
      add("activation", fmt(n.activation));
      add("influence", fmt(n.influence, 4));
      if ("attribution" in n) add("attribution", fmt(n.attribution, 4));
      const sn = supernodeOf(n);
      if (sn) add("supernode", sn.name);
    } else {
      add("position", d.col_labels[n.col]);
    }
    const pin = h("button", { id: "pin-toggle", onclick: () => togglePin(id) }, state.pinned.has(id) ? "unpin" : "pin");
    box.replaceChildren(
      h("h3", { class: "node-label" }, n.label), pin, kv,
      edgeList("incoming", state.incoming[id], (e) => d.edges[e][0]),
      edgeList("outgoing", state.outgoing[id], (e) => d.edges[e][1]),
    );
    if (d.kind === "graph" && n.kind === "feature") box.append(dashboard(d.dashboards[`${n.site === "attn" ? "A" : ""}${n.layer}/${n.feature}`]));
  }

  function edgeList(title, idx, other) {
    const d = state.data, w = (e) => Math.abs(d.edges[e][2] || 0);
    const sorted = idx.slice().sort((a, b) => w(b) - w(a));
    const ul = h("ul", { class: "edges-list" });
    for (const e of sorted.slice(0, N_EDGES_LISTED)) {
      const weight = d.edges[e][2], o = other(e);
      const title = d.edge_labels ? d.edge_labels[e] : d.nodes[o].label;
      ul.append(h("li", { onclick: () => select(o), title },
        h("span", { class: "w " + ((weight || 0) >= 0 ? "pos" : "neg") }, fmt(weight, 4)), d.nodes[o].label));
    }
    if (sorted.length > N_EDGES_LISTED) ul.append(h("li", { class: "hint" }, `… and ${sorted.length - N_EDGES_LISTED} more`));
    return h("div", {}, h("h4", {}, `${title} edges (${idx.length})`), ul);
  }

  function dashboard(b) {
    const box = h("div", { class: "dashboard" });
    if (!b) {
      box.append(h("p", { class: "hint" }, state.data.dashboards_note || "no dashboard for this feature."));
      return box;
    }
    box.append(
      h("h3", {}, "Dashboard: ", b.label),
      h("dl", { class: "kv" },
        h("dt", {}, "frequency"), h("dd", {}, `${(100 * b.frequency).toFixed(3)}% of tokens`),
        h("dt", {}, "max / mean"), h("dd", {}, `${fmt(b.max)} / ${fmt(b.mean)}`)),
      h("h4", {}, "Top activations"),
      h("div", { class: "top-examples" }, b.top.map((ex) => example(ex, b.max))),
      h("h4", {}, "Top logits"), logitList(b.top_logits),
      h("h4", {}, "Bottom logits"), logitList(b.bottom_logits),
    );
    const q = h("details", {}, h("summary", {}, "Examples by activation quantile"));
    for (const bin of b.quantiles) {
      q.append(h("div", { class: "hint" }, `${fmt(bin.range[0])} to ${fmt(bin.range[1])}`));
      bin.examples.forEach((ex) => q.append(example(ex, b.max)));
    }
    box.append(q);
    return box;
  }

  function example(ex, max) {
    const div = h("div", { class: "example" }, h("span", { class: "act" }, fmt(ex.act)));
    ex.tokens.forEach((t, i) => {
      const a = max > 0 ? Math.max(0, Math.min(1, ex.acts[i] / max)) : 0;
      div.append(h("span", {
        class: "tok" + (i === ex.center ? " center" : ""),
        style: `background: rgba(255, 140, 0, ${a.toFixed(3)})`,
        title: fmt(ex.acts[i]),
      }, t), " ");
    });
    return div;
  }

  function logitList(pairs) {
    return h("div", { class: "logits" }, pairs.map(([t, v]) => h("span", {}, `${JSON.stringify(t)} ${fmt(v)}   `)));
  }

  // ------------------------------------------------------------------ pins and supernodes
  function togglePin(id) {
    if (state.pinned.has(id)) state.pinned.delete(id);
    else state.pinned.add(id);
    state.nodeEls[id].classList.toggle("pinned", state.pinned.has(id));
    renderPins();
    if (state.selected === id || (state.selected === null && state.hovered === id)) showDetails(id);
  }

  function renderPins() {
    $("pin-count").textContent = state.pinned.size;
    $("pin-list").replaceChildren(...[...state.pinned].map((id) => h("li", {},
      h("span", { onclick: () => select(id), title: state.data.nodes[id].label }, state.data.nodes[id].label),
      h("button", { onclick: () => togglePin(id), title: "unpin" }, "×"))));
    $("group").disabled = state.pinned.size === 0;
    applyOnlyPinned();
  }

  function applyOnlyPinned() {
    const on = $("only-pinned").checked, svg = $("graph");
    svg.classList.toggle("only-pinned", on);
    if (!on || !state.data) return;
    state.nodeEls.forEach((el, id) => el.classList.toggle("off", !state.pinned.has(id)));
    state.edgeEls.forEach((el, i) => {
      const [a, b] = state.data.edges[i];
      el.classList.toggle("off", !(state.pinned.has(a) && state.pinned.has(b)));
    });
    svg.querySelectorAll("g.group").forEach((g) => {
      g.classList.toggle("off", !g.dataset.ids.split(",").some((id) => state.pinned.has(Number(id))));
    });
  }

  const memberIds = (sn) => sn.members.flatMap((k) => state.keyIndex.get(keyStr(k)) || []);

  function supernodeOf(n) {
    const k = keyStr(n.key);
    return state.supernodes.find((sn) => sn.members.some((m) => keyStr(m) === k));
  }

  function group() {
    const name = $("group-name").value.trim();
    if (!name) return say("give the supernode a name first.", true);
    if (state.supernodes.some((sn) => sn.name === name)) return say(`a supernode is already named ${JSON.stringify(name)}.`, true);
    const ids = [...state.pinned];
    const taken = ids.find((id) => supernodeOf(state.data.nodes[id]));
    if (taken !== undefined) {
      const n = state.data.nodes[taken];
      return say(`${n.label} is already in supernode ${JSON.stringify(supernodeOf(n).name)}; a node may belong to one.`, true);
    }
    state.supernodes.push({
      name, members: ids.map((id) => state.data.nodes[id].key), color: PALETTE[state.supernodes.length % PALETTE.length],
    });
    for (const id of ids) state.nodeEls[id].classList.remove("pinned");
    state.pinned.clear();
    $("group-name").value = "";
    say(`grouped ${ids.length} nodes into ${JSON.stringify(name)}; not saved yet.`);
    renderPins();
    renderSupernodes();
  }

  function renderSupernodes() {
    const list = $("supernode-list");
    list.replaceChildren(...state.supernodes.map((sn, i) => {
      const shown = memberIds(sn).length, missing = sn.members.length - shown;
      return h("li", {},
        h("span", { class: "swatch", style: `background:${sn.color}` }),
        h("span", { class: "name", title: sn.name }, sn.name),
        `${sn.members.length} node${sn.members.length === 1 ? "" : "s"}` + (missing > 0 ? ` (${missing} not in this view)` : ""),
        h("button", {
          title: "remove", onclick: () => {
            state.supernodes.splice(i, 1);
            say(`removed ${JSON.stringify(sn.name)}; not saved yet.`);
            renderSupernodes();
          },
        }, "×"));
    }));
    if (!state.supernodes.length) list.append(h("li", { class: "hint" }, "none"));
    drawGroups();
  }

  function drawGroups() {
    const layer = $("graph").querySelector("g.groups");
    if (!layer) return;
    layer.replaceChildren();
    state.nodeEls.forEach((el) => {
      el.classList.remove("member");
      el.querySelector(".shape").style.stroke = "";
    });
    for (const sn of state.supernodes) {
      const ids = memberIds(sn);
      if (!ids.length) continue;
      const xs = ids.map((id) => state.xy[id][0]), ys = ids.map((id) => state.xy[id][1]);
      const x = Math.min(...xs) - 10, y = Math.min(...ys) - 10;
      const g = s("g", { class: "group" });
      g.dataset.ids = ids.join(",");
      g.append(s("rect", { x, y, width: Math.max(...xs) + 10 - x, height: Math.max(...ys) + 10 - y, rx: 6, stroke: sn.color }));
      const t = s("text", { x, y: y - 3, fill: sn.color });
      t.textContent = sn.name;
      g.append(t);
      layer.append(g);
      for (const id of ids) {
        state.nodeEls[id].classList.add("member");
        state.nodeEls[id].querySelector(".shape").style.stroke = sn.color;
      }
    }
    applyOnlyPinned();
  }

  async function save() {
    const d = state.data;
    const body = JSON.stringify({
      graph: d.name, supernodes: state.supernodes.map((sn) => ({ name: sn.name, members: sn.members })),
    });
    $("save").disabled = true;
    try {
      const r = await getJSON("api/supernodes", { method: "POST", headers: { "Content-Type": "application/json" }, body });
      say(`saved ${r.saved} supernode${r.saved === 1 ? "" : "s"} to ${r.file}:/supernodes/${r.graph}.`);
    } catch (e) {
      say(e.message, true);
    } finally {
      $("save").disabled = false;
    }
  }

  function wireControls() {
    $("only-pinned").addEventListener("change", applyOnlyPinned);
    $("pin-clear").addEventListener("click", () => {
      for (const id of state.pinned) state.nodeEls[id].classList.remove("pinned");
      state.pinned.clear();
      renderPins();
    });
    $("group").addEventListener("click", group);
    $("save").addEventListener("click", save);
    $("zoom-in").addEventListener("click", () => { state.zoom = Math.min(4, state.zoom * 1.25); applyZoom(); });
    $("zoom-out").addEventListener("click", () => { state.zoom = Math.max(0.25, state.zoom / 1.25); applyZoom(); });
  }

  init();
})();
