// evdb dashboard, the Sizing view: sends a key trace the operator picks to the server, which
// runs `evdb size` on it, and draws the answer. Loaded before dashboard.js, whose globals
// (state, el, chart, num, pct, bytes, getJSON, COLORS) it uses when called.
"use strict";

// -- sizing -----------------------------------------------------------------------------------

// Send the picked trace file to the server, which runs `evdb size` on it; keep the answer per
// table (switching tables shows each one's last analysis).
async function analyseTrace(ev) {
  ev.preventDefault();
  const file = document.getElementById("sizing-file").files[0];
  const name = state.table;
  const status = document.getElementById("sizing-status");
  const err = document.getElementById("sizing-error");
  err.hidden = true;
  if (!file) return;
  const incomplete = document.getElementById("sizing-incomplete").checked;
  status.textContent = `analysing ${file.name} (${bytes(file.size)}) of ${name}…`;
  const button = document.querySelector("#sizing-form button");
  button.disabled = true;
  try {
    const url = `/v1/dashboard/tables/${encodeURIComponent(name)}/sizing` +
      (incomplete ? "?allow_incomplete=true" : "");
    state.sizing[name] = await getJSON(url, {
      method: "POST", headers: { "content-type": "application/octet-stream" }, body: file });
    status.textContent = `${file.name}: analysed in ${state.sizing[name].seconds.toFixed(1)} s`;
    drawSizing();
  } catch (e) {
    status.textContent = "";
    err.textContent = e.message;
    err.hidden = false;
  } finally {
    button.disabled = false;
  }
}

function drawSizing() {
  const s = state.sizing[state.table];
  const box = document.getElementById("sizing-result");
  box.hidden = !s;
  if (!s) return;
  const r = s.report;
  box.dataset.sha256 = s.trace.sha256;
  box.dataset.table = s.table;
  const rows = r.current_dram_rows;
  const item = (field, label, value) =>
    el("span", { "data-field": field }, `${label} `, el("b", { text: value }));
  const now = (r.current_hit_rate || {}).dram;
  document.getElementById("sizing-facts").replaceChildren(
    item("rate", "sampled at", `${(100 * s.trace.rate).toPrecision(3)}%`),
    item("accesses", "accesses", `${num(r.estimated_accesses)} (${num(r.sampled_accesses)} sampled)`),
    item("distinct", "distinct keys", `${num(r.estimated_distinct_keys)} (${num(r.sampled_distinct_keys)} sampled)`),
    item("current", "dram_rows now", rows === null ? "no limit" : num(rows)),
    item("now", "hit rate now", pct(now)),
    ...(s.config_matches ? [] : [item("config", "configuration",
      "differs from the served table's: the curves are of the trace's")]),
    ...(s.trace.complete ? [] : [item("complete", "trace", "incomplete (its complete chunks)")]));
  const body = document.querySelector("#sizing-targets tbody");
  body.replaceChildren(...Object.entries(r.targets).map(([t, v]) =>
    el("tr", { "data-target": t }, el("td", { text: `${(100 * Number(t)).toFixed(0)}%` }),
       el("td", { text: v.evdb_rows === null ? "not reached" : num(v.evdb_rows) }),
       el("td", { text: v.lru_rows === null ? "not reached" : num(v.lru_rows) }))));
  document.getElementById("sizing-warnings").replaceChildren(
    ...r.warnings.map((w) => el("li", { text: w })));
  document.getElementById("sizing-caption").textContent =
    `${num(r.curve.length)} sizes simulated of ${s.table}`;
  // one x for every series (uPlot's data): the LRU curve's sizes and the simulated ones
  const lru = new Map(s.lru_points.rows.map((x, i) => [x, s.lru_points.hit_rate[i]]));
  const sure = new Map(), unsure = new Map();
  for (const c of r.curve) {
    lru.set(c.dram_rows, c.lru_hit_rate);
    (c.reliable ? sure : unsure).set(c.dram_rows, c.evdb_hit_rate);
  }
  const xs = [...lru.keys()].filter((x) => x > 0).sort((a, b) => a - b);
  const at = (m) => xs.map((x) => (m.has(x) ? m.get(x) : null));
  const chartBox = document.getElementById("chart-sizing");
  chartBox.dataset.points = JSON.stringify(r.curve.map((c) => [c.dram_rows, c.evdb_hit_rate]));
  const dots = (color, fill) => ({ stroke: color, fill, width: 0, paths: () => null,
                                   points: { show: true, size: 7, stroke: color, fill } });
  chart("sizing", chartBox, {
    series: [{ label: "rows" },
             { label: "LRU (exact)", stroke: "#9ca3af", width: 1.5, spanGaps: true,
               points: { show: false } },
             { label: "evdb policy", ...dots(COLORS[0], COLORS[0]) },
             { label: "evdb, small miniature", ...dots(COLORS[0], "#fff") }],
    scales: { x: { time: false, distr: 3 }, y: { range: [0, 1] } },
    axes: [{ label: "DRAM rows" }, { label: "hit rate", size: 56 }],
    legend: { live: false },
    hooks: { draw: [(u) => markRows(u, rows)] },
  }, [xs, at(lru), at(sure), at(unsure)]);
}

function markRows(u, rows) {
  if (rows === null || rows === undefined) return;
  const x = u.valToPos(rows, "x", true);
  const ctx = u.ctx;
  ctx.save();
  ctx.strokeStyle = "#111827";
  ctx.setLineDash([6, 4]);
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  ctx.moveTo(x, u.bbox.top);
  ctx.lineTo(x, u.bbox.top + u.bbox.height);
  ctx.stroke();
  ctx.restore();
}
