"""The fixed parts of the HTML report: its style sheet and its script, inlined in the page.

The script makes every ``table.sortable`` sortable by clicking a header (numbers by value,
blanks last; a second click reverses) and filters the run table by the backend and case
selects. A test hook: opened as ``report.html#selftest-sort=COLUMN,CLICKS`` the page clicks
that header of the run table CLICKS times once loaded (real click events through the same
handler), picks a backend in the filter with ``;backend=NAME`` appended, then marks
``<body data-selftest="done" data-drawn="bars bars roofline ...">`` (the charts laid out with a
size), so a headless browser's DOM dump shows the sorted, filtered table.
"""
from __future__ import annotations

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0; font-size: 12.5px; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
table.sortable th { cursor: pointer; user-select: none; }
th.asc::after { content: " \\25B2"; } th.desc::after { content: " \\25BC"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.status-error td, tr.status-mismatch td { background: #fde2e2; }
tr.status-skipped td { background: #f4f4f4; color: #666; }
td.repro code { font-size: 11px; white-space: pre-wrap; word-break: break-all; }
.verdict-regressed, .verdict-broken, .verdict-slower { color: #b00; font-weight: bold; }
.verdict-faster, .verdict-fixed { color: #070; font-weight: bold; }
.filters { margin: .4em 0; } .filters label { margin-right: 1em; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.env td:first-child { font-weight: bold; white-space: nowrap; }
.note { color: #555; font-size: 12px; }
"""

JS = r"""
(function () {
  function key(td) {
    var v = td.getAttribute('data-v'); if (v === null) v = td.textContent;
    var f = parseFloat(v);
    return (v !== '' && !isNaN(f) && isFinite(v)) ? {n: f} : {s: v};
  }
  function cmp(a, b) {
    if (a.n !== undefined && b.n !== undefined) return a.n - b.n;
    if (a.n !== undefined) return -1; if (b.n !== undefined) return 1;
    if (a.s === '' && b.s !== '') return 1; if (b.s === '' && a.s !== '') return -1;
    return a.s < b.s ? -1 : (a.s > b.s ? 1 : 0);
  }
  function sortBy(table, th) {
    var idx = Array.prototype.indexOf.call(th.parentNode.children, th);
    var asc = !th.classList.contains('asc');
    Array.prototype.forEach.call(th.parentNode.children, function (h) { h.classList.remove('asc', 'desc'); });
    th.classList.add(asc ? 'asc' : 'desc');
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r1, r2) {
      var a = key(r1.cells[idx]), b = key(r2.cells[idx]);
      var blankA = a.s === '', blankB = b.s === '';
      if (blankA !== blankB) return blankA ? 1 : -1;  // blanks last either way
      return asc ? cmp(a, b) : cmp(b, a);
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  function filter() {
    var b = document.getElementById('f-backend').value, c = document.getElementById('f-case').value;
    var shown = 0;
    Array.prototype.forEach.call(document.querySelectorAll('#runs tbody tr'), function (tr) {
      var ok = (!b || tr.getAttribute('data-backend') === b) && (!c || tr.getAttribute('data-case') === c);
      tr.style.display = ok ? '' : 'none'; if (ok) shown++;
    });
    document.getElementById('shown').textContent = shown;
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    table.querySelectorAll('thead th').forEach(function (th) {
      th.addEventListener('click', function () { sortBy(table, th); });
    });
  });
  ['f-backend', 'f-case'].forEach(function (id) {
    var el = document.getElementById(id); if (el) el.addEventListener('change', filter);
  });
  var m = /^#selftest-sort=([\w-]+),(\d+)(?:;backend=([\w.+-]+))?$/.exec(location.hash);
  if (m) {
    var th = document.querySelector('#runs thead th[data-col="' + m[1] + '"]');
    for (var i = 0; th && i < parseInt(m[2], 10); i++) th.click();
    if (m[3]) {
      var sel = document.getElementById('f-backend'); sel.value = m[3];
      sel.dispatchEvent(new Event('change'));
    }
    var drawn = Array.prototype.filter.call(document.querySelectorAll('svg[data-chart]'), function (s) {
      var b = s.getBoundingClientRect(); return b.width > 0 && b.height > 0;
    }).map(function (s) { return s.getAttribute('data-chart'); });
    document.body.setAttribute('data-drawn', drawn.join(' '));
    document.body.setAttribute('data-selftest', th ? 'done' : 'no such column');
  }
})();
"""


def page(title: str, body: str) -> str:
    """A whole self-contained HTML document around ``body``."""
    from html import escape
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{CSS}</style></head><body>\n{body}\n<script>{JS}</script></body></html>\n")
