"""The report's files are replaced as one set: a write that fails partway
(a full disk, a kill) keeps the last report whole, with nothing left beside it."""
import errno

import pytest

from evaluate.report import build_report, figures

from .rows import main_rows, store


def contents(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_report_whose_plots_fail_to_write_keeps_the_last_report_whole(tmp_path, monkeypatch):
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    first = build_report(tmp_path / "results", out, "first", outputs=("markdown", "csv", "png"))
    assert {p.suffix for p in first} == {".md", ".csv", ".png"}
    before = contents(out)

    def full_disk(fig, path):
        figures.pyplot().close(fig)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(figures, "save_png", full_disk)
    with pytest.raises(OSError, match="No space left"):
        build_report(tmp_path / "results", out, "second", outputs=("markdown", "csv", "png"))
    assert contents(out) == before   # the first report's text, tables and plots, and nothing else


def test_a_written_report_lists_every_file_where_it_lies(tmp_path):
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    paths = build_report(tmp_path / "results", out, "T", outputs=("markdown", "csv", "png"))
    assert sorted(paths) == sorted(out.iterdir())
    assert "# T" in (out / "report.md").read_text()
