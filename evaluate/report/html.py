"""report.html: report.md's text as one self-contained page. Each `##`
section is a <section> with an id from its heading ("What to use on this
machine" -> #what-to-use-on-this-machine), each `###` heading has one too, the
tables sort by a clicked header, and the plots of `output=png` follow inline
as SVG under "Plots"; the recipe search's and layer sensitivity's figures are
inline SVG in their own sections. Styles and the sort script are inline: the page loads
nothing, so it opens offline and can be mailed as one file."""
import html
import re
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.token import Token

from evaluate.analysis import Analysis
from evaluate.report.config import OutputFormat, ReportConfig
from evaluate.report.markdown import render_markdown
from evaluate.report.plots import SvgTexts, draw_all, have_matplotlib
from evaluate.report.search_files import sensitivities, studies
from evaluate.report.search_plots import svg_texts

PLOTS_ID = "plots"
LONG_CELL = 40  # characters of Markdown: a longer table cell wraps


@dataclass
class Html(OutputFormat):
    """report.html."""

    def render(self, analysis: Analysis, report: ReportConfig) -> dict[str, str]:
        return {"report.html": render_html(analysis, report)}


@dataclass
class Section:
    """One `##` section: the id its <section> carries, and its heading."""
    id: str
    title: str


def render_html(analysis: Analysis, report: ReportConfig) -> str:
    """The whole page: report.md's sections, then the plots (none without matplotlib)."""
    text = render_markdown(analysis, report.title, report.accuracy_floor_pct)
    inline = svg_texts(studies(analysis.results_dirs, analysis.suspect_ids), sensitivities(analysis.results_dirs),
                       report.accuracy_floor_pct)
    body, sections = markdown_body(text, taken={PLOTS_ID}, figures=inline)
    svgs = plot_svgs(analysis, report.pareto_scenario)
    if svgs:
        body += plots_section(svgs)
        sections.append(Section(PLOTS_ID, "Plots"))
    body = body.replace("</h1>\n", "</h1>\n" + contents(sections), 1)
    return PAGE.format(title=html.escape(report.title), style=STYLE, script=SORT_SCRIPT, body=body)


def markdown_body(text: str, taken: set[str], figures: dict[str, str] | None = None) -> tuple[str, list[Section]]:
    """The Markdown as HTML, with ids on the `##` sections (each wrapped in a
    <section>) and `###` headings, every table sortable and scrolling on its own.
    An image alone in its paragraph whose `<name>.png` is in `figures` (name ->
    inline SVG) becomes that figure; any other image its alt text, so the page
    loads no file. Raw HTML in the text is escaped: names from the results
    store are shown, never run."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    out: list[Token] = []
    sections: list[Section] = []
    skip = 0
    for i, token in enumerate(tokens):
        if skip:
            skip -= 1
            continue
        figure = inline_figure(tokens, i, figures or {})
        if figure:
            out.append(raw(figure))
            skip = 2    # the paragraph's inline text and its close
            continue
        if token.type == "inline":
            token.children = [Token("text", "", 0, content=c.content) if c.type == "image" else c
                              for c in token.children or ()]
        if token.type == "heading_open" and token.tag in ("h2", "h3"):
            title = inline_text(tokens[i + 1])
            ident = unique_slug(title, taken)
            if token.tag == "h3":
                token.attrSet("id", ident)
            else:
                out.append(raw(("</section>\n" if sections else "") + f'<section id="{ident}">\n'))
                sections.append(Section(ident, title))
        elif token.type == "table_open":
            out.append(raw('<div class="scroll">\n'))
            token.attrSet("class", "sortable")
        elif token.type == "td_open" and len(tokens[i + 1].content) > LONG_CELL:
            token.attrSet("class", "wrap")  # prose (a failure's reason) wraps; numbers and names stay on one line
        out.append(token)
        if token.type == "table_close":
            out.append(raw("</div>\n"))
    if sections:
        out.append(raw("</section>\n"))
    return md.renderer.render(out, md.options, {}), sections


def inline_figure(tokens: list[Token], i: int, figures: dict[str, str]) -> str:
    """The <figure> for a paragraph that is one image of `figures`; "" for anything else."""
    if tokens[i].type != "paragraph_open" or i + 2 >= len(tokens):
        return ""
    children = tokens[i + 1].children or []
    if len(children) != 1 or children[0].type != "image":
        return ""
    name = str(children[0].attrGet("src") or "").removesuffix(".png")
    if name not in figures:
        return ""
    return (f'<figure id="plot-{html.escape(name)}">\n{figures[name]}\n'
            f"<figcaption>{html.escape(children[0].content)} ({html.escape(name)}.png)</figcaption>\n</figure>\n")


def raw(markup: str) -> Token:
    return Token("html_block", "", 0, content=markup)


def inline_text(inline: Token) -> str:
    """A heading's text as shown (code spans without their backticks)."""
    return "".join(child.content for child in inline.children or () if child.type in ("text", "code_inline"))


def unique_slug(text: str, taken: set[str]) -> str:
    """Lower-case words joined by hyphens; `-2`, `-3`, ... where the page already has it.
    Records the slug in `taken`."""
    base = re.sub(r"[\W_]+", "-", text.lower()).strip("-") or "section"
    slug, n = base, 1
    while slug in taken:
        n += 1
        slug = f"{base}-{n}"
    taken.add(slug)
    return slug


def plot_svgs(analysis: Analysis, pareto: str | None) -> dict[str, str]:
    if not have_matplotlib("report.html"):
        return {}
    figures = SvgTexts()
    draw_all(analysis, pareto, figures)
    return figures.svgs


def plots_section(svgs: dict[str, str]) -> str:
    """The figures of `output=png`, each captioned with the PNG's name."""
    figures = "".join(f'<figure id="plot-{name}">\n{svg}\n<figcaption>{name}.png</figcaption>\n</figure>\n'
                      for name, svg in svgs.items())
    return f'<section id="{PLOTS_ID}">\n<h2>Plots</h2>\n{figures}</section>\n'


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

# System fonts only: nothing is fetched.
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
.scroll { overflow-x: auto; margin: .8rem 0; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d0d7de; padding: .25rem .5rem; text-align: left; vertical-align: top; }
td { white-space: nowrap; }
td.wrap { white-space: normal; min-width: 16em; }
th { min-width: 4em; }
thead th { background: #f6f8fa; position: sticky; top: 0; cursor: pointer; user-select: none; }
thead th:hover, thead th:focus { background: #eaeef2; }
thead th[aria-sort="ascending"]::after { content: " \\25B2"; }
thead th[aria-sort="descending"]::after { content: " \\25BC"; }
tbody tr:nth-child(even) { background: #f9fafb; }
figure { margin: 1.5rem 0; }
figure svg { max-width: 100%; height: auto; }
figcaption { color: #57606a; font-size: 13px; }
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
