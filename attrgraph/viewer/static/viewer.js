// attrgraph viewer: plain JavaScript and SVG, no libraries and no network beyond the server
// that served this page (or none: `attrgraph.show` inlines the data as window.ATTRGRAPH_DATA).
//
// Layout: rows bottom to top (embeddings, layers, logits), columns left to right (positions);
// nodes sharing a (row, column) cell are spread horizontally and a column is as wide as its
// fullest cell, each node LABEL_GAP apart so that its label, written at LABEL_ANGLE, clears its
// neighbours'. Features carry their label beside them. Edges are blue when positive, red when
// negative; width and opacity grow with sqrt(|weight| / max |weight|). By default (as Neuronpedia's
// graph page) only the hovered or selected node's edges are drawn in full, with the TOP_EDGES
// strongest elsewhere drawn thin; "all edges" draws every one. Wheel zooms about the cursor,
// dragging pans; labels, the token axis included, never get smaller than MIN_TEXT_PX on screen.
//
// What is drawn (recompute):
// 1. Threshold sliders and the rule selector: the drawn graph is what prune.py's `prune_graph`
//    gives for the graph the page received, with step 3 ranking by `slider_influence` (the
//    unpruned graph's influence when stored). The rule starts as the one the graph records
//    (`prune_rule`; circuit-tracer's, prune_graph's default, for an unpruned graph).
//    a. Nodes: the cutoff is find_threshold of `slider_influence` over the non-logit nodes at the
//       node threshold; embeddings and logits always stay, features (and by circuit-tracer's
//       rule error nodes) stay when they reach it; by the appendix's rule every error node stays.
//    b. Edges, on the kept nodes: A = |adjacency| with rows summing to 1, the influence
//       z = ((I - A)^-1 - I)^T w (w: logit probabilities), edge score A[t, s] (z_t + w_t); the
//       edges below the edge threshold's find_threshold cutoff go.
//    c. Then, repeated until nothing changes: circuit-tracer's rule drops every feature and error
//       node without a kept outgoing edge and every feature without a kept incoming edge; the
//       appendix's drops the features that had outgoing edges in (b) and kept none.
// 2. The header's replacement and completeness scores are scores.py's, of that drawn graph.
// 3. Error nodes can be hidden; supernodes collapsed into one node each with summed edges.
// 4. Model panels (served pages only, loaded when clicked, answers kept): a clicked feature shows
//    its strongest global connections (api/global: virtual weights in and out, those whose pair
//    never coactivates on the corpus marked unused, and its output logits); a clicked edge shows
//    the attention heads that carried it (api/heads: per layer each head's part and the bypass).
//    Every server string reaches the page as text (textContent), never as markup.
// The view (graph, selected node or edge, pins, thresholds, rule, toggles) lives in the URL hash.
"use strict";
(function () {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const EMBEDDED = window.ATTRGRAPH_DATA || null;
  const TOKEN = new URLSearchParams(location.search).get("token");
  const PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6",
    "#9a6324", "#469990", "#808000"];
  const ROW_H = [70, 160], GAP = 18, MIN_COL = 60, MARGIN_L = 58, MARGIN_T = 90, MARGIN_B = 110;
  // a label written at LABEL_ANGLE (degrees up from the x axis) clears a parallel neighbour's when
  // their anchors are LABEL_GAP * sin(angle) apart across the text: at 70 and 22 that is 20.7,
  // above the label size at the smallest starting zoom (MIN_TEXT_PX / 0.5 = 20)
  // and a label is cut to the characters (about CHAR_EM of its size each) whose rise, length *
  // sin(angle), stays inside its row, so it never runs into the labels of the row above
  const LABEL_ANGLE = 70, LABEL_GAP = 22, TOP_EDGES = 60, CHAR_EM = 0.66;
  const N_EDGES_LISTED = 15, N_RANKED = 40, N_SEARCH = 30, LABEL_CHARS = 26;
  const LABEL_SIZE = 11, MIN_TEXT_PX = 10, K_MIN = 0.05, K_MAX = 8;
  const RULES = ["circuit-tracer", "appendix"], DEFAULT_RULE = "circuit-tracer";  // prune.py
  const HINT = "Hover a node to see it; click to keep it here. Shift-click pins a node.";

  const state = {
    data: null, selected: null, hovered: null, pinned: new Set(), supernodes: [],
    nt: 1, et: 1, rule: DEFAULT_RULE, showErrors: true, collapse: false, onlyPinned: false, query: "",
    keep: null, keepEdge: null, scores: null, nodes: [], edges: [], nodeEls: new Map(), labelEls: new Map(),
    edgeEls: [], incoming: new Map(), outgoing: new Map(), xy: [], cols: null, size: [0, 0],
    keyIndex: new Map(), highlighted: [], cam: { x: 0, y: 0, k: 1 }, view: "",
    selectedEdge: null, panels: new Map(), allEdges: false, labelChars: LABEL_CHARS, labelText: new Map(),
  };

  const $ = (id) => document.getElementById(id);

  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "style") Object.assign(e.style, v);  // CSSOM: the CSP refuses style attributes
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
  const short = (t, n = LABEL_CHARS) => (t.length > n ? t.slice(0, n - 1) + "…" : t);

  function note(text, isError) {
    $("notes").append(h("p", { class: isError ? "error" : "" }, text));
  }

  function say(text, isError, id = "save-status") {
    const el = $(id);
    if (!el) return;
    el.textContent = text;
    el.className = isError ? "error" : "ok";
  }

  async function getJSON(url, options) {
    const opts = Object.assign({}, options || {});
    // the header proves the read comes from this page (access.py step 4): no other site can send it
    opts.headers = Object.assign({ "X-Attrgraph-Page": "1" }, opts.headers || {});
    if (TOKEN) opts.headers["X-Attrgraph-Token"] = TOKEN;
    const r = await fetch(url, opts);
    let body = null;
    try {
      body = await r.json();
    } catch (e) {
      body = null;
    }
    if (!r.ok) throw new Error((body && body.error) || `${url}: HTTP ${r.status}`);
    return body;
  }

  // ------------------------------------------------------------------ the URL hash
  function readHash() {
    const parts = location.hash.slice(1).split("&");
    const out = { view: decodeURIComponent(parts[0] || "") };
    for (const p of parts.slice(1)) {
      const i = p.indexOf("=");
      if (i > 0) out[p.slice(0, i)] = decodeURIComponent(p.slice(i + 1));
    }
    return out;
  }

  function writeHash() {
    if (!state.data) return;
    const parts = [encodeURIComponent(state.view)];
    if (state.selected !== null) parts.push("sel=" + state.selected);
    const se = state.selectedEdge;
    if (se && typeof se.src === "number" && typeof se.tgt === "number") parts.push(`edge=${se.src}.${se.tgt}`);
    if (state.pinned.size) parts.push("pins=" + [...state.pinned].join("."));
    if (state.nt < 1) parts.push("nt=" + state.nt);
    if (state.et < 1) parts.push("et=" + state.et);
    if (state.rule !== recordedRule()) parts.push("rule=" + state.rule);
    if (!state.showErrors) parts.push("err=0");
    if (state.collapse) parts.push("col=1");
    if (state.onlyPinned) parts.push("only=1");
    if (state.allEdges) parts.push("all=1");
    if (state.query) parts.push("q=" + encodeURIComponent(state.query));
    const hash = "#" + parts.join("&");
    if (location.hash !== hash) {
      try {
        history.replaceState(null, "", hash);
      } catch (e) { /* a srcdoc frame may refuse; the view still works */ }
    }
  }

  function applyHash(hs) {
    const n = state.data.nodes.length, valid = (i) => Number.isInteger(i) && i >= 0 && i < n;
    const num = (v, d) => (v === undefined || !isFinite(Number(v)) ? d : Math.min(1, Math.max(0, Number(v))));
    state.nt = num(hs.nt, 1);
    state.et = num(hs.et, 1);
    state.rule = RULES.includes(hs.rule) ? hs.rule : recordedRule();
    state.showErrors = hs.err !== "0";
    state.collapse = hs.col === "1";
    state.onlyPinned = hs.only === "1";
    state.query = hs.q || "";
    state.pinned = new Set((hs.pins || "").split(".").filter((x) => x !== "").map(Number).filter(valid));
    const sel = hs.sel === undefined ? null : Number(hs.sel);
    state.selected = valid(sel) ? sel : null;
    const [src, tgt] = (hs.edge || "").split(".").map((v) => (v === "" ? NaN : Number(v)));
    state.selectedEdge = valid(src) && valid(tgt) ? { src, tgt } : null;  // recompute finds the drawn one
    state.allEdges = hs.all === "1";
    syncControls();
  }

  // the rule the graph was pruned by, which the sliders start with (payload.py)
  function recordedRule() {
    const r = state.data && state.data.prune_rule;
    return RULES.includes(r) ? r : DEFAULT_RULE;
  }

  function syncControls() {
    $("node-threshold").value = state.nt;
    $("edge-threshold").value = state.et;
    $("node-threshold-value").textContent = state.nt.toFixed(2);
    $("edge-threshold-value").textContent = state.et.toFixed(2);
    $("prune-rule").value = state.rule;
    $("prune-rule").disabled = !state.data || state.data.kind !== "graph";
    $("show-errors").checked = state.showErrors;
    $("collapse").checked = state.collapse;
    $("only-pinned").checked = state.onlyPinned;
    $("all-edges").checked = state.allEdges;
    $("search").value = state.query;
  }

  // ------------------------------------------------------------------ loading
  async function init() {
    wireControls();
    const pick = $("pick");
    if (EMBEDDED) {
      pick.append(h("option", { value: "graph:" + EMBEDDED.name }, EMBEDDED.name));
      pick.disabled = true;
      state.view = "graph:" + EMBEDDED.name;
      render(EMBEDDED, readHash());
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
    const hs = readHash();
    if (hs.view && [...pick.options].some((o) => o.value === hs.view)) pick.value = hs.view;
    pick.addEventListener("change", () => load(pick.value, {}));
    window.addEventListener("hashchange", () => {
      const next = readHash();
      if (next.view && next.view !== state.view && [...pick.options].some((o) => o.value === next.view)) {
        pick.value = next.view;
        load(next.view, next);
      } else if (state.data) {
        applyHash(next);
        recompute();
      }
    });
    await load(pick.value, hs.view === pick.value ? hs : {});
  }

  async function load(value, hs, keepCam) {
    const i = value.indexOf(":");
    const kind = value.slice(0, i), name = value.slice(i + 1);
    state.view = value;
    try {
      render(await getJSON(`api/${kind}?name=${encodeURIComponent(name)}`), hs, keepCam);
    } catch (e) {
      $("notes").replaceChildren();
      note(e.message, true);
    }
  }

  function render(data, hs, keepCam) {
    Object.assign(state, { data, hovered: null, keyIndex: new Map() });
    data.nodes.forEach((n) => {
      const k = keyStr(n.key);
      if (!state.keyIndex.has(k)) state.keyIndex.set(k, []);
      state.keyIndex.get(k).push(n.id);
    });
    state.supernodes = (data.supernodes || []).map((sn, i) => ({
      name: sn.name, members: sn.members, color: PALETTE[i % PALETTE.length],
    }));
    applyHash(hs || {});
    $("notes").replaceChildren();
    (data.notes || []).forEach((t) => note(t));
    if (data.kind === "graph" && !Object.keys(data.dashboards).length) note(data.dashboards_note);
    $("group-controls").style.display = data.kind === "graph" ? "" : "none";
    $("ranked-box").style.display = data.kind === "graph" ? "" : "none";
    $("save").style.display = data.editable ? "" : "none";
    $("import-controls").style.display = data.editable ? "" : "none";
    $("save-status").textContent = "";
    layout(data);
    if (!keepCam) fit();
    recompute();
  }

  // ------------------------------------------------------------------ step 1: thresholds
  function findThreshold(scores, threshold) {  // prune.py find_threshold
    if (threshold >= 1 || !scores.length) return -Infinity;
    const ordered = scores.slice().sort((a, b) => b - a);
    const total = ordered.reduce((a, b) => a + b, 0);
    if (total <= 0) return -Infinity;
    let acc = 0;
    for (let i = 0; i < ordered.length; i++) {
      acc += ordered[i];
      if (acc / total >= threshold) return ordered[i];
    }
    return ordered[ordered.length - 1];
  }

  function logitWeight(n) {
    return n.kind === "logit" ? n.prob || 0 : 0;
  }

  // influence z - w over the nodes `keep` and edges `edgeOn` (edges go from lower to higher index)
  function influence(nodes, edges, keep, edgeOn) {
    const n = nodes.length, rowSum = new Float64Array(n), z = new Float64Array(n);
    edges.forEach((e, i) => { if (edgeOn[i]) rowSum[e[1]] += Math.abs(e[2] || 0); });
    const byTarget = nodes.map(() => []);
    edges.forEach((e, i) => { if (edgeOn[i]) byTarget[e[1]].push(i); });
    for (let t = 0; t < n; t++) z[t] = keep[t] ? logitWeight(nodes[t]) : 0;
    for (let t = n - 1; t >= 0; t--) {  // targets before their sources: z_s = w_s + sum_t A[t, s] z_t
      if (!keep[t] || rowSum[t] === 0) continue;
      for (const i of byTarget[t]) {
        const [src, , w] = edges[i];
        z[src] += (Math.abs(w || 0) / rowSum[t]) * z[t];
      }
    }
    const infl = new Float64Array(n);
    for (let i = 0; i < n; i++) infl[i] = keep[i] ? z[i] - logitWeight(nodes[i]) : 0;
    return { infl, rowSum };
  }

  function thresholds(data) {
    const nodes = data.nodes, edges = data.edges, n = nodes.length;
    const keep = new Array(n).fill(true), edgeOn = new Array(edges.length).fill(true);
    if (data.kind !== "graph") return { keep, edgeOn, scores: null };
    const ct = state.rule === "circuit-tracer";
    // a. nodes (prune.py select_nodes)
    const si = (x) => (x.slider_influence === undefined ? x.influence || 0 : x.slider_influence || 0);
    const cut = findThreshold(nodes.filter((x) => x.kind !== "logit").map(si), state.nt);
    const always = ct ? ["embedding", "logit"] : ["embedding", "logit", "error"];
    nodes.forEach((x, i) => { keep[i] = always.includes(x.kind) || si(x) >= cut; });
    // b. edges (prune.py _prune_edges); an edge of weight 0 is no edge there
    edges.forEach((e, i) => { edgeOn[i] = keep[e[0]] && keep[e[1]] && !!e[2]; });
    const hadOut = new Array(n).fill(false);
    edges.forEach((e, i) => { if (edgeOn[i]) hadOut[e[0]] = true; });
    if (state.et < 1) {
      const { infl, rowSum } = influence(nodes, edges, keep, edgeOn);
      const idx = [], score = [];
      edges.forEach((e, i) => {
        if (!edgeOn[i]) return;
        idx.push(i);
        score.push((Math.abs(e[2]) / rowSum[e[1]]) * (infl[e[1]] + logitWeight(nodes[e[1]])));
      });
      const ecut = findThreshold(score, state.et);
      idx.forEach((i, j) => { if (score[j] < ecut) edgeOn[i] = false; });
    }
    // c. nodes left without the links their rule asks for go, until none is left
    const needsOut = nodes.map((x, i) => (ct ? x.kind === "feature" || x.kind === "error" : x.kind === "feature" && hadOut[i]));
    const needsIn = nodes.map((x) => ct && x.kind === "feature");
    for (;;) {
      const hasOut = new Array(n).fill(false), hasIn = new Array(n).fill(false);
      edges.forEach((e, i) => {
        if (edgeOn[i] && keep[e[0]] && keep[e[1]]) { hasOut[e[0]] = true; hasIn[e[1]] = true; }
      });
      let dropped = false;
      nodes.forEach((x, i) => {
        if (keep[i] && ((needsOut[i] && !hasOut[i]) || (needsIn[i] && !hasIn[i]))) { keep[i] = false; dropped = true; }
      });
      if (!dropped) break;
    }
    edges.forEach((e, i) => { edgeOn[i] = edgeOn[i] && keep[e[0]] && keep[e[1]]; });
    return { keep, edgeOn, scores: graphScores(nodes, edges, keep, edgeOn) };
  }

  // step 2: scores.py on the drawn graph
  function graphScores(nodes, edges, keep, edgeOn) {
    const { infl, rowSum } = influence(nodes, edges, keep, edgeOn);
    const errShare = new Float64Array(nodes.length);
    edges.forEach((e, i) => {
      if (edgeOn[i] && nodes[e[0]].kind === "error" && rowSum[e[1]] > 0) errShare[e[1]] += Math.abs(e[2] || 0) / rowSum[e[1]];
    });
    let token = 0, error = 0, total = 0, complete = 0;
    nodes.forEach((x, i) => {
      if (!keep[i]) return;
      if (x.kind === "embedding") token += infl[i];
      if (x.kind === "error") error += infl[i];
      const out = infl[i] + logitWeight(x);
      total += out;
      complete += (1 - errShare[i]) * out;
    });
    return {
      replacement: token + error > 0 ? token / (token + error) : 1,
      completeness: total > 0 ? complete / total : 1,
    };
  }

  // ------------------------------------------------------------------ step 3: what is drawn
  function recompute() {
    const data = state.data;
    if (!data) return;
    const { keep, edgeOn, scores } = thresholds(data);
    state.keep = keep;
    state.keepEdge = edgeOn;
    state.scores = scores;
    const shown = data.nodes.map((x, i) => keep[i] && (state.showErrors || x.kind !== "error"));
    // supernodes collapsed: members map to one pseudo node (id "s{k}") at their mean position
    const owner = new Map();
    const nodes = data.nodes.filter((x, i) => shown[i]).map((x) => ({ node: x, id: x.id, xy: state.xy[x.id] }));
    if (state.collapse && data.kind === "graph") {
      const pseudo = [];
      state.supernodes.forEach((sn, k) => {
        const ids = memberIds(sn).filter((i) => shown[i]);
        if (!ids.length) return;
        const id = "s" + k;
        ids.forEach((i) => owner.set(i, id));
        const xs = ids.map((i) => state.xy[i][0]), ys = ids.map((i) => state.xy[i][1]);
        pseudo.push({
          id, sn, members: ids, color: sn.color,
          xy: [xs.reduce((a, b) => a + b, 0) / xs.length, ys.reduce((a, b) => a + b, 0) / ys.length],
          node: { kind: "supernode", label: sn.name, id },
        });
      });
      state.nodes = nodes.filter((x) => !owner.has(x.id)).concat(pseudo);
    } else {
      state.nodes = nodes;
    }
    const summed = new Map();
    data.edges.forEach((e, i) => {
      if (!edgeOn[i] || !shown[e[0]] || !shown[e[1]]) return;
      const a = owner.get(e[0]) ?? e[0], b = owner.get(e[1]) ?? e[1];
      if (a === b) return;  // inside one supernode
      if (a === e[0] && b === e[1]) {
        summed.set(`e${i}`, { src: a, tgt: b, w: e[2] || 0, index: i });
        return;
      }
      const k = `${a}>${b}`;
      if (!summed.has(k)) summed.set(k, { src: a, tgt: b, w: 0, index: -1 });
      summed.get(k).w += e[2] || 0;
    });
    state.edges = [...summed.values()];
    $("summary").textContent = summary(data);
    draw();
    if (state.selected !== null && !state.nodeEls.has(state.selected)) state.selected = null;
    if (state.selected !== null) state.nodeEls.get(state.selected).classList.add("selected");
    refreshFocus();  // the selected node's edges (drawn in full) on a new drawing, e.g. from the URL
    for (const id of state.pinned) if (state.nodeEls.has(id)) state.nodeEls.get(id).classList.add("pinned");
    const edge = state.selectedEdge && state.edges.find((e) => e.src === state.selectedEdge.src && e.tgt === state.selectedEdge.tgt);
    if (edge) selectEdge(edge);
    else {
      state.selectedEdge = null;
      showDetails(state.selected);
    }
    renderPins();
    renderSupernodes();
    renderRanked();
    search(state.query);
    writeHash();
  }

  function summary(d) {
    if (d.kind === "circuit") return `circuit ${d.name}: ${d.method}, ${d.n_edges} edges, ${d.nodes.length} nodes`;
    const nNodes = state.keep.filter(Boolean).length, nEdges = state.keepEdge.filter(Boolean).length;
    const parts = [`${nNodes} nodes, ${nEdges} edges`];
    if (nNodes !== d.nodes.length || nEdges !== d.edges.length) parts[0] += ` (of ${d.nodes.length} nodes, ${d.edges.length} edges drawn at thresholds 1)`;
    if (d.stored.n_nodes !== d.nodes.length || d.stored.n_edges !== d.edges.length) {
      parts[0] += ` (stored: ${d.stored.n_nodes} nodes, ${d.stored.n_edges} edges)`;
    }
    parts.push(`replacement ${fmt(state.scores.replacement)}`, `completeness ${fmt(state.scores.completeness)}`);
    parts.push("logits " + d.logits.map((l) => `${JSON.stringify(l.token)} ${fmt(l.prob)}`).join(" "));
    const hi = d.hierarchical;
    if (hi) {
      parts.push(`hierarchical (tau ${fmt(hi.tau, 4)}): root ${fmt(hi.root_value, 4)} = leaves + bias ` +
        `${fmt(hi.bias_attribution, 4)} + detached ${fmt(hi.detached_attribution, 4)}`);
    }
    return parts.join(" · ");
  }

  // ------------------------------------------------------------------ layout, camera, drawing
  function layout(data) {
    const nRows = data.row_labels.length, nCols = Math.max(data.col_labels.length, 1);
    const cells = new Map();
    for (const n of data.nodes) {
      const k = `${n.row},${n.col}`;
      if (!cells.has(k)) cells.set(k, []);
      cells.get(k).push(n.id);
    }
    const width = new Array(nCols).fill(MIN_COL);
    const gap = (ids) => (ids.some((id) => nodeText(data.nodes[id])) ? LABEL_GAP : GAP);  // labelled: room
    for (const [k, ids] of cells) {
      const col = Number(k.split(",")[1]);
      width[col] = Math.max(width[col], ids.length * gap(ids) + 16);
    }
    const x0 = [MARGIN_L];
    for (let c = 0; c < nCols; c++) x0.push(x0[c] + width[c]);
    state.cols = { x0, width };
    const canvas = $("canvas"), W = x0[nCols] + 120;  // room for the last column's labels
    const k = initialZoom(W);
    const fill = (canvas.clientHeight - 4) / k - MARGIN_T - MARGIN_B;
    state.rowH = Math.min(ROW_H[1], Math.max(ROW_H[0], fill / nRows || 0));
    state.xy = new Array(data.nodes.length);
    const rank = (n) => (n.kind === "error" ? 0 : 1);
    for (const [key, ids] of cells) {
      const [row, col] = key.split(",").map(Number);
      ids.sort((a, b) => rank(data.nodes[a]) - rank(data.nodes[b]) || a - b);
      const cx = x0[col] + width[col] / 2, y = rowY(row, nRows);
      ids.forEach((id, j) => {
        state.xy[id] = [cx + (j - (ids.length - 1) / 2) * gap(ids), y];
      });
    }
    state.size = [W, MARGIN_T + nRows * state.rowH + MARGIN_B];
  }

  const rowY = (row, nRows) => MARGIN_T + (nRows - 1 - row) * state.rowH + state.rowH / 2;

  function initialZoom(W) {
    // fit the width within reason (labels are scaled up to MIN_TEXT_PX on screen, applyCam)
    const cw = $("canvas").clientWidth || 800;
    return Math.min(1.6, Math.max(0.5, (cw - 4) / W));
  }

  function fit() {
    const k = initialZoom(state.size[0]);
    state.cam = { x: 0, y: 0, k };
    applyCam();
  }

  function applyCam() {
    const svg = $("graph"), c = state.cam;
    const cw = $("canvas").clientWidth || 800, ch = $("canvas").clientHeight || 600;
    svg.setAttribute("viewBox", `${c.x} ${c.y} ${cw / c.k} ${ch / c.k}`);
    // labels keep at least MIN_TEXT_PX on screen however far out one zooms
    const size = Math.max(LABEL_SIZE, MIN_TEXT_PX / c.k);
    svg.style.setProperty("--label-size", size + "px");
    fitLabels(size);
  }

  // step "label room": as many characters as rise no further than the row (see CHAR_EM)
  function fitLabels(size) {
    const rise = Math.sin((LABEL_ANGLE * Math.PI) / 180);
    const chars = Math.max(6, Math.min(LABEL_CHARS, Math.floor((state.rowH - 14) / rise / (CHAR_EM * size))));
    if (chars === state.labelChars) return;
    state.labelChars = chars;
    for (const [id, el] of state.labelEls) el.textContent = short(state.labelText.get(id), chars);
  }

  function zoomAt(factor, mx, my) {
    const c = state.cam, k = Math.min(K_MAX, Math.max(K_MIN, c.k * factor));
    const ux = c.x + mx / c.k, uy = c.y + my / c.k;
    state.cam = { x: ux - mx / k, y: uy - my / k, k };
    applyCam();
  }

  function shape(kind) {
    if (kind === "feature" || kind === "component") return s("circle", { class: "shape", r: 5 });
    if (kind === "supernode") return s("circle", { class: "shape", r: 8 });
    if (kind === "logit") return s("polygon", { class: "shape", points: "0,-7 7,0 0,7 -7,0" });
    if (kind === "embedding") return s("rect", { class: "shape", x: -5, y: -5, width: 10, height: 10, rx: 2 });
    return s("rect", { class: "shape", x: -4, y: -4, width: 8, height: 8 });
  }

  function nodeText(x) {
    if (x.kind === "logit") return x.token !== undefined ? JSON.stringify(x.token) : x.label;
    if (x.kind === "feature" || x.kind === "supernode" || x.kind === "component") return x.label;
    return null;
  }

  function nodeClass(x) {
    return x.kind + (x.site === "attn" ? " attn" : "") + (x.kind === "feature" && !x.labelled ? " unlabelled" : "");
  }

  function draw() {
    const data = state.data, svg = $("graph");
    svg.replaceChildren();
    svg.classList.remove("focus");
    const [W] = state.size, nRows = data.row_labels.length;
    applyCam();
    const axes = s("g", { class: "axes" });
    data.row_labels.forEach((label, row) => {
      const y = rowY(row, nRows);
      axes.append(s("line", { class: "row-line", x1: MARGIN_L, x2: W, y1: y, y2: y }));
      const t = s("text", { class: "row-label", x: 4, y: y + 3 });
      t.textContent = label;
      axes.append(t);
    });
    data.col_labels.forEach((label, c) => {  // the token axis: as large as the labels, never below MIN_TEXT_PX
      const x = state.cols.x0[c] + state.cols.width[c] / 2, y = MARGIN_T + nRows * state.rowH + 12;
      const t = s("text", { class: "col-label", x: x - 3, y, transform: `rotate(35 ${x - 3} ${y})`, "data-col": c });
      t.textContent = label.length > 14 ? label.slice(0, 13) + "…" : label;
      axes.append(t);
    });
    svg.append(axes);

    const pos = new Map(state.nodes.map((x) => [x.id, x.xy]));
    state.incoming = new Map(state.nodes.map((x) => [x.id, []]));
    state.outgoing = new Map(state.nodes.map((x) => [x.id, []]));
    let maxW = 1e-30;
    for (const e of state.edges) maxW = Math.max(maxW, Math.abs(e.w));
    const order = state.edges.map((e, i) => i).sort((a, b) => Math.abs(state.edges[a].w) - Math.abs(state.edges[b].w));
    const top = new Set(order.slice(-TOP_EDGES));  // drawn (thin) when not all edges are
    svg.classList.toggle("sparse", !state.allEdges);
    const edges = s("g", { class: "edges" });
    state.edgeEls = new Array(state.edges.length);
    for (const i of order) {
      const e = state.edges[i];
      const [sx, sy] = pos.get(e.src), [tx, ty] = pos.get(e.tgt);
      const r = Math.sqrt(Math.abs(e.w) / maxW), my = (sy + ty) / 2;
      const p = s("path", {
        class: "edge " + (e.w >= 0 ? "pos" : "neg") + (top.has(i) ? " top" : ""),
        d: `M${sx},${sy} C${sx},${my} ${tx},${my} ${tx},${ty}`,
        "stroke-width": (0.4 + 3.6 * r).toFixed(2),
        opacity: (0.12 + 0.78 * r).toFixed(2),
        "data-src": e.src, "data-tgt": e.tgt,
      });
      listenEdge(p, e);
      edges.append(p);
      state.edgeEls[i] = p;
      state.outgoing.get(e.src).push(i);
      state.incoming.get(e.tgt).push(i);
    }
    svg.append(edges, s("g", { class: "groups" }));

    const nodes = s("g", { class: "nodes" }), labels = s("g", { class: "labels" });
    state.nodeEls = new Map();
    state.labelEls = new Map();
    state.labelText = new Map();
    for (const item of state.nodes) {
      const x = item.node, [px, py] = item.xy;
      const g = s("g", { class: "node " + nodeClass(x), "data-id": item.id, transform: `translate(${px},${py})` });
      const title = s("title");
      title.textContent = x.name ? `${x.label} (${x.name})` : x.label;
      const sh = shape(x.kind);
      if (item.color) sh.style.stroke = item.color;
      g.append(sh, title);
      g.addEventListener("mouseenter", () => hover(item.id));
      g.addEventListener("mouseleave", () => hover(null));
      g.addEventListener("click", (ev) => {
        ev.stopPropagation();
        if (state.dragged) return;
        if (ev.shiftKey && typeof item.id === "number") togglePin(item.id);
        else select(state.selected === item.id ? null : item.id);
      });
      nodes.append(g);
      state.nodeEls.set(item.id, g);
      const text = nodeText(x);
      if (text) {
        const t = s("text", { class: "nlabel " + nodeClass(x), x: px + 5, y: py - 6, transform: `rotate(${-LABEL_ANGLE} ${px + 5} ${py - 6})`, "data-id": item.id });
        t.textContent = short(text, state.labelChars);
        labels.append(t);
        state.labelEls.set(item.id, t);
        state.labelText.set(item.id, text);
      }
    }
    svg.append(nodes, labels);
  }

  function edgeTip(e, ev) {
    const tip = $("edge-tip");
    if (!e) {
      tip.style.display = "none";
      return;
    }
    const name = (id) => nodeById(id).label;
    tip.textContent = `${name(e.src)} → ${name(e.tgt)}: ${fmt(e.w, 4)}${e.index < 0 ? " (summed)" : ""}`;
    const box = $("canvas").getBoundingClientRect();
    tip.style.left = `${(ev ? ev.clientX : box.left) - box.left + 12}px`;
    tip.style.top = `${(ev ? ev.clientY : box.top) - box.top + 12}px`;
    tip.style.display = "block";
  }

  function nodeById(id) {
    if (typeof id === "number") return state.data.nodes[id];
    const item = state.nodes.find((x) => x.id === id);
    return item ? item.node : { label: String(id), kind: "supernode" };
  }

  // ------------------------------------------------------------------ focus and details
  // An edge's path: its tooltip on hover, the edge panel on click.
  function listenEdge(p, e) {
    p.addEventListener("mouseover", (ev) => edgeTip(e, ev));
    p.addEventListener("mouseout", () => edgeTip(null));
    p.addEventListener("click", (ev) => {
      ev.stopPropagation();
      if (!state.dragged) selectEdge(e);
    });
  }

  function hover(id) {
    state.hovered = id;
    refreshFocus();
    if (state.selected === null && state.selectedEdge === null) showDetails(id);
  }

  function select(id) {
    markEdge(null);
    if (state.selected !== null && state.nodeEls.has(state.selected)) state.nodeEls.get(state.selected).classList.remove("selected");
    state.selected = id;
    if (id !== null && state.nodeEls.has(id)) state.nodeEls.get(id).classList.add("selected");
    refreshFocus();
    showDetails(id);
    writeHash();
  }

  function refreshFocus() {
    for (const el of state.highlighted) el.classList.remove("hl");
    state.highlighted = [];
    const id = state.hovered !== null ? state.hovered : state.selected;
    const svg = $("graph");
    svg.classList.toggle("focus", id !== null && state.nodeEls.has(id));
    if (id === null || !state.nodeEls.has(id)) return;
    const mark = (nid) => {
      for (const el of [state.nodeEls.get(nid), state.labelEls.get(nid)]) {
        if (el) {
          el.classList.add("hl");
          state.highlighted.push(el);
        }
      }
    };
    mark(id);
    for (const e of state.incoming.get(id)) {
      state.edgeEls[e].classList.add("hl");
      state.highlighted.push(state.edgeEls[e]);
      mark(state.edges[e].src);
    }
    for (const e of state.outgoing.get(id)) {
      state.edgeEls[e].classList.add("hl");
      state.highlighted.push(state.edgeEls[e]);
      mark(state.edges[e].tgt);
    }
  }

  function where(x) {
    const d = state.data;
    if (d.kind !== "graph" || x.kind === "supernode") return "";
    const layer = x.kind === "embedding" ? "emb" : x.kind === "logit" ? "logit" : `${x.site === "attn" ? "A" : "L"}${x.layer}`;
    return `${layer} @${x.position} ${JSON.stringify(d.prompt_tokens[x.position] ?? "")}`;
  }

  function showDetails(id) {
    const box = $("details");
    if (id === null || id === undefined || !state.nodeEls.has(id)) {
      box.replaceChildren(h("p", { class: "hint" }, HINT));
      return;
    }
    const d = state.data, n = nodeById(id);
    const kv = h("dl", { class: "kv" });
    const add = (k, v) => {
      if (v !== undefined && v !== null && v !== "") kv.append(h("dt", {}, k), h("dd", {}, v));
    };
    if (n.kind === "supernode") {
      const item = state.nodes.find((x) => x.id === id);
      add("supernode", `${item.members.length} nodes: ` + item.members.map((i) => d.nodes[i].label).join(", "));
    } else if (d.kind === "graph") {
      add("kind", n.kind);
      add("layer", n.kind === "embedding" ? "embeddings" : n.kind === "logit" ? "logits" : n.layer);
      add("position", `${n.position} ${JSON.stringify(d.prompt_tokens[n.position])}`);
      if (n.kind === "feature") add("feature", n.name || `${n.site === "attn" ? "A" : "L"}${n.layer}/F${n.feature}`);
      if (n.kind === "logit") add("probability", fmt(n.prob));
      add("activation", fmt(n.activation));
      add("influence", fmt(n.influence, 4));
      if (n.slider_influence !== undefined && d.slider_influence === "unpruned") add("influence (unpruned)", fmt(n.slider_influence, 4));
      if ("attribution" in n) add("attribution", fmt(n.attribution, 4));
      const sn = supernodeOf(n);
      if (sn) add("supernode", sn.name);
    } else {
      add("position", d.col_labels[n.col]);
    }
    const parts = [h("h3", { class: "node-label" }, n.label)];
    if (typeof id === "number") parts.push(h("button", { id: "pin-toggle", onclick: () => togglePin(id) }, state.pinned.has(id) ? "unpin" : "pin"));
    if (d.kind === "graph" && n.kind === "feature" && d.labels_editable && d.labels_editable[n.site === "attn" ? "attn" : "mlp"]) {
      parts.push(labelEditor(n));
    }
    parts.push(kv,
      edgeList("incoming", state.incoming.get(id), (e) => state.edges[e].src),
      edgeList("outgoing", state.outgoing.get(id), (e) => state.edges[e].tgt));
    box.replaceChildren(...parts);
    if (d.kind === "graph" && n.kind === "feature" && typeof id === "number" && id === state.selected) box.append(globalPanel(id));
    if (d.kind === "graph" && n.kind === "feature") box.append(dashboard(d.dashboards[`${n.site === "attn" ? "A" : ""}${n.layer}/${n.feature}`]));
  }

  // ------------------------------------------------------------------ step 4: the model panels
  // A panel's answer, fetched once per URL; fill(box, answer) runs if the box is still shown.
  function modelPanel(id, title, url, fill) {
    const box = h("div", { id, class: "model-panel" }, h("h3", {}, title));
    const status = h("p", { class: "hint panel-status" }, "loading…");
    box.append(status);
    if (EMBEDDED) {
      status.textContent = "computed by `attrgraph serve` with the graph's model; not in a saved page.";
      return box;
    }
    if (!state.panels.has(url)) {
      const p = getJSON(url);
      state.panels.set(url, p);
      p.catch(() => state.panels.delete(url));  // an error is not kept: a later click asks again
    }
    state.panels.get(url).then((r) => {
      if (!box.isConnected) return;
      status.remove();
      fill(box, r);
      box.classList.add("loaded");
    }, (e) => {
      status.textContent = e.message;
      status.className = "error panel-status";
    });
    return box;
  }

  function globalPanel(id) {
    const url = `api/global?graph=${encodeURIComponent(state.data.name)}&node=${id}`;
    return modelPanel("global-panel", "Global connections", url, (box, r) => {
      const co = r.coactivation;
      box.append(h("p", { class: "hint" }, `virtual weights through the residual stream (norm denominators: ${r.scales}); ` +
        (co.available ? `unused: the pair never fires together on one token of ${co.n_positions} corpus positions.` : co.note)));
      box.append(connectionList(`Output weights (top ${r.output.length})`, r.output, co.available, "gw-output"));
      box.append(connectionList(`Input weights (top ${r.input.length})`, r.input, co.available, "gw-input"));
      box.append(h("h4", {}, "Output logits (demeaned)"), tokenWeights(r.logits_top, "gw-logits-top"),
        h("h4", {}, "Most negative logits"), tokenWeights(r.logits_bottom, "gw-logits-bottom"));
    });
  }

  function connectionList(title, rows, marked, cls) {
    const ul = h("ul", { class: "edges-list " + cls });
    for (const c of rows) {
      const unused = marked && c.coactive === false;
      const li = h("li", { class: "gw-row" + (unused ? " unused" : ""), "data-name": c.name,
        title: marked ? `${c.name}: fires together on ${c.n_both} positions` : c.name },
        h("span", { class: "w " + (c.weight >= 0 ? "pos" : "neg") }, fmt(c.weight, 4)), c.name);
      const shown = state.data.nodes.find((x) => x.kind === "feature" && x.name === c.name);
      if (shown) li.append(h("span", { class: "where" }, short(shown.label, 30)));
      if (unused) li.append(h("span", { class: "tag" }, "unused"));
      ul.append(li);
    }
    if (!rows.length) ul.append(h("li", { class: "hint" }, "none: nothing reaches it through the residual stream"));
    return h("div", {}, h("h4", {}, title), ul);
  }

  function tokenWeights(rows, cls) {
    return h("div", { class: "logits " + cls }, rows.map((t) => h("span", { class: "tokw" }, `${JSON.stringify(t.token)} ${fmt(t.weight)}   `)));
  }

  function markEdge(e) {
    for (const el of document.querySelectorAll("path.edge.selected")) el.classList.remove("selected");
    state.selectedEdge = e;
    if (e) {
      const i = state.edges.indexOf(e);
      if (i >= 0 && state.edgeEls[i]) state.edgeEls[i].classList.add("selected");
    }
  }

  function selectEdge(e) {
    if (state.selected !== null && state.nodeEls.has(state.selected)) state.nodeEls.get(state.selected).classList.remove("selected");
    state.selected = null;
    markEdge(e);
    refreshFocus();
    writeHash();
    const d = state.data, src = nodeById(e.src), tgt = nodeById(e.tgt);
    const link = (id, n) => h("a", { href: "#", onclick: (ev) => { ev.preventDefault(); select(id); } }, n.label);
    const kv = h("dl", { class: "kv" },
      h("dt", {}, "from"), h("dd", {}, link(e.src, src), h("span", { class: "where" }, where(src))),
      h("dt", {}, "to"), h("dd", {}, link(e.tgt, tgt), h("span", { class: "where" }, where(tgt))),
      h("dt", {}, "weight"), h("dd", {}, fmt(e.w, 4) + (e.index < 0 ? " (summed)" : "")));
    const parts = [h("h3", { class: "edge-label" }, "Edge"), kv];
    if (d.kind !== "graph") parts.push(h("p", { class: "hint" }, "head loadings are computed for attribution-graph edges."));
    else if (e.index < 0 || typeof e.src !== "number") parts.push(h("p", { class: "hint" }, "a summed edge of collapsed supernodes: head loadings are listed for single edges."));
    else parts.push(headsPanel(e));
    $("details").replaceChildren(...parts);
  }

  function headsPanel(e) {
    const url = `api/heads?graph=${encodeURIComponent(state.data.name)}&source=${e.src}&target=${e.tgt}`;
    return modelPanel("heads-panel", "Heads", url, (box, r) => {
      box.append(h("p", { class: "hint" }, `the edge from the frozen forward ${fmt(r.edge, 5)} (stored ${fmt(r.adjacency, 5)}) is, ` +
        "in every layer, the sum of its heads' parts and the bypass (the paths around that layer's attention)."));
      const top = h("ol", { class: "heads-top" });
      for (const t of r.top_heads.filter((x) => x.loading !== 0)) {
        top.append(h("li", { class: "head-row" }, h("span", { class: "w " + (t.loading >= 0 ? "pos" : "neg") }, fmt(t.loading, 4)),
          `L${t.layer}.H${t.head}`, h("span", { class: "where" }, r.edge ? `${(100 * t.loading / r.edge).toFixed(1)}% of the edge` : "")));
      }
      const table = h("table", { class: "heads-table" },
        h("tr", {}, h("th", {}, "layer"), [...Array(r.n_heads).keys()].map((k) => h("th", {}, `H${k}`)), h("th", {}, "bypass")));
      for (const l of r.layers) {
        table.append(h("tr", { "data-layer": l.layer }, h("th", {}, `L${l.layer}`),
          l.heads.map((v) => h("td", { class: v > 0 ? "pos" : v < 0 ? "neg" : "zero", title: String(v) }, fmt(v, 3))),
          h("td", { class: "bypass", title: String(l.bypass) }, fmt(l.bypass, 3))));
      }
      box.append(h("h4", {}, "Strongest heads"), top, h("h4", {}, "Every head, per layer"), table);
    });
  }

  function labelEditor(n) {
    const input = h("input", { id: "label-edit", maxlength: "200", value: n.labelled ? n.label : "", placeholder: "label this feature" });
    const saveLabel = async () => {
      const body = JSON.stringify({
        graph: state.data.name,
        labels: [{ site: n.site === "attn" ? "attn" : "mlp", layer: n.layer, feature: n.feature, label: input.value }],
      });
      try {
        const r = await getJSON("api/labels", { method: "POST", headers: { "Content-Type": "application/json" }, body });
        const hs = readHash();
        await load(state.view, hs, true);
        say(`saved the label of ${n.name} to ${Object.values(r.files).join(", ")}.`, false, "label-status");
      } catch (e) {
        say(e.message, true, "label-status");
      }
    };
    input.addEventListener("keydown", (ev) => { if (ev.key === "Enter") saveLabel(); });
    return h("div", {}, h("div", { id: "label-editor" }, input, h("button", { id: "label-save", onclick: saveLabel }, "save label")),
      h("div", { id: "label-status", role: "status" }));
  }

  function edgeList(title, idx, other) {
    const w = (e) => Math.abs(state.edges[e].w);
    const sorted = idx.slice().sort((a, b) => w(b) - w(a));
    const ul = h("ul", { class: "edges-list" });
    for (const e of sorted.slice(0, N_EDGES_LISTED)) {
      const weight = state.edges[e].w, o = other(e), on = nodeById(o);
      const name = state.data.edge_labels && state.edges[e].index >= 0 ? state.data.edge_labels[state.edges[e].index] : on.label;
      ul.append(h("li", { onclick: () => select(o), title: name },
        h("span", { class: "w " + (weight >= 0 ? "pos" : "neg") }, fmt(weight, 4)), on.label,
        h("span", { class: "where" }, where(on))));
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
        style: { background: `rgba(255, 140, 0, ${a.toFixed(3)})` },
        title: fmt(ex.acts[i]),
      }, t), " ");
    });
    return div;
  }

  function logitList(pairs) {
    return h("div", { class: "logits" }, pairs.map(([t, v]) => h("span", {}, `${JSON.stringify(t)} ${fmt(v)}   `)));
  }

  // ------------------------------------------------------------------ search and the ranked list
  function search(q) {
    state.query = q;
    const svg = $("graph"), needle = q.trim().toLowerCase();
    const matches = [];
    for (const [id, el] of state.nodeEls) {
      const x = nodeById(id);
      const hit = needle !== "" && [x.label, x.name, x.token].some((t) => typeof t === "string" && t.toLowerCase().includes(needle));
      el.classList.toggle("match", hit);
      const lab = state.labelEls.get(id);
      if (lab) lab.classList.toggle("match", hit);
      if (hit) matches.push(id);
    }
    svg.classList.toggle("searching", needle !== "");
    $("search-count").textContent = needle ? `${matches.length} match${matches.length === 1 ? "" : "es"}` : "";
    state.matches = matches;
    $("search-results").replaceChildren(...(needle ? [h("li", { class: "hint" }, "Search results")] : []),
      ...matches.slice(0, N_SEARCH).map((id) => h("li", { onclick: () => select(id) }, nodeById(id).label,
        h("span", { class: "where" }, where(nodeById(id))))));
  }

  function renderRanked() {
    const d = state.data;
    if (d.kind !== "graph") return;
    const si = (x) => (x.slider_influence === undefined ? x.influence || 0 : x.slider_influence || 0);
    const feats = d.nodes.filter((x) => x.kind === "feature" && state.nodeEls.has(x.id));
    feats.sort((a, b) => si(b) - si(a) || a.id - b.id);
    $("ranked").replaceChildren(...feats.slice(0, N_RANKED).map((x) => h("li", { "data-id": x.id, onclick: () => select(x.id), title: `${x.label} (${x.name})` },
      h("span", { class: "w" }, fmt(si(x), 4)), x.label, h("span", { class: "where" }, `${x.name} @${x.position}`))));
  }

  // ------------------------------------------------------------------ pins and supernodes
  function togglePin(id) {
    if (state.pinned.has(id)) state.pinned.delete(id);
    else state.pinned.add(id);
    if (state.nodeEls.has(id)) state.nodeEls.get(id).classList.toggle("pinned", state.pinned.has(id));
    renderPins();
    if (state.selected === id || (state.selected === null && state.hovered === id)) showDetails(id);
    writeHash();
  }

  function renderPins() {
    $("pin-count").textContent = state.pinned.size;
    $("pin-list").replaceChildren(...[...state.pinned].map((id) => h("li", {},
      h("span", { onclick: () => select(id), title: state.data.nodes[id].label }, state.data.nodes[id].label),
      h("button", { onclick: () => togglePin(id), title: "unpin" }, "×"))));
    $("group").disabled = state.pinned.size === 0;
    applyOnlyPinned();
    drawPinnedPane();
  }

  function applyOnlyPinned() {
    const on = state.onlyPinned, svg = $("graph");
    svg.classList.toggle("only-pinned", on);
    if (!on || !state.data) return;
    for (const [id, el] of state.nodeEls) {
      el.classList.toggle("off", !state.pinned.has(id));
      const lab = state.labelEls.get(id);
      if (lab) lab.classList.toggle("off", !state.pinned.has(id));
    }
    state.edgeEls.forEach((el, i) => {
      const e = state.edges[i];
      el.classList.toggle("off", !(state.pinned.has(e.src) && state.pinned.has(e.tgt)));
    });
    svg.querySelectorAll("g.group").forEach((g) => {
      g.classList.toggle("off", !g.dataset.ids.split(",").some((id) => state.pinned.has(Number(id))));
    });
  }

  // the pinned nodes and the drawn edges between them, in their own pane (same relative layout)
  function drawPinnedPane() {
    const pane = $("pinned-pane"), svg = $("pinned-graph");
    const ids = [...state.pinned].filter((id) => state.nodeEls.has(id));
    pane.classList.toggle("on", ids.length > 0);
    svg.replaceChildren();
    if (!ids.length) return;
    const set = new Set(ids);
    const xs = ids.map((id) => state.xy[id][0]), ys = ids.map((id) => state.xy[id][1]);
    const x0 = Math.min(...xs) - 30, y0 = Math.min(...ys) - 60;
    svg.setAttribute("viewBox", `${x0} ${y0} ${Math.max(...xs) - x0 + 200} ${Math.max(...ys) - y0 + 30}`);
    svg.setAttribute("preserveAspectRatio", "xMidYMid meet");
    let maxW = 1e-30;
    const edges = state.edges.filter((e) => set.has(e.src) && set.has(e.tgt));
    edges.forEach((e) => { maxW = Math.max(maxW, Math.abs(e.w)); });
    const ge = s("g", {});
    for (const e of edges) {
      const [sx, sy] = state.xy[e.src], [tx, ty] = state.xy[e.tgt], my = (sy + ty) / 2, r = Math.sqrt(Math.abs(e.w) / maxW);
      const p = s("path", { class: "pedge " + (e.w >= 0 ? "pos" : "neg"), d: `M${sx},${sy} C${sx},${my} ${tx},${my} ${tx},${ty}`,
        "stroke-width": (0.6 + 3.4 * r).toFixed(2), opacity: (0.3 + 0.6 * r).toFixed(2) });
      listenEdge(p, e);
      ge.append(p);
    }
    const gn = s("g", {});
    for (const id of ids) {
      const x = state.data.nodes[id], [px, py] = state.xy[id];
      const g = s("g", { class: "pnode " + nodeClass(x), "data-id": id, transform: `translate(${px},${py})` });
      g.append(shape(x.kind));
      g.addEventListener("click", () => select(id));
      const t = s("text", { class: "nlabel", x: px + 7, y: py - 7, transform: `rotate(-30 ${px + 7} ${py - 7})` });
      t.textContent = short(x.label, 34);
      gn.append(g, t);
    }
    svg.append(ge, gn);
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
    for (const id of ids) if (state.nodeEls.has(id)) state.nodeEls.get(id).classList.remove("pinned");
    state.pinned.clear();
    $("group-name").value = "";
    say(`grouped ${ids.length} nodes into ${JSON.stringify(name)}; not saved yet.`);
    if (state.collapse) recompute();
    else {
      renderPins();
      renderSupernodes();
      showDetails(state.selected);  // its pin button said "unpin" for a node no longer pinned
      writeHash();
    }
  }

  function renderSupernodes() {
    const list = $("supernode-list");
    list.replaceChildren(...state.supernodes.map((sn, i) => {
      const shown = memberIds(sn).length, missing = sn.members.length - shown;
      return h("li", {},
        h("span", { class: "swatch", style: { background: sn.color } }),
        h("span", { class: "name", title: sn.name }, sn.name),
        `${sn.members.length} node${sn.members.length === 1 ? "" : "s"}` + (missing > 0 ? ` (${missing} not in this view)` : ""),
        h("button", {
          title: "remove", onclick: () => {
            state.supernodes.splice(i, 1);
            say(`removed ${JSON.stringify(sn.name)}; not saved yet.`);
            if (state.collapse) recompute();
            else renderSupernodes();
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
    for (const [id, el] of state.nodeEls) {
      if (typeof id !== "number") continue;
      el.classList.remove("member");
      el.querySelector(".shape").style.stroke = "";
    }
    for (const sn of state.supernodes) {
      const ids = memberIds(sn).filter((id) => state.nodeEls.has(id));
      if (!ids.length) continue;
      const xs = ids.map((id) => state.xy[id][0]), ys = ids.map((id) => state.xy[id][1]);
      const x = Math.min(...xs) - 10, y = Math.min(...ys) - 10;
      const g = s("g", { class: "group" });
      g.dataset.ids = ids.join(",");
      g.append(s("rect", { x, y, width: Math.max(...xs) + 10 - x, height: Math.max(...ys) + 10 - y, rx: 6, stroke: sn.color }));
      const t = s("text", { x, y: y + Math.max(...ys) - Math.min(...ys) + 34, fill: sn.color });
      t.textContent = sn.name;
      g.append(t);
      layer.append(g);
      for (const id of ids) {
        state.nodeEls.get(id).classList.add("member");
        state.nodeEls.get(id).querySelector(".shape").style.stroke = sn.color;
      }
    }
    applyOnlyPinned();
  }

  // a shared Neuronpedia link's supernodes and pins (POST api/view reads it against the stored graph)
  async function importView() {
    const d = state.data, link = $("view-link").value.trim();
    if (!link) return say("paste a Neuronpedia graph link first.", true);
    $("import-view").disabled = true;
    try {
      const r = await getJSON("api/view", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ graph: d.name, link }),
      });
      const replaced = state.supernodes.length;
      state.supernodes = r.supernodes.map((sn, i) => ({ name: sn.name, members: sn.members, color: PALETTE[i % PALETTE.length] }));
      for (const id of state.pinned) if (state.nodeEls.has(id)) state.nodeEls.get(id).classList.remove("pinned");
      state.pinned = new Set(r.pinned.flatMap((k) => state.keyIndex.get(keyStr(k)) || []));
      for (const id of state.pinned) if (state.nodeEls.has(id)) state.nodeEls.get(id).classList.add("pinned");
      const parts = [`imported ${r.supernodes.length} supernode${r.supernodes.length === 1 ? "" : "s"} and ${state.pinned.size} pin${state.pinned.size === 1 ? "" : "s"}`];
      if (replaced) parts.push(`replacing the ${replaced} shown`);
      if (r.left_out) parts.push(`${r.left_out} member${r.left_out === 1 ? "" : "s"} not in this graph left out`);
      if (r.emptied.length) parts.push(`${r.emptied.map((n) => JSON.stringify(n)).join(", ")} left without members`);
      say(parts.join("; ") + "; not saved yet.");
      $("view-link").value = "";
      if (state.collapse) recompute();
      else {
        renderPins();
        renderSupernodes();
        writeHash();
      }
    } catch (e) {
      say(e.message, true);
    } finally {
      $("import-view").disabled = false;
    }
  }

  // the shown supernodes and pins as a Neuronpedia link (POST api/link: graph/shared_view.py view_link)
  async function makeLink() {
    const d = state.data, model = $("np-model").value.trim(), slug = $("np-slug").value.trim();
    if (!model || !slug) return say("fill in Neuronpedia's model id and the graph's slug there first.", true);
    const pinned = [...state.pinned].filter((id) => typeof id === "number").map((id) => d.nodes[id].key);
    $("make-link").disabled = true;
    try {
      const r = await getJSON("api/link", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({
          graph: d.name, supernodes: state.supernodes.map((sn) => ({ name: sn.name, members: sn.members })),
          pinned, model, slug,
        }),
      });
      $("np-link").value = r.link;
      $("np-link").select();
      let copied = false;
      try {
        await navigator.clipboard.writeText(r.link);
        copied = true;
      } catch (e) { /* no clipboard here (a page not on localhost, or no permission): the field holds it */ }
      say(`a link with ${state.supernodes.length} supernode${state.supernodes.length === 1 ? "" : "s"} and `
        + `${pinned.length} pin${pinned.length === 1 ? "" : "s"}${copied ? ", copied" : ""}: it opens on Neuronpedia's page of ${slug}.`);
    } catch (e) {
      say(e.message, true);
    } finally {
      $("make-link").disabled = false;
    }
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

  // ------------------------------------------------------------------ controls
  function wireControls() {
    const slider = (id, key) => $(id).addEventListener("input", () => {
      state[key] = Number($(id).value);
      $(id + "-value").textContent = state[key].toFixed(2);
      recompute();
    });
    slider("node-threshold", "nt");
    slider("edge-threshold", "et");
    $("prune-rule").addEventListener("change", () => { state.rule = $("prune-rule").value; recompute(); });
    $("show-errors").addEventListener("change", () => { state.showErrors = $("show-errors").checked; recompute(); });
    $("collapse").addEventListener("change", () => { state.collapse = $("collapse").checked; recompute(); });
    $("only-pinned").addEventListener("change", () => { state.onlyPinned = $("only-pinned").checked; applyOnlyPinned(); writeHash(); });
    $("all-edges").addEventListener("change", () => {
      state.allEdges = $("all-edges").checked;
      $("graph").classList.toggle("sparse", !state.allEdges);
      writeHash();
    });
    $("search").addEventListener("input", () => { search($("search").value); writeHash(); });
    $("search").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && state.matches && state.matches.length) select(state.matches[0]);
    });
    $("pin-clear").addEventListener("click", () => {
      for (const id of state.pinned) if (state.nodeEls.has(id)) state.nodeEls.get(id).classList.remove("pinned");
      state.pinned.clear();
      renderPins();
      showDetails(state.selected);
      writeHash();
    });
    $("group").addEventListener("click", group);
    $("save").addEventListener("click", save);
    $("import-view").addEventListener("click", importView);
    $("make-link").addEventListener("click", makeLink);
    const centre = () => [($("canvas").clientWidth || 800) / 2, ($("canvas").clientHeight || 600) / 2];
    $("zoom-in").addEventListener("click", () => zoomAt(1.25, ...centre()));
    $("zoom-out").addEventListener("click", () => zoomAt(1 / 1.25, ...centre()));
    $("zoom-fit").addEventListener("click", fit);
    const svg = $("graph");
    svg.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const box = svg.getBoundingClientRect();
      zoomAt(Math.exp(-ev.deltaY * 0.0015), ev.clientX - box.left, ev.clientY - box.top);
    }, { passive: false });
    let drag = null;
    svg.addEventListener("mousedown", (ev) => {
      if (ev.button !== 0) return;
      drag = { x: ev.clientX, y: ev.clientY, cam: Object.assign({}, state.cam) };
      state.dragged = false;
    });
    window.addEventListener("mousemove", (ev) => {
      if (!drag) return;
      const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) {
        state.dragged = true;
        svg.classList.add("dragging");
      }
      if (state.dragged) {
        state.cam = { x: drag.cam.x - dx / drag.cam.k, y: drag.cam.y - dy / drag.cam.k, k: drag.cam.k };
        applyCam();
      }
    });
    window.addEventListener("mouseup", () => {
      drag = null;
      svg.classList.remove("dragging");
      setTimeout(() => { state.dragged = false; }, 0);
    });
    svg.addEventListener("click", () => { if (!state.dragged) select(null); });
    state.selectEdge = (src, tgt) => {  // for tests and the console
      const e = state.edges.find((x) => x.src === src && x.tgt === tgt);
      if (e) selectEdge(e);
      return !!e;
    };
    window.addEventListener("resize", () => { if (state.data) applyCam(); });
  }

  window.attrgraphViewer = state;  // for tests and the console: the view's state, read-only by convention
  init();
})();
