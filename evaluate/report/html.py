"""report.html: report.md's text as one self-contained page (html_body
turns the Markdown into sections, sortable tables and figures): each plot
inline as SVG below or beside the table it illustrates, with its caption; the
recipe search's and layer sensitivity's figures inline in their own
sections. Styles and the sort script are inline: the page loads nothing, so
it opens offline and can be mailed as one file."""
import html
from dataclasses import dataclass

from evaluate.analysis import Analysis
from evaluate.report.answer_markdown import SECONDARY_COLUMNS, TITLE as ANSWER_TITLE
from evaluate.report.config import OutputFormat, ReportConfig
from evaluate.report.figures import SvgTexts, have_matplotlib
from evaluate.report.html_body import ANSWER_CLASS, Section, markdown_body, unique_slug
from evaluate.report.markdown import render_markdown
from evaluate.report.plots import draw_all, report_plots
from evaluate.report.search_files import sensitivities, studies
from evaluate.report.search_plots import svg_texts

ANSWER_ID = unique_slug(ANSWER_TITLE.removeprefix("## "), set())
__all__ = ["Html", "render_html", "unique_slug"]


@dataclass
class Html(OutputFormat):
    """report.html."""

    def render(self, analysis: Analysis, report: ReportConfig) -> dict[str, str]:
        return {"report.html": render_html(analysis, report)}


def render_html(analysis: Analysis, report: ReportConfig) -> str:
    """The whole page: report.md's sections with every plot inline (none without matplotlib)."""
    plots = report_plots(analysis, report) if have_matplotlib("report.html") else []
    svgs = SvgTexts()
    draw_all(plots, svgs)
    inline = svg_texts(studies(analysis.results_dirs, analysis.suspect_ids), sensitivities(analysis.results_dirs),
                       report.accuracy_floor_pct)
    text = render_markdown(analysis, report, plots)
    body, sections = markdown_body(text, taken=set(), figures=inline | svgs.svgs, answer_id=ANSWER_ID,
                                   secondary=SECONDARY_COLUMNS)
    body = body.replace("</h1>\n", "</h1>\n" + contents(sections), 1)
    return PAGE.format(title=html.escape(report.title), style=STYLE.replace("ANSWER_CLASS", ANSWER_CLASS),
                       script=SORT_SCRIPT, body=body)


def contents(sections: list[Section]) -> str:
    """Links to every `##` section, under the title."""
    items = "".join(f'<li><a href="#{s.id}">{html.escape(s.title)}</a></li>' for s in sections)
    return f'<nav aria-label="Contents"><ul>{items}</ul></nav>\n' if sections else ""


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
<style>
{style}</style>
</head>
<body>
<main>
{body}</main>
<script>
{script}</script>
</body>
</html>
"""

# System fonts only: nothing is fetched. A table scrolls in its own box, no
# taller than the window, so its sticky header stays in view (an overflow box
# is what sticky sticks to). The answer's cells wrap, and under 1000 px its
# secondary columns go and the scenario and runner-up shrink to their breaks,
# after an underscore too (html_body.break_after_underscores), so its key
# columns fit a laptop's 800 px.
STYLE = """body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: #1f2328; background: #fff; }
main { max-width: 1400px; margin: 0 auto; padding: 1.5rem; }
h1 { font-size: 1.7rem; border-bottom: 1px solid #d0d7de; padding-bottom: .3rem; }
h2 { font-size: 1.35rem; border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; margin-top: 2rem; }
h3 { font-size: 1.1rem; margin-top: 1.5rem; }
section { scroll-margin-top: 1rem; }
code { font: .9em ui-monospace, "DejaVu Sans Mono", monospace; background: #f3f4f6; padding: .1em .3em;
       border-radius: 4px; }
nav ul { columns: 2; list-style: none; padding: 0; }
a { color: #0969da; }
.scroll { overflow: auto; max-height: 80vh; margin: .8rem 0; }
table { border-collapse: separate; border-spacing: 0; font-size: 13px; font-variant-numeric: tabular-nums; }
caption { caption-side: top; text-align: left; color: #57606a; padding: 0 0 .3rem; }
th, td { border: solid #d0d7de; border-width: 0 1px 1px 0; padding: .25rem .5rem; text-align: left;
         vertical-align: top; }
tr > :first-child { border-left-width: 1px; }
thead th { border-top-width: 1px; }
td { white-space: nowrap; }
td.wrap { white-space: normal; min-width: 16em; }
th { min-width: 4em; }
thead th { background: #f6f8fa; position: sticky; top: 0; z-index: 1; cursor: pointer; user-select: none; }
thead th:hover, thead th:focus { background: #eaeef2; }
thead th[aria-sort="ascending"]::after { content: " \\25B2"; }
thead th[aria-sort="descending"]::after { content: " \\25BC"; }
tbody tr:nth-child(even) { background: #f9fafb; }
table.ANSWER_CLASS td { white-space: normal; min-width: 5em; }
@media (max-width: 1000px) {
  table.ANSWER_CLASS .secondary { display: none; }
  table.ANSWER_CLASS td:first-child, table.ANSWER_CLASS td:last-child { overflow-wrap: break-word; min-width: 0; }
}
.beside { display: flex; flex-wrap: wrap; align-items: flex-start; gap: 0 2rem; }
.beside > .scroll, .beside > ol, .beside > ul { flex: 0 1 auto; min-width: 0; max-width: 100%; }
.beside > figure { flex: 1 1 420px; max-width: 720px; }
figure { margin: .8rem 0 1.5rem; }
figure svg { max-width: 100%; height: auto; }
figcaption { color: #57606a; font-size: 13px; max-width: 720px; }
"""

# Sorts a table by the clicked header (again: the other way). A cell sorts by
# its leading number ("12.3 ± 0.4", "1.27x", "35.8–42.6"), else by its text;
# numbers come before text, and "—" (not measured) or an empty cell always last.
SORT_SCRIPT = """"use strict";
(function () {
  var NUMBER = /^[-+\\u2212]?(\\d+(\\.\\d*)?|\\.\\d+)(e[-+]?\\d+)?(?=$|[\\s\\u00b1\\u2013%),;]|x(\\s|$))/i;
  function sortKey(cell) {
    var text = cell ? cell.textContent.trim() : "";
    if (text === "" || text === "\\u2014") return null;
    var match = NUMBER.exec(text.replace(/,(?=\\d{3})/g, ""));
    return match ? Number(match[0].replace("\\u2212", "-")) : text.toLowerCase();
  }
  function compare(a, b) {
    if (typeof a !== typeof b) return typeof a === "number" ? -1 : 1;
    return a < b ? -1 : a > b ? 1 : 0;
  }
  function sortBy(table, th) {
    var body = table.tBodies[0], column = th.cellIndex;
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    var rows = Array.prototype.map.call(body.rows, function (row, i) {
      return {row: row, key: sortKey(row.cells[column]), index: i};
    });
    rows.sort(function (x, y) {
      if (x.key === null || y.key === null) return (x.key === null) - (y.key === null) || x.index - y.index;
      return (ascending ? compare(x.key, y.key) : compare(y.key, x.key)) || x.index - y.index;
    });
    rows.forEach(function (r) { body.appendChild(r.row); });
    Array.prototype.forEach.call(th.parentNode.cells, function (c) { c.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    if (!table.tHead || !table.tBodies.length) return;
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      th.tabIndex = 0;
      th.title = "Sort by this column";
      th.addEventListener("click", function () { sortBy(table, th); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(table, th); }
      });
    });
  });
})();
"""
