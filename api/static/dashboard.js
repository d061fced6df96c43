// evdb dashboard: fetches /v1/dashboard/* and draws it with uPlot (vendored beside this file).
// No build step, no framework, nothing from another origin. Names from the server (tables,
// keys, strings) only ever go into textContent, never into HTML.
"use strict";

const state = { summary: null, series: null, table: null, view: "overview", charts: {},
                projection: null, highlight: new Set(), sizing: {} };
const COLORS = ["#3b82f6", "#f59e0b", "#ef4444", "#10b981", "#8b5cf6"];
const VIEWS = ["overview", "distributions", "projector", "sizing"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v;
    else if (k === "cls") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

async function getJSON(url, options) {
  const r = await fetch(url, options);
  const body = await r.json();
  if (!r.ok) throw new Error(body.detail || `${url}: HTTP ${r.status}`);
  return body;
}

const num = (x) => (x === null || x === undefined ? "–" : Number(x).toLocaleString("en-US"));
function bytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 120) return `${s.toFixed(0)} s`;
  if (s < 7200) return `${(s / 60).toFixed(0)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

function showError(err) {
  const p = document.getElementById("error");
  p.textContent = String(err.message || err);
  p.hidden = false;
}

// -- status strip and per-table cards ------------------------------------------------------

function renderStatus(s) {
  const strip = document.getElementById("status");
  const item = (field, label, value) => {
    const span = el("span", { "data-field": field }, `${label} `, el("b", { text: value }));
    return span;
  };
  const items = s.publish_root
    ? [item("root", "publish root", s.publish_root), item("seq", "seq", num(s.seq))]
    : [item("path", "snapshot", s.path), item("version", "version", s.version)];
  strip.replaceChildren(
    ...items,
    item("step", "step", num(s.step)),
    item("staleness", "staleness", seconds(s.staleness_s)),
    item("loaded", "loaded", `${seconds(s.loaded_s)} ago`),
    item("uptime", "uptime", seconds(s.uptime_s)),
    item("workers", "workers", num(s.workers)),
    item("reloads", "reloads", num(s.reloads)),
  );
}

const pct = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`);

// A cache tier's hit rates (of the keys asked of it, lookups and pulls apart), or nothing.
function hitText(rates) {
  if (!rates) return "";
  return ` · hit rate: lookups ${pct(rates.lookup)}, pulls ${pct(rates.pull)}`;
}

function tierRow(t, rates) {
  const bar = el("div", { cls: "bar" }, el("div"));
  let text;
  if (t.capacity) {
    const pct = Math.min(100, 100 * t.fill);
    bar.firstChild.style.width = `${pct.toFixed(1)}%`;  // CSSOM, which the CSP allows
    if (t.fill >= 0.95) bar.classList.add("full");
    else if (t.fill >= 0.8) bar.classList.add("warn");
    text = `${num(t.rows)} / ${num(t.capacity)} rows (${pct.toFixed(1)}%) · ${bytes(t.bytes)}`;
  } else if (t.name === "overlay") {  // following a root: the deltas since the full, in memory
    bar.classList.add("unbounded");
    text = `${num(t.rows)} rows and removals since full seq ${num(state.summary.server.full_seq)}` +
      ` · ${bytes(t.bytes)}`;
  } else {
    bar.classList.add("unbounded");
    text = `${num(t.rows)} rows · ${bytes(t.bytes)} · no row limit`;
  }
  const span = el("span", { cls: "tier-text", "data-tier": t.name, text: text + hitText(rates) });
  if (rates) span.dataset.hitRate = JSON.stringify(rates);
  return [el("b", { text: t.name }), bar, span];
}

// Bytes a row by component of each tier that says (Table.stats()'s
// bytes_per_row_by_component): what a row costs in each tier, and what of it is the values.
function rowBytes(t) {
  const out = [];
  const dec = (x) => Number(x).toLocaleString("en-US", { maximumFractionDigits: 1 });
  for (const [tier, level] of Object.entries(t.stats.tiers || {})) {
    const parts = level.bytes_per_row_by_component;
    if (!parts || !level.rows) continue;  // no rows: the index's bytes over none say nothing
    const total = Object.values(parts).reduce((a, b) => a + b, 0);
    const span = el("span", { "data-tier": tier }, `${tier}: `, el("b", { text: `${dec(total)} B a row` }),
      " = " + Object.entries(parts).map(([k, v]) => `${k} ${dec(v)}`).join(" + "));
    span.dataset.components = JSON.stringify(parts);
    out.push(span);
  }
  return out.length ? [el("span", { cls: "label", text: "bytes a row" }), ...out] : [];
}

