"""evaluate/report/html.py: report.html, checked as text and in Debian's
headless chromium (scripts/setup_browser.sh installs it and its chromedriver)."""
import datetime
import html
import importlib.util
import itertools
import logging
import os
import re
import shutil
import struct
import sys
import tempfile
from contextlib import contextmanager

import pytest

from evaluate.report import build_report
from evaluate.report.__main__ import main
from evaluate.report.html import unique_slug

from .rows import ARTIFACTS, PLOTS, SCENARIOS, base_row, main_rows, speed_metrics, store

# The section a reader opens the report for (report.md's first); the browser test screenshots it.
ANSWER_SECTION = "what-to-use-on-this-machine"
MEDIUM_BATCH = "medium-batch-batch-size-8-input-len-256-output-len-128"  # the summary's second table
EXTERNAL = re.compile(r"""\b(?:src|href|xlink:href|action)\s*=\s*["']?\s*(?:https?:)?//""", re.I)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def html_report(tmp_path):
    """The main store reported with report.md and report.html; (out dir, html text)."""
    store(tmp_path / "results", main_rows())
    out = tmp_path / "reports"
    build_report(tmp_path / "results", out, "Test report", outputs=("markdown", "html"))
    return out, (out / "report.html").read_text()


def test_every_table_and_heading_of_report_md(html_report):
    out, page = html_report
    markdown = (out / "report.md").read_text()
    tables = len(re.findall(r"^\|(?:---\|)+$", markdown, re.M))
    assert tables and page.count('<table class="sortable') == tables
    h2 = re.findall(r"^## (.+)$", markdown, re.M)
    sections = re.findall(r'<section id="([^"]+)">', page)
    assert sections[:len(h2)] == [re.sub(r"[\W_]+", "-", h.lower()).strip("-") for h in h2]
    assert "skipped-unsupported-and-failed" in sections
    h3 = re.findall(r'<h3 id="([^"]+)">', page)
    assert len(h3) == len(re.findall(r"^### ", markdown, re.M))
    assert MEDIUM_BATCH in h3
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    assert all(f'href="#{s}"' in page for s in sections)  # the contents under the title link every section


def test_report_md_and_report_html_of_one_report_give_one_generated_time(monkeypatch, tmp_path):
    """The clock moves a second each time it is read: each file read it anew, so the two
    files of one report gave different times."""
    class Ticking(datetime.datetime):
        ticks = itertools.count()

        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 11, 27, 10, 0, next(cls.ticks), tzinfo=tz)
    for name, module in list(sys.modules.items()):   # wherever the report reads the clock
        if name.startswith("evaluate.report") and getattr(module, "datetime", None) is datetime.datetime:
            monkeypatch.setattr(module, "datetime", Ticking)
    store(tmp_path / "results", main_rows())
    out = tmp_path / "reports"
    build_report(tmp_path / "results", out, "Test report", outputs=("markdown", "html"))
    (stamp,) = re.findall(r"^- Generated: (\S+)$", (out / "report.md").read_text(), re.M)
    assert re.findall(r"Generated: ([^<\s]+)", (out / "report.html").read_text()) == [stamp]
    assert stamp.startswith("2026-11-27T10:00:")


def test_slugs_are_unique_per_page():
    taken = {"summary"}
    assert [unique_slug(t, taken) for t in ("What to use on this machine", "interactive (batch_size=1)",
                                             "interactive (batch_size=1)", "Summary", "`—`")] == [
        "what-to-use-on-this-machine", "interactive-batch-size-1", "interactive-batch-size-1-2", "summary-2",
        "section"]


def test_self_contained(html_report):
    """Styles and the sort script inline; nothing that would be fetched."""
    _, page = html_report
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<style>" in page and 'addEventListener("click"' in page and "table.sortable" in page
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    assert "<script src" not in page and 'rel="stylesheet"' not in page and "@import" not in page


@pytest.mark.skipif(not PLOTS, reason="matplotlib is not installed here: report.html has no plots")
def test_plots_inline_as_svg_where_report_md_shows_them(tmp_path):
    """The figures of output=png, by the same names, inline as SVG where report.md
    shows each image, with the caption report.md puts under it as the figcaption."""
    store(tmp_path / "results", main_rows())
    written = build_report(tmp_path / "results", tmp_path / "out", "Test report",
                           outputs=("markdown", "html", "png"))
    page = (tmp_path / "out" / "report.html").read_text()
    md = (tmp_path / "out" / "report.md").read_text()
    pngs = [p.stem for p in written if p.suffix == ".png"]
    shown = re.findall(r"^!\[[^\]]*\]\(([^)]+)\.png\)\n\n\*([^\n]+)\*$", md, re.M)
    assert sorted(pngs) == sorted(name for name, _ in shown)
    figures = re.findall(r'<figure id="plot-([^"]+)">\n<svg.*?<figcaption>([^<]+)</figcaption>', page, re.S)
    assert figures == [(name, html.escape(caption, quote=False)) for name, caption in shown]
    assert page.count("<svg") == len(pngs) and "<?xml" not in page and 'id="plots"' not in page


