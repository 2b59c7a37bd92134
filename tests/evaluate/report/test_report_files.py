"""The report's files are replaced as one set: a write that fails partway
(a full disk, a kill) keeps the last report whole, with nothing left beside it."""
import errno
import os
import time

import pytest

from evaluate.report import STALE_STAGING_S, build_report, figures

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


def test_a_killed_reports_staging_folder_is_removed_by_the_next_report(tmp_path):
    """SIGTERM, kill -9 or the OOM killer skip the report's cleanup; the next
    report removes what it left, and not the folder of one running now."""
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    killed, running = out / ".report-killed", out / ".report-running"
    for folder in (killed, running):
        folder.mkdir(parents=True)
        (folder / "report.md").write_text("# half")
    long_ago = time.time() - STALE_STAGING_S - 60
    os.utime(killed, (long_ago, long_ago))
    paths = build_report(tmp_path / "results", out, "T", outputs=("markdown",))
    assert sorted(p.name for p in out.iterdir()) == sorted([running.name] + [p.name for p in paths])