function tableCard(t) {
  const card = el("section", { cls: "card", "data-table": t.name });
  const facts = el("div", { cls: "facts" },
    el("span", {}, "rows ", el("b", { "data-stat": "rows", text: num(t.rows) })),
    el("span", {}, "dim ", el("b", { "data-stat": "dim", text: String(t.dim) })),
    el("span", {}, "keys ", el("b", { "data-stat": "key_type", text: t.key_type })),
    el("span", {}, "TTL ", el("b", { "data-stat": "ttl_steps",
       text: t.ttl_steps === null ? "none" : `${num(t.ttl_steps)} steps` })));
  // No admission policy or optimizer: a server reads a snapshot, it never pulls or pushes.
  const tiers = el("div", { cls: "tiers" });
  for (const tier of t.tiers) tiers.append(...tierRow(tier, (t.hit_rates || {})[tier.name]));
  const counters = el("div", { cls: "counters", "data-counters": t.name });
  const charts = el("div", { cls: "grid" });
  for (const [id, title] of [["hits", "DRAM hit rate and missing-key rate"],
                             ["rate", "Lookups per second"],
                             ["latency", "Lookup latency, ms (p50, p95, p99)"]]) {
    charts.append(el("figure", { cls: "panel" }, el("figcaption", { text: title }),
                     el("div", { cls: "chart", id: `chart-${id}-${t.name}` })));
  }
  card.append(el("h2", { text: t.name }), facts, tiers,
              el("div", { cls: "row-bytes", "data-row-bytes": t.name }, ...rowBytes(t)),
              counters, charts);
  return card;
}

function renderOverview() {
  const view = document.getElementById("view-overview");
  view.replaceChildren(...state.summary.tables.map(tableCard));
  for (const key of Object.keys(state.charts)) {
    if (key.startsWith("ov:")) { state.charts[key].destroy(); delete state.charts[key]; }
  }
  drawSeries();
}

// -- charts ---------------------------------------------------------------------------------

function chart(key, container, opts, data) {
  const old = state.charts[key];
  if (old && old.root.isConnected) { old.setData(data); return old; }
  if (old) old.destroy();
  const width = Math.max(300, container.clientWidth || 400);
  const plot = new uPlot({ width, height: 200, ...opts }, data, container);
  state.charts[key] = plot;
  return plot;
}

function timeOpts(series, yRange) {
  return {
    series: [{}, ...series.map((s, i) => ({ label: s, stroke: COLORS[i], width: 1.5,
                                             spanGaps: false, points: { show: true, size: 4 } }))],
    // at least a minute wide: one sample alone would otherwise span years
    scales: { x: { time: true, range: (u, min, max) => [Math.min(min, max - 60), max] },
              y: yRange ? { range: yRange } : { auto: true } },
    axes: [{}, { size: 56 }],
    legend: { live: false },
  };
}

function drawSeries() {
  const s = state.series;
  if (!s || !state.summary) return;
  for (const t of state.summary.tables) {
    const col = s.tables[t.name];
    if (!col) continue;
    const x = s.t;
    const hits = document.getElementById(`chart-hits-${t.name}`);
    if (!hits) continue;
    chart(`ov:hits:${t.name}`, hits, timeOpts(["DRAM hit rate", "missing-key rate"], [0, 1]),
          [x, col.hit_rate, col.missing_rate]);
    const rate = document.getElementById(`chart-rate-${t.name}`);
    chart(`ov:rate:${t.name}`, rate, timeOpts(["lookups/s"]), [x, col.lookup_rate]);
    // What the browser test reads: the cumulative lookups the series ends at.
    rate.dataset.lookups = String(col.lookups.length ? col.lookups[col.lookups.length - 1] : 0);
    const lat = document.getElementById(`chart-latency-${t.name}`);
    chart(`ov:lat:${t.name}`, lat, timeOpts(["p50", "p95", "p99"]),
          [x, col.p50_ms, col.p95_ms, col.p99_ms]);
    const box = document.querySelector(`[data-counters="${CSS.escape(t.name)}"]`);
    const last = (a) => (a.length ? a[a.length - 1] : 0);
    // this server's own, since it first read the table (not the writer's left in a snapshot)
    box.replaceChildren(...[["evictions", "evictions"], ["promotions", "promotions"]]
      .map(([c, label]) => el("span", { "data-counter": c }, `${label} `,
        el("b", { text: num(last(col[c])) }), ` (${last(col[`${c}_rate`]).toFixed(2)}/s)`)));
  }
}