def test_without_matplotlib_one_warning_and_no_plots(monkeypatch, caplog, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    store(tmp_path / "bare", main_rows())
    with caplog.at_level(logging.WARNING, logger="quantbench.report"):
        build_report(tmp_path / "bare", tmp_path / "bare_out", "Test report", outputs=("html",))
    page = (tmp_path / "bare_out" / "report.html").read_text()
    assert "<svg" not in page and 'id="plots"' not in page and '<table class="sortable">' in page
    assert [r.getMessage() for r in caplog.records] == [
        "matplotlib is not installed: report.html has no plots (bash scripts/setup.sh installs it)"]


def test_names_from_the_store_are_shown_not_run(tmp_path):
    """Raw HTML in the Markdown (here the title) is escaped, never markup."""
    store(tmp_path / "results", main_rows())
    build_report(tmp_path / "results", tmp_path / "out", "Q <img src=x onerror=alert(1)>", outputs=("html",))
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<img" not in page
    assert "<title>Q &lt;img src=x onerror=alert(1)&gt;</title>" in page and "<h1>Q &lt;img" in page


def test_columns_the_same_on_every_row_move_into_the_caption(html_report):
    """Peak host memory is 2100.0 MB on every row of a Summary table: named once in its
    caption, not as a column; the answer keeps every column."""
    _, page = html_report
    summary = page.split(f'<h3 id="{MEDIUM_BATCH}">', 1)[1].split("</table>", 1)[0]
    assert "<caption>Same on every row: Peak host memory (MB): 2100.0</caption>" in summary
    assert "<th>Peak host memory (MB)</th>" not in summary and "<th>Recipe</th>" in summary
    answer = page.split(f'<section id="{ANSWER_SECTION}">', 1)[1].split("</table>", 1)[0]
    assert '<table class="sortable answer">' in answer and "<caption>" not in answer
    assert '<th class="secondary">Model size (MB)</th>' in answer   # constant, still the answer's: hideable


def test_ordered_lists_keep_the_numbers_of_report_md(html_report):
    out, page = html_report
    md = (out / "report.md").read_text().split("## Ranking\n", 1)[1].split("\n## ", 1)[0]
    ranking = page.split('<section id="ranking">', 1)[1].split("</section>", 1)[0]
    places = re.findall(r"^(\d+)\. ", md, re.M)
    assert places and re.findall(r'<li value="(\d+)">', ranking) == places


# --- in the browser -----------------------------------------------------------------------------------

BROWSER_MISSING = [b for b in ("chromium", "chromedriver") if shutil.which(b) is None]


@contextmanager
def headless_chromium():
    """Debian's chromium under its own chromedriver (selenium downloads nothing), console logs kept.
    Its temporary files go to a folder of its own, removed at quit: chromium leaves a
    singleton folder in TMPDIR behind, and its socket's path must stay under 108 bytes
    (a parallel test's tmp_path is longer)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run its sandbox as root
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    scratch = tempfile.mkdtemp(prefix="qb-chromium-")
    service = Service(executable_path=shutil.which("chromedriver"), env={**os.environ, "TMPDIR": scratch})
    try:
        driver = webdriver.Chrome(service=service, options=options)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def column(table, header: str) -> list[str]:
    """The cells of the column under `header`, top to bottom, as shown."""
    from selenium.webdriver.common.by import By
    headers = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    index = headers.index(header) + 1
    return [td.text for td in table.find_elements(By.CSS_SELECTOR, f"tbody tr td:nth-child({index})")]


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk."""
    assert data[:8] == PNG_SIGNATURE
    return struct.unpack(">II", data[16:24])


@pytest.mark.skipif(bool(BROWSER_MISSING), reason=f"{' and '.join(BROWSER_MISSING)} not installed: "
                    "the browser test needs Debian's chromium and chromedriver (make setup-browser, as root)")
def test_in_headless_chromium(html_report, tmp_path):
    """The page loads without a console error, a header click sorts its table by
    number (not text) with "—" last, and the answer section screenshots whole."""
    from selenium.webdriver.common.by import By
    out, _ = html_report
    with headless_chromium() as browser:
        browser.get((out / "report.html").as_uri())
        assert browser.title == "Test report"
        severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe

        # The summary's medium_batch table: 121.51, 95.68 and 84.20 tok/s, fastest first.
        table = browser.find_element(By.XPATH, f"//h3[@id='{MEDIUM_BATCH}']/following-sibling::div[1]//table")
        assert column(table, "Recipe") == ["w8a8_smooth_ptq", "original", "w4a16_gptq"]
        throughput = table.find_element(By.XPATH, ".//th[.='Output throughput (tok/s)']")
        throughput.click()
        # 84.20 < 95.68 < 121.51 by number; as text "121.51" would come first
        assert [c.split(" ±")[0] for c in column(table, "Output throughput (tok/s)")] == ["84.20", "95.68", "121.51"]
        assert column(table, "Recipe") == ["w4a16_gptq", "original", "w8a8_smooth_ptq"]
        assert throughput.get_attribute("aria-sort") == "ascending"
        throughput.click()
        assert column(table, "Recipe") == ["w8a8_smooth_ptq", "original", "w4a16_gptq"]
        assert throughput.get_attribute("aria-sort") == "descending"
        recovery = table.find_element(By.XPATH, ".//th[contains(., 'recovery')]")  # w4a16_gptq has no accuracy run
        recovery.click()
        assert column(table, recovery.text) == ["97.0", "100.0", "—"]  # not measured: last either way
        recovery.click()
        assert column(table, recovery.text) == ["100.0", "97.0", "—"]
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]

        # An element screenshot is cut at the window's edge: make the window as tall as the page.
        browser.set_window_size(1280, browser.execute_script("return document.documentElement.scrollHeight") + 100)
        section = browser.find_element(By.ID, ANSWER_SECTION)
        shot = tmp_path / f"{ANSWER_SECTION}.png"
        assert section.screenshot(str(shot))
        width, height = png_size(shot.read_bytes())
        assert 600 <= width <= 1400 and height >= section.size["height"] - 2 >= 150, (width, height, section.size)
        assert section.find_element(By.TAG_NAME, "h2").text == "What to use on this machine"
        assert section.find_elements(By.CSS_SELECTOR, "table.sortable")  # up to the next h2, its table included

        browser.execute_script("console.error('report.html test: console errors are seen')")
        assert any("console errors are seen" in e["message"] for e in browser.get_log("browser")
                   if e["level"] == "SEVERE")  # the check above could have failed


