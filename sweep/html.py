"""Self-contained HTML pages: the matrix (``matrix.html``) and the static shell used by ``compare.html``.

One file, no network: CSS and JavaScript are inline and the matrix travels as JSON in a ``<script
type="application/json">`` element (with ``<`` escaped, so no error message can close the tag). The page shows
the model classes x columns heat map, counts per backend and status, the version table with drift flagged,
the failure categories, filters by name, status and category, and a detail panel for the clicked cell.
"""

from __future__ import annotations

import html
import json
from typing import Any

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
#layout{display:flex;gap:20px;align-items:flex-start}#detail{position:sticky;top:8px;min-width:360px;max-width:640px;
border:1px solid #d0d7de;border-radius:6px;padding:10px;background:#fff}#detail pre{white-space:pre-wrap;
word-break:break-word;background:#f6f8fa;padding:6px;max-height:280px;overflow:auto;font-size:12px}
#categories li{cursor:pointer}#categories li:hover{text-decoration:underline}
"""

SYMBOLS = {"pass": "✓", "discrepancy": "≠", "fail": "✗", "skip": "–", "timeout": "⏱", "crash": "☠"}

JS = r"""
const M = JSON.parse(document.getElementById('matrix-data').textContent);
const STATUSES = ['pass','discrepancy','fail','skip','timeout','crash'];
const SYMBOLS = %SYMBOLS%;
const $ = (id) => document.getElementById(id);
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
  for (const s of STATUSES) $('filter-status').append(el('option', {value: s}, s));
  for (const g of M.categories) $('filter-category').append(el('option', {value: g.category}, `${g.category} (${g.count})`));
  const ul = $('categories');
  for (const g of M.categories) {
    const li = el('li', {'data-category': g.category}, el('b', {}, String(g.count)), ' × ' + g.category);
    li.onclick = () => { $('filter-category').value = g.category; applyFilters(); };
    ul.append(li);
  }
  if (!M.categories.length) ul.append(el('li', {}, 'no failures'));
  for (const id of ['filter-name', 'filter-status', 'filter-category']) for (const ev of ['input', 'change']) $(id).addEventListener(ev, applyFilters);
  $('filter-reset').onclick = () => { $('filter-name').value = ''; $('filter-status').value = ''; $('filter-category').value = ''; applyFilters(); };
}
function renderHeatmap() {
  const t = $('heatmap');
  t.append(el('thead', {}, el('tr', {}, el('th', {}, 'model class'), ...M.columns.map(c => el('th', {class: 'col'}, c)))));
  const body = el('tbody', {});
  for (const [model, cells] of Object.entries(M.models)) {
    const tr = el('tr', {'data-model': model}, el('td', {class: 'model'}, model));
    for (const col of M.columns) {
      const cell = cells[col];
      const s = cell ? cell.status : 'none';
      const td = el('td', {class: 'cell status-' + s, 'data-col': col, 'data-status': s,
        'data-category': cell && cell.category ? cell.category : '', title: `${model} / ${col}: ${s}`},
        cell ? SYMBOLS[s] : '');
      if (cell) td.onclick = () => showDetail(model, col, td);
      tr.append(td);
    }
    body.append(tr);
  }
  t.append(body);
}
function applyFilters() {
  const name = $('filter-name').value.trim().toLowerCase();
  const status = $('filter-status').value, category = $('filter-category').value;
  let shown = 0;
  for (const tr of document.querySelectorAll('#heatmap tbody tr')) {
    const nameOk = !name || tr.dataset.model.toLowerCase().includes(name);
    let any = false;
    for (const td of tr.querySelectorAll('td.cell')) {
      const ok = (!status || td.dataset.status === status) && (!category || td.dataset.category === category);
      td.classList.toggle('dim', !ok);
      any = any || ok;
    }
    const visible = nameOk && any;
    tr.style.display = visible ? '' : 'none';
    shown += visible;
  }
  $('shown-count').textContent = `${shown} of ${Object.keys(M.models).length} model classes shown`;
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
  if (c.error_detail) d.append(el('h3', {}, 'Error'), el('pre', {id: 'detail-error'}, c.error_detail));
  const diffs = Object.entries(c.diffs || {});
  if (diffs.length) d.append(el('h3', {}, 'Max differences per output leaf'), el('div', {id: 'detail-diffs'},
    table(['leaf', 'max abs', 'max rel', 'ok'], diffs.map(([k, v]) => [k, fmt(v.max_abs), fmt(v.max_rel), v.ok ? 'yes' : ('NO' + (v.problem ? ': ' + v.problem : ''))]))));
  const secs = Object.entries(c.seconds || {});
  if (secs.length) d.append(el('h3', {}, 'Seconds per stage'), table(secs.map(x => x[0]), [secs.map(x => fmt(x[1]))]));
}
renderSummary(); renderVersions(); renderFilters(); renderHeatmap(); applyFilters();
""".replace("%SYMBOLS%", json.dumps(SYMBOLS))


def embed_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element: every ``<``, ``>`` and ``&`` escaped as a unicode escape."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def static_page(title: str, body: str, extra_css: str = "") -> str:
    """A complete HTML document around ``body`` (already HTML) with the shared inline style."""
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{CSS}{extra_css}</style></head><body><header><h1>{html.escape(title)}</h1></header>"
            f"<main>{body}</main></body></html>\n")


def render_matrix_html(matrix: dict[str, Any]) -> str:
    n_models, n_cases = len(matrix["models"]), matrix["cases"]
    legend = " ".join(f'<span class="status-{s}">&nbsp;{sym}&nbsp;</span> {s}' for s, sym in SYMBOLS.items())
    body = f"""
<div id="drift-banner"></div>
<p class="muted">{n_cases} cases, {n_models} model classes. Click a cell for its error and differences.</p>
<h2>Counts per backend and status</h2><table id="summary"></table>
<h2>Failures by category</h2><ul id="categories"></ul>
<h2>Matrix</h2>
<div id="controls">
  <label>name <input id="filter-name" type="search" placeholder="e.g. Llama"></label>
  <label>status <select id="filter-status"><option value="">any</option></select></label>
  <label>category <select id="filter-category"><option value="">any</option></select></label>
  <button id="filter-reset">reset</button> <span id="shown-count" class="muted"></span>
</div>
<p id="legend" class="muted">{legend}</p>
<div id="layout"><table id="heatmap"></table><aside id="detail"><p class="muted">Click a cell.</p></aside></div>
<h2>Versions (pinned vs installed)</h2><table id="versions"></table>
<script type="application/json" id="matrix-data">{embed_json(matrix)}</script>
<script>{JS}</script>
"""
    return static_page("export-sweep matrix", body)