// The figures of the version the strip shows: a table's figures name the snapshot they are
// of, and one of a newer snapshot (the follower swapped in between) first brings the strip
// and the overview to it, so that every figure on the page is of one version.
async function sameVersion(url) {
  let body = await getJSON(url);
  for (let i = 0; i < 3 && body.version !== state.summary.server.version; i++) {
    await refresh();
    if (body.version !== state.summary.server.version) body = await getJSON(url);
  }
  return body;
}

async function drawDistributions() {
  const name = state.table;
  const d = await sameVersion(`/v1/dashboard/tables/${encodeURIComponent(name)}/distributions`);
  if (name !== state.table) return;
  document.getElementById("view-distributions").dataset.version = d.version;
  const f = d.frequency;
  const slope = document.getElementById("slope");
  slope.textContent = f.slope === null ? "" : `fitted slope ${f.slope.toFixed(3)}`;
  slope.dataset.slope = f.slope === null ? "" : String(f.slope);
  document.getElementById("frequency-note").textContent = d.counted
    ? `${num(d.sample_rows)} rows sampled of ${num(d.rows)}; slope fitted over ranks ` +
      `${num(f.fit[0])}–${num(f.fit[1])} (counts of 5 or more)`
    : `${num(d.sample_rows)} rows sampled of ${num(d.rows)}. ${d.frequency_note}`;
  const freqBox = document.getElementById("chart-frequency");
  freqBox.hidden = !d.counted;  // no empty axes: nothing is drawn without this version's counts
  if (!d.counted && state.charts["dist:freq"]) {
    state.charts["dist:freq"].destroy();
    delete state.charts["dist:freq"];
  }
  const ranks = f.rank.length ? f.rank : [1];
  if (d.counted) chart("dist:freq", freqBox, {
    series: [{ label: "rank" }, { label: "pulls", stroke: COLORS[0], width: 1.5,
                                  points: { show: true, size: 4 } }],
    scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
    axes: [{ label: "rank" }, { label: "pulls", size: 60 }],
    legend: { live: false },
  }, [ranks, f.freq.length ? f.freq : [null]]);

  const a = d.age;
  const centres = a.counts.map((_, i) => (a.edges[i] + a.edges[i + 1]) / 2);
  const ageBox = document.getElementById("chart-age");
  ageBox.dataset.counts = JSON.stringify(a.counts);
  document.getElementById("ttl").textContent = a.ttl_steps === null
    ? "(no TTL)" : `(TTL ${num(a.ttl_steps)} steps, marked)`;
  document.getElementById("age-note").textContent = a.shown
    ? `step ${num(a.step)}; ${a.counts.length} buckets of ${(a.edges[1] - a.edges[0]).toFixed(1)} steps`
    : a.note;
  ageBox.hidden = !a.shown;
  if (!a.shown && state.charts["dist:age"]) {
    state.charts["dist:age"].destroy();
    delete state.charts["dist:age"];
  }
  if (a.shown) chart("dist:age", ageBox, {
    series: [{ label: "age" }, { label: "rows", fill: "rgba(59,130,246,0.5)", stroke: COLORS[0],
                                 paths: uPlot.paths.bars({ size: [0.9] }), points: { show: false } }],
    scales: { x: { time: false, range: [a.edges[0], a.edges[a.edges.length - 1]] },
              y: { range: (u, min, max) => [0, Math.max(1, max) * 1.1] } },
    axes: [{ label: "age (steps)" }, { label: "rows", size: 60 }],
    legend: { live: false },
    hooks: { draw: [(u) => markTTL(u, a.ttl_steps)] },
  }, [centres, a.counts]);
}

