"""Reports built once per test from the stores in rows.py."""
import pytest

from evaluate.report import build_report

from .rows import main_rows, many_model_rows, store


@pytest.fixture
def report_dir(tmp_path):
    """The main store (split over two files) reported; (out dir, rows)."""
    rows = store(tmp_path / "results", main_rows(), split=True)
    out = tmp_path / "reports"
    build_report(tmp_path / "results", out, "Test report")
    return out, rows


@pytest.fixture
def many_models(tmp_path):
    """The three-model store reported; (report.md text, out dir)."""
    store(tmp_path / "res", many_model_rows())
    build_report(tmp_path / "res", tmp_path / "out", "Three models")
    return (tmp_path / "out" / "report.md").read_text(), tmp_path / "out"
