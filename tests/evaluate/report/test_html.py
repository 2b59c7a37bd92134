"""evaluate/report/html.py: report.html, checked as text and in Debian's
headless chromium (scripts/setup_browser.sh installs it and its chromedriver)."""
import importlib.util
import logging
import os
import re
import shutil
import struct
from contextlib import contextmanager

import pytest

from evaluate.report import build_report
from evaluate.report.html import unique_slug

from .rows import PLOTS, main_rows, store

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
    assert tables and page.count('<table class="sortable">') == tables
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


def test_slugs_are_unique_per_page():
    taken = {"plots"}
    assert [unique_slug(t, taken) for t in ("What to use on this machine", "interactive (batch_size=1)",
                                             "interactive (batch_size=1)", "Plots", "`—`")] == [
        "what-to-use-on-this-machine", "interactive-batch-size-1", "interactive-batch-size-1-2", "plots-2", "section"]


def test_self_contained(html_report):
    """Styles and the sort script inline; nothing that would be fetched."""
    _, page = html_report
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<style>" in page and 'addEventListener("click"' in page and "table.sortable" in page
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    assert "<script src" not in page and 'rel="stylesheet"' not in page and "@import" not in page


@pytest.mark.skipif(not PLOTS, reason="matplotlib is not installed here: report.html has no plots")
def test_plots_inline_as_svg(tmp_path):
    """The figures of output=png, by the same names, inline in the Plots section."""
    store(tmp_path / "results", main_rows())
    written = build_report(tmp_path / "results", tmp_path / "out", "Test report", outputs=("html", "png"))
    page = (tmp_path / "out" / "report.html").read_text()
    pngs = [p.name for p in written if p.suffix == ".png"]
    assert pngs and re.findall(r"<figcaption>([^<]+)</figcaption>", page) == pngs
    plots = page[page.index('<section id="plots">'):]
    assert plots.count("<svg") == len(pngs) and "<?xml" not in page


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


# --- in the browser -----------------------------------------------------------------------------------

BROWSER_MISSING = [b for b in ("chromium", "chromedriver") if shutil.which(b) is None]


@contextmanager
def headless_chromium():
    """Debian's chromium under its own chromedriver (selenium downloads nothing), console logs kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run its sandbox as root
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()


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