def long_rows() -> list:
    """The main store with 12 runs per artifact and scenario: Detailed runs is taller than a window."""
    extra = [base_row(recipe, scenario, run_index=i, metrics=speed_metrics(recipe, scenario, i % 3))
             for recipe in ARTIFACTS for scenario in SCENARIOS for i in range(3, 12)]
    return main_rows() + extra


ANSWER_KEYS = ("Scenario", "Use", "Speed-up vs original (x, 95% CI)", "Accuracy recovery (%, 95% CI)",
               "Cost (USD per 1M output tokens)")
GEOMETRY = """
const box = (e) => { const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, left: r.left,
                                                                  right: r.right}; };
return Array.from(document.querySelectorAll('figure')).map(f => {
  const group = f.closest('.beside');
  const block = group ? group.firstElementChild : null;
  return {id: f.id, caption: (f.querySelector('figcaption') || {}).textContent || '', figure: box(f),
          block: block ? box(block) : null, holds: block ? block.querySelectorAll('table, li').length : 0,
          section: f.closest('section').id};
});"""


@pytest.mark.skipif(bool(BROWSER_MISSING) or not PLOTS, reason="needs Debian's chromium and chromedriver (make "
                    "setup-browser, as root) and matplotlib")
def test_on_a_laptop_in_headless_chromium(tmp_path):
    """At 1400 px: a long table's header stays in view while it scrolls, and every plot
    has its caption and sits beside or right below the table or list it illustrates. At
    800 px: the answer's key columns (and its cost) are in view without horizontal
    scrolling. Both widths are screenshot into the test's folder."""
    from selenium.webdriver.common.by import By
    store(tmp_path / "results", long_rows())
    out = tmp_path / "reports"
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={out}", "title=Test report",
                 "output=[markdown,html,png]", "cost.usd_per_hour=2.5"]) == 0   # the cost: one more column
    with headless_chromium() as browser:
        browser.set_window_size(1400, 900)
        browser.get((out / "report.html").as_uri())
        assert browser.execute_script("return window.innerWidth") == 1400
        browser.save_screenshot(str(tmp_path / "report-1400px.png"))

        runs = browser.find_element(By.CSS_SELECTOR, "#detailed-runs .scroll")
        browser.execute_script("arguments[0].scrollIntoView(); arguments[0].scrollTop = 400;", runs)
        box, header, first = browser.execute_script(
            "const b = arguments[0], r = (e) => e.getBoundingClientRect().toJSON();"
            "return [r(b), r(b.querySelector('thead th')), r(b.querySelector('tbody tr'))];", runs)
        assert box["height"] <= browser.execute_script("return window.innerHeight")  # the box fits the window
        assert runs.get_property("scrollHeight") > runs.get_property("clientHeight")   # and scrolls
        assert abs(header["top"] - box["top"]) <= 1, (header, box)                     # the header stuck
        assert first["top"] < header["top"] - 300                                      # the rows went under it

        figures = browser.execute_script(GEOMETRY)
        assert {f["id"] for f in figures} == {f"plot-{p.stem}" for p in out.glob("*.png")}
        for f in figures:
            assert f["caption"].endswith(".") and len(f["caption"]) > 60, f
            if f["id"] == "plot-throughput":    # every scenario's bars: at the end of the Summary
                assert f["section"] == "summary" and f["block"] is None
                continue
            assert f["holds"], f                # grouped with a table or list ...
            beside = f["figure"]["left"] >= f["block"]["right"] - 1 and f["figure"]["top"] < f["block"]["bottom"]
            below = 0 <= f["figure"]["top"] - f["block"]["bottom"] < 60
            assert beside or below, f           # ... next to it, or right under it

        browser.set_window_size(800, 900)
        assert browser.execute_script("return window.innerWidth") == 800
        answer = browser.find_element(By.ID, ANSWER_SECTION)
        browser.execute_script("arguments[0].scrollIntoView()", answer)
        browser.save_screenshot(str(tmp_path / "report-800px.png"))
        table = answer.find_element(By.CSS_SELECTOR, "table.answer")
        scroller = table.find_element(By.XPATH, "..")
        assert scroller.get_property("scrollWidth") <= scroller.get_property("clientWidth")  # no sideways scroll
        assert browser.execute_script("return document.documentElement.scrollWidth") <= 800
        heads = {th.text.replace("\n", " "): th for th in table.find_elements(By.CSS_SELECTOR, "thead th")}
        for key in ANSWER_KEYS:
            right = browser.execute_script("return arguments[0].getBoundingClientRect().right", heads[key])
            assert right <= 800, (key, right)
    for width in (1400, 800):
        assert png_size((tmp_path / f"report-{width}px.png").read_bytes())[0] == width