function markTTL(u, ttl) {
  if (ttl === null) return;
  const x = u.valToPos(ttl, "x", true);
  const ctx = u.ctx;
  ctx.save();
  ctx.strokeStyle = COLORS[2];
  ctx.setLineDash([6, 4]);
  ctx.lineWidth = 2;
  ctx.beginPath();
  ctx.moveTo(x - 1, u.bbox.top);
  ctx.lineTo(x - 1, u.bbox.top + u.bbox.height);
  ctx.stroke();
  ctx.restore();
}

// -- projector ------------------------------------------------------------------------------

async function drawProjection() {
  const name = state.table;
  const p = await sameVersion(`/v1/dashboard/tables/${encodeURIComponent(name)}/projection`);
  if (name !== state.table) return;
  state.projection = p;
  document.getElementById("explained").textContent = `${num(p.x.length)} rows; axes explain ` +
    `${(100 * p.explained[0]).toFixed(1)}% and ${(100 * p.explained[1]).toFixed(1)}% of the variance`;
  paintProjection();
}

function projectionFrame(canvas, p) {
  const w = canvas.width, h = canvas.height, pad = 16 * devicePixelRatio;
  const span = (v) => { const lo = Math.min(...v), hi = Math.max(...v); return [lo, hi - lo || 1]; };
  const [x0, xs] = span(p.x.length ? p.x : [0]);
  const [y0, ys] = span(p.y.length ? p.y : [0]);
  return (i) => [pad + ((p.x[i] - x0) / xs) * (w - 2 * pad),
                 h - pad - ((p.y[i] - y0) / ys) * (h - 2 * pad)];
}

function paintProjection() {
  const canvas = document.getElementById("projection");
  const p = state.projection;
  if (!p) return;
  canvas.width = canvas.clientWidth * devicePixelRatio;
  canvas.height = canvas.clientHeight * devicePixelRatio;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const at = projectionFrame(canvas, p);
  const r = 2.2 * devicePixelRatio;
  const marked = [];
  ctx.fillStyle = "rgba(59,130,246,0.55)";
  for (let i = 0; i < p.x.length; i++) {
    if (state.highlight.has(p.labels[i])) { marked.push(i); continue; }
    const [x, y] = at(i);
    ctx.fillRect(x - r, y - r, 2 * r, 2 * r);
  }
  ctx.fillStyle = COLORS[2];
  ctx.font = `${12 * devicePixelRatio}px system-ui, sans-serif`;
  for (const i of marked) {
    const [x, y] = at(i);
    ctx.beginPath();
    ctx.arc(x, y, 2 * r, 0, 2 * Math.PI);
    ctx.fill();
    ctx.fillText(p.labels[i], x + 3 * r, y - r);
  }
}

function hoverProjection(ev) {
  const canvas = ev.target, tip = document.getElementById("hover"), p = state.projection;
  if (!p || !p.x.length) return;
  const rect = canvas.getBoundingClientRect();
  const mx = (ev.clientX - rect.left) * devicePixelRatio;
  const my = (ev.clientY - rect.top) * devicePixelRatio;
  const at = projectionFrame(canvas, p);
  let best = -1, dist = Infinity;
  for (let i = 0; i < p.x.length; i++) {
    const [x, y] = at(i);
    const d = (x - mx) ** 2 + (y - my) ** 2;
    if (d < dist) { dist = d; best = i; }
  }
  if (best < 0 || dist > (12 * devicePixelRatio) ** 2) { tip.hidden = true; return; }
  tip.textContent = p.labels[best];
  tip.style.left = `${ev.clientX - rect.left + 12}px`;
  tip.style.top = `${ev.clientY - rect.top + 12}px`;
  tip.hidden = false;
}

// The integers of a JSON array field as exact decimal strings (the server writes compact JSON).
function int64Field(text, field) {
  const m = text.match(new RegExp(`"${field}":\\[([-0-9,]*)\\]`));
  return m && m[1] ? m[1].split(",") : [];
}

