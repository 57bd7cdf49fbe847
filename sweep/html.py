"""Self-contained HTML pages: the matrix (``matrix.html``) and the static shell used by ``compare.html``.

One file, no network: CSS and JavaScript are inline and the matrix travels as JSON in a ``<script
type="application/json">`` element (with ``<`` escaped, so no error message can close the tag). The page shows
the counts per backend and status, then the model classes x columns heat map (built as one HTML string, so
thousands of classes render at once; columns sort on a header click), filters by name, status and category, a
detail panel for the clicked cell, and below it the failure categories (folded when long) and the version table
with drift flagged.
"""

from __future__ import annotations

import html
import json
from typing import Any

from sweep.results import dumps_strict

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d232a;background:#fafbfc}
header{padding:12px 20px;background:#24292f;color:#fff}header h1{margin:0;font-size:20px}
main{padding:12px 20px}h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse}td,th{border:1px solid #d0d7de;padding:3px 7px;text-align:left}
th{background:#f0f3f6}td.num{text-align:right}.muted{color:#667}
.banner{padding:8px 12px;margin:10px 0;border-radius:6px}.banner.drift{background:#fff1c2;border:1px solid #d4a72c}
.banner.ok{background:#e6f6ea;border:1px solid #4ac26b}
tr.drift td,tr.missing td{background:#fff1c2}
#controls{display:flex;gap:12px;align-items:center;flex-wrap:wrap;margin:8px 0}
#heatmap td.cell{width:28px;height:20px;text-align:center;cursor:pointer;font-size:12px;padding:0 4px}
#heatmap td.model{font-family:ui-monospace,monospace;font-size:12px;white-space:nowrap}
#heatmap th.col{writing-mode:vertical-rl;transform:rotate(180deg);font-size:12px;font-weight:normal}
.status-pass{background:#2da44e;color:#fff}.status-discrepancy{background:#fb8f44;color:#000}
.status-fail{background:#cf222e;color:#fff}.status-timeout{background:#8250df;color:#fff}
.status-crash{background:#6e0f16;color:#fff}.status-skip{background:#afb8c1;color:#000}
.status-none{background:#fff;color:#aaa}td.cell.dim{opacity:.15}td.cell.selected{outline:3px solid #0969da}
#layout{display:flex;gap:20px;align-items:flex-start}#detail{min-width:360px;max-width:640px;
border:1px solid #d0d7de;border-radius:6px;padding:10px;background:#fff}#detail pre{white-space:pre-wrap;
word-break:break-word;background:#f6f8fa;padding:6px;max-height:280px;overflow:auto;font-size:12px}
#categories li{cursor:pointer}#categories li:hover{text-decoration:underline}
#heatmap-wrap{max-height:calc(100vh - 24px);overflow:auto;border:1px solid #d0d7de}
#heatmap thead th{position:sticky;top:0;z-index:1}#heatmap th.sort{cursor:pointer;user-select:none}
#heatmap th.sort:hover{background:#dde3ea}#heatmap th[aria-sort=ascending]::after{content:" ▲"}
#heatmap th[aria-sort=descending]::after{content:" ▼"}#controls select{max-width:30em}
#heatmap th.col[aria-sort=ascending]::after{content:"▼ "}#heatmap th.col[aria-sort=descending]::after{content:"▲ "}
details.fold>summary{cursor:pointer;margin:18px 0 6px}details.fold>summary h2{display:inline;margin:0}
"""

SYMBOLS = {"pass": "✓", "discrepancy": "≠", "fail": "✗", "skip": "–", "timeout": "⏱", "crash": "☠"}

JS = r"""
const T0 = performance.now();
const M = JSON.parse(document.getElementById('matrix-data').textContent);
const STATUSES = ['pass','discrepancy','fail','skip','timeout','crash'];
const SYMBOLS = %SYMBOLS%;
// Sorting a backend's column puts the worst status first; a second click reverses.
const SORT_RANK = {crash: 0, timeout: 1, fail: 2, discrepancy: 3, pass: 4, skip: 5, none: 6};
const ANSI = /\x1b\[[0-?]*[ -\/]*[@-~]/g;
const $ = (id) => document.getElementById(id);
const ESC = {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'};
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else if (k.startsWith('data-')) e.setAttribute(k, v); else e[k] = v;
  }
  for (const c of children) e.append(c === null || c === undefined ? '' : c);
  return e;
}
function fmt(x) { return typeof x === 'number' ? (Math.abs(x) >= 1e-3 || x === 0 ? x.toPrecision(3) : x.toExponential(2)) : String(x); }

function renderSummary() {
  const t = $('summary');
  t.append(el('tr', {}, el('th', {}, 'backend'), ...STATUSES.map(s => el('th', {}, s)), el('th', {}, 'total')));
  for (const col of M.columns) {
    const c = M.counts[col];
    const total = STATUSES.reduce((a, s) => a + c[s], 0);
    t.append(el('tr', {'data-col': col}, el('td', {}, col),
      ...STATUSES.map(s => el('td', {class: 'num', 'data-status': s}, String(c[s]))), el('td', {class: 'num'}, String(total))));
  }
}
function renderVersions() {
  const t = $('versions');
  t.append(el('tr', {}, el('th', {}, 'package'), el('th', {}, 'pinned'), el('th', {}, 'installed'), el('th', {}, '')));
  for (const v of M.versions) {
    const flag = v.state === 'drift' ? '⚠ drift' : v.state === 'missing' ? '⚠ not installed' : 'ok';
    t.append(el('tr', {class: v.state, 'data-package': v.package}, el('td', {}, v.package), el('td', {}, v.pinned || '–'),
      el('td', {}, v.installed.join(', ') || '–'), el('td', {class: 'flag'}, flag)));
  }
  const b = $('drift-banner');
  if (M.drift.length) {
    b.className = 'banner drift';
    b.textContent = '⚠ Version drift: ' + M.versions.filter(v => v.state !== 'ok')
      .map(v => `${v.package} pinned ${v.pinned}, ran ${v.installed.join(', ')}`).join('; ');
  } else { b.className = 'banner ok'; b.textContent = 'Every pinned package ran at its pin.'; }
}
function renderFilters() {
  const status = $('filter-status'), category = $('filter-category');
  for (const s of STATUSES) status.append(el('option', {value: s}, s));
  category.append(...M.categories.map(g => el('option', {value: g.category}, `${g.category} (${g.count})`)));
  for (const id of ['filter-name', 'filter-status', 'filter-category']) for (const ev of ['input', 'change']) $(id).addEventListener(ev, applyFilters);
  $('filter-reset').onclick = () => { $('filter-name').value = ''; status.value = ''; category.value = ''; applyFilters(); };
}
function renderCategories() {
  // The list sits below the matrix, folded in a <details> when long; clicking a cause filters the matrix by it.
  const ul = $('categories');
  ul.innerHTML = M.categories.length ? M.categories.map(g =>
    `<li data-category="${esc(g.category)}"><b>${g.count}</b> × ${esc(g.category)}</li>`).join('') : '<li>no failures</li>';
  ul.addEventListener('click', (e) => {
    const li = e.target.closest('li[data-category]');
    if (!li) return;
    $('filter-category').value = li.dataset.category;
    applyFilters();
    $('matrix').scrollIntoView();
  });
}

// The heat map: built as one HTML string (one parse, one layout), rows kept in ROWS for sorting and filtering.
let ROWS = [];
let sortKey = 'model', sortDir = 1;
function renderHeatmap() {
  const t = $('heatmap');
  const head = '<thead><tr><th class="sort" data-sort="model" aria-sort="ascending" title="sort by class name">model class</th>' +
    M.columns.map(c => `<th class="col sort" data-sort="${esc(c)}" aria-sort="none" title="sort by ${esc(c)} status">${esc(c)}</th>`).join('') +
    '</tr></thead>';
  const parts = [];
  for (const [model, cells] of Object.entries(M.models)) {
    parts.push(`<tr data-model="${esc(model)}"><td class="model">${esc(model)}</td>`);
    for (const col of M.columns) {
      const cell = cells[col], s = cell ? String(cell.status) : 'none';
      parts.push(`<td class="cell status-${esc(s)}" data-col="${esc(col)}" data-status="${esc(s)}" data-category="${
        esc(cell && cell.category ? cell.category : '')}" title="${esc(`${model} / ${col}: ${s}`)}">${cell ? esc(SYMBOLS[s] || '?') : ''}</td>`);
    }
    parts.push('</tr>');
  }
  t.innerHTML = head + '<tbody>' + parts.join('') + '</tbody>';
  ROWS = Array.from(t.tBodies[0].rows, (tr) => {
    const cells = Array.from(tr.cells).slice(1), model = tr.dataset.model;
    const rank = {};
    for (const td of cells) rank[td.dataset.col] = SORT_RANK[td.dataset.status] ?? 7;
    return {tr, model, lower: model.toLowerCase(), cells, rank};
  });
  t.addEventListener('click', (e) => {
    const th = e.target.closest('th.sort');
    if (th) { sortBy(th.dataset.sort); return; }
    const td = e.target.closest('td.cell');
    if (td && td.dataset.status !== 'none') showDetail(td.parentNode.dataset.model, td.dataset.col, td);
  });
}
function byName(a, b) { return a.model < b.model ? -1 : a.model > b.model ? 1 : 0; }
function sortBy(key) {
  if (key === sortKey) sortDir = -sortDir; else { sortKey = key; sortDir = 1; }
  ROWS.sort(key === 'model' ? (a, b) => sortDir * byName(a, b)
                            : (a, b) => sortDir * (a.rank[key] - b.rank[key]) || byName(a, b));
  const frag = document.createDocumentFragment();
  for (const r of ROWS) frag.append(r.tr);
  $('heatmap').tBodies[0].append(frag);
  for (const th of document.querySelectorAll('#heatmap th.sort'))
    th.setAttribute('aria-sort', th.dataset.sort !== sortKey ? 'none' : sortDir > 0 ? 'ascending' : 'descending');
}
function applyFilters() {
  const name = $('filter-name').value.trim().toLowerCase();
  const status = $('filter-status').value, category = $('filter-category').value;
  let shown = 0;
  for (const r of ROWS) {
    const nameOk = !name || r.lower.includes(name);
    let any = false;
    for (const td of r.cells) {
      const ok = (!status || td.dataset.status === status) && (!category || td.dataset.category === category);
      td.classList.toggle('dim', !ok);
      any = any || ok;
    }
    const visible = nameOk && any;
    r.tr.style.display = visible ? '' : 'none';
    shown += visible;
  }
  $('shown-count').textContent = `${shown} of ${ROWS.length} model classes shown`;
}
function table(headers, rows) {
  const head = headers ? [el('tr', {}, ...headers.map(h => el('th', {}, h)))] : [];
  return el('table', {}, ...head, ...rows.map(r => el('tr', {}, ...r.map(x => el('td', {}, x)))));
}
function showDetail(model, col, td) {
  document.querySelectorAll('td.cell.selected').forEach(x => x.classList.remove('selected'));
  td.classList.add('selected');
  const c = M.models[model][col], info = M.model_info[model] || {};
  const d = $('detail');
  d.replaceChildren(el('h2', {id: 'detail-title'}, `${model} · ${col}`));
  const facts = [['status', c.status], ['stage', c.stage || '–'], ['category', c.category || '–'],
    ['model type', info.model_type || '–'], ['mappings', (info.mappings || []).join(', ') || '–'],
    ['wall seconds', c.wall_seconds == null ? '–' : fmt(c.wall_seconds)],
    ['peak RSS', c.peak_rss_mb == null ? '–' : `${fmt(c.peak_rss_mb)} MiB`]];
  if (c.skiplist) facts.push(['skiplist', c.skiplist]);
  d.append(el('div', {id: 'detail-facts'}, table(null, facts)));
  if (c.error_detail) d.append(el('h3', {}, 'Error'), el('pre', {id: 'detail-error'}, String(c.error_detail).replace(ANSI, '')));
  // worst leaf first (the data's keys arrive sorted by name): failing, then the largest difference, NaN/inf first
  const size = (v) => typeof v.max_abs === 'number' ? v.max_abs : v.max_abs == null ? 0 : Infinity;
  const diffs = Object.entries(c.diffs || {}).sort(([ka, a], [kb, b]) =>
    (!!(a.ok ?? true) - !!(b.ok ?? true)) || (size(b) - size(a)) || (ka < kb ? -1 : ka > kb ? 1 : 0));
  if (diffs.length) d.append(el('h3', {}, 'Max differences per output leaf'), el('div', {id: 'detail-diffs'},
    table(['leaf', 'max abs', 'max rel', 'ok'], diffs.map(([k, v]) => [k, fmt(v.max_abs), fmt(v.max_rel), v.ok ? 'yes' : ('NO' + (v.problem ? ': ' + v.problem : ''))]))));
  const secs = Object.entries(c.seconds || {});
  if (secs.length) d.append(el('h3', {}, 'Seconds per stage'), table(secs.map(x => x[0]), [secs.map(x => fmt(x[1]))]));
}
renderSummary(); renderHeatmap(); renderFilters(); applyFilters(); renderCategories(); renderVersions();
document.body.dataset.renderMs = Math.round(performance.now() - T0);
""".replace("%SYMBOLS%", json.dumps(SYMBOLS))


def embed_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element: every ``<``, ``>`` and ``&`` escaped as a unicode escape."""
    text = dumps_strict(data, sort_keys=True, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def static_page(title: str, body: str, extra_css: str = "") -> str:
    """A complete HTML document around ``body`` (already HTML) with the shared inline style."""
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{CSS}{extra_css}</style></head><body><header><h1>{html.escape(title)}</h1></header>"
            f"<main>{body}</main></body></html>\n")


CATEGORIES_OPEN_MAX = 8  # a longer failure-category list starts folded


def render_matrix_html(matrix: dict[str, Any]) -> str:
    """The matrix page: headline counts, then the heat map (sortable, filterable), then the folded failure
    categories and the versions table."""
    n_models, n_cases = len(matrix["models"]), matrix["cases"]
    categories = matrix["categories"]
    n_failing = sum(g["count"] for g in categories)
    legend = " ".join(f'<span class="status-{s}">&nbsp;{sym}&nbsp;</span> {s}' for s, sym in SYMBOLS.items())
    fold_open = " open" if len(categories) <= CATEGORIES_OPEN_MAX else ""
    body = f"""
<div id="drift-banner"></div>
<p class="muted">{n_cases} cases, {n_models} model classes. Click a cell for its error and differences, a column
header to sort by it.</p>
<h2>Counts per backend and status</h2><table id="summary"></table>
<h2 id="matrix">Matrix</h2>
<div id="controls">
  <label>name <input id="filter-name" type="search" placeholder="e.g. Llama"></label>
  <label>status <select id="filter-status"><option value="">any</option></select></label>
  <label>category <select id="filter-category"><option value="">any</option></select></label>
  <button id="filter-reset">reset</button> <span id="shown-count" class="muted"></span>
</div>
<p id="legend" class="muted">{legend}</p>
<div id="layout"><div id="heatmap-wrap"><table id="heatmap"></table></div>
<aside id="detail"><p class="muted">Click a cell.</p></aside></div>
<details id="categories-fold" class="fold"{fold_open}><summary><h2>Failures by category</h2>
<span class="muted">{n_failing} cases, {len(categories)} causes</span></summary><ul id="categories"></ul></details>
<h2>Versions (pinned vs installed)</h2><table id="versions"></table>
<script type="application/json" id="matrix-data">{embed_json(matrix)}</script>
<script>{JS}</script>
"""
    return static_page("export-sweep matrix", body)