# Where a cell's text breaks between two lines inside a word (letters or digits on both sides).
MID_WORD_BREAKS = """
const breaks = [];
for (const cell of arguments[0].querySelectorAll('td')) {
  const chars = [];
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.length; i++) {
      const range = document.createRange();
      range.setStart(node, i); range.setEnd(node, i + 1);
      const rects = range.getClientRects();
      if (rects.length) chars.push([node.data[i], rects[0].top]);
    }
  }
  for (let i = 1; i < chars.length; i++) {
    const [a, top] = chars[i - 1], [b, next] = chars[i];
    if (next > top + 2 && /[A-Za-z0-9]/.test(a) && /[A-Za-z0-9]/.test(b)) breaks.push(cell.textContent);
  }
}
return breaks;"""


@pytest.mark.skipif(bool(BROWSER_MISSING),
                    reason="needs Debian's chromium and chromedriver (make setup-browser, as root)")
def test_at_800_px_the_answers_long_names_wrap_between_words_not_inside_them(tmp_path):
    """Recipe and scenario names are one long word to the browser
    (w8a8_sparse_smooth_gptq, high_concurrency): on a laptop's 800 px they
    break after an underscore, as a reader would split them, never mid-word,
    and the answer still needs no sideways scroll."""
    from selenium.webdriver.common.by import By
    names = {"w8a8_smooth_ptq": "w8a8_sparse_smooth_gptq_int8", "interactive": "high_concurrency_long_prompts"}
    rows = [r.but(recipe=names.get(r.recipe, r.recipe), scenario=names.get(r.scenario, r.scenario))
            for r in main_rows()]
    store(tmp_path / "results", rows)
    out = tmp_path / "reports"
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={out}", "output=[markdown,html]",
                 "cost.usd_per_hour=2.5"]) == 0
    with headless_chromium() as browser:
        browser.set_window_size(800, 900)
        browser.get((out / "report.html").as_uri())
        table = browser.find_element(By.CSS_SELECTOR, f"#{ANSWER_SECTION} table.answer")
        browser.execute_script("arguments[0].scrollIntoView()", table)
        browser.save_screenshot(str(tmp_path / "answer-800px.png"))
        assert "w8a8_sparse_smooth_gptq_int8" in table.text.replace("\n", "")
        assert browser.execute_script(MID_WORD_BREAKS, table) == []
        scroller = table.find_element(By.XPATH, "..")
        assert scroller.get_property("scrollWidth") <= scroller.get_property("clientWidth")