async function findNeighbours(ev) {
  ev.preventDefault();
  const raw = document.getElementById("nn-key").value.trim();
  const metric = document.getElementById("nn-metric").value;
  const table = state.summary.tables.find((t) => t.name === state.table);
  const err = document.getElementById("nn-error");
  err.hidden = true;
  // int64 keys travel as JSON text, never through a JS number (exact only up to 2^53)
  let key = JSON.stringify(raw);
  if (table.key_type === "int64") {
    if (!/^-?\d{1,19}$/.test(raw)) {
      err.textContent = "key: an integer";
      err.hidden = false;
      return;
    }
    key = raw;
  }
  const list = document.getElementById("nn-list");
  try {
    const r = await fetch(`/v1/tables/${encodeURIComponent(state.table)}/neighbors`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: `{"key": ${key}, "k": 10, "metric": ${JSON.stringify(metric)}}`,
    });
    const text = await r.text();
    const body = JSON.parse(text);
    if (!r.ok) throw new Error(body.detail || `HTTP ${r.status}`);
    const keys = int64Field(text, "keys");
    const names = body.strings ? body.strings.map((s, i) => s ?? keys[i]) : keys;
    list.replaceChildren(...names.map((n, i) => el("li", { "data-key": keys[i] },
      n, el("span", { text: body.scores[i].toFixed(4) }))));
    list.dataset.query = raw;
    state.highlight = new Set([...names, raw]);
    paintProjection();
  } catch (e) {
    err.textContent = e.message;
    err.hidden = false;
  }
}

// -- views and refresh ----------------------------------------------------------------------

async function showView() {
  const view = (location.hash || "#overview").slice(1);
  state.view = VIEWS.includes(view) ? view : "overview";
  for (const v of VIEWS) {
    document.getElementById(`view-${v}`).hidden = v !== state.view;
  }
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.view === state.view);
  }
  document.querySelector("header .picker").hidden = state.view === "overview";
  try {
    if (state.view === "distributions") await drawDistributions();
    if (state.view === "projector") await drawProjection();
    if (state.view === "sizing") drawSizing();
  } catch (e) { showError(e); }
}

async function refresh() {
  try {
    const [summary, series] = await Promise.all([getJSON("/v1/dashboard/summary"),
                                                 getJSON("/v1/dashboard/series")]);
    const first = state.summary === null;
    const names = (x) => x.tables.map((t) => t.name).join("\n");
    const changed = first || names(summary) !== names(state.summary);
    state.summary = summary;
    state.series = series;
    renderStatus(summary.server);
    if (changed) {
      const select = document.getElementById("table");
      select.replaceChildren(...summary.tables.map((t) => el("option", { value: t.name, text: t.name })));
      if (!summary.tables.some((t) => t.name === state.table) && summary.tables.length) {
        state.table = summary.tables[0].name;
      }
      select.value = state.table;
      renderOverview();
    } else {
      for (const t of summary.tables) {  // the figures that move between refreshes
        const card = document.querySelector(`[data-table="${CSS.escape(t.name)}"]`);
        card.querySelector('[data-stat="rows"]').textContent = num(t.rows);
        const tiers = card.querySelector(".tiers");
        tiers.replaceChildren(...t.tiers.flatMap((x) => tierRow(x, (t.hit_rates || {})[x.name])));
        card.querySelector(".row-bytes").replaceChildren(...rowBytes(t));
      }
      drawSeries();
    }
    document.getElementById("error").hidden = true;
    return summary.server.sample_interval_s;
  } catch (e) {
    showError(e);
    return 5;
  }
}

async function loop() {
  const interval = await refresh();
  if (!document.body.dataset.ready) {  // the first answer: now the chosen view can draw
    await showView();
    document.body.dataset.ready = "1";
  }
  setTimeout(loop, Math.max(1, interval) * 1000);
}

window.addEventListener("hashchange", showView);
window.addEventListener("resize", () => { if (state.view === "projector") paintProjection(); });
document.getElementById("table").addEventListener("change", (ev) => {
  state.table = ev.target.value;
  state.highlight = new Set();
  document.getElementById("nn-list").replaceChildren();
  showView();
});
document.getElementById("projection").addEventListener("mousemove", hoverProjection);
document.getElementById("projection").addEventListener("mouseleave",
  () => { document.getElementById("hover").hidden = true; });
document.getElementById("nn-form").addEventListener("submit", findNeighbours);
document.getElementById("sizing-form").addEventListener("submit", analyseTrace);
state.table = new URLSearchParams(location.search).get("table");
loop();
