"""The report's files are replaced as one set: a write that fails partway
(a full disk, a kill) keeps the last report whole, with nothing left beside it."""
import errno
import json
import os
import time

import pytest

from evaluate.report import MANIFEST, STALE_STAGING_S, build_report, figures

from .rows import PLOTS, main_rows, store


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
    assert sorted(paths) == sorted(p for p in out.iterdir() if p.name != MANIFEST)
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
    assert sorted(p.name for p in out.iterdir()) == sorted([running.name, MANIFEST] + [p.name for p in paths])


def test_a_second_report_removes_the_files_of_the_last_that_it_does_not_write_again(tmp_path):
    """A report of another layout, scenario or store into the same folder
    leaves no table or plot of the last one beside its own; a file the user
    put there stays."""
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    build_report(tmp_path / "results", out, "first", layouts=("summary", "oneline"), outputs=("markdown", "csv"))
    assert (out / "oneline.md").exists()
    (out / "notes.txt").write_text("mine")
    second = build_report(tmp_path / "results", out, "second", outputs=("markdown",))
    assert sorted(p.name for p in out.iterdir() if p.name != MANIFEST) == sorted(["notes.txt"] + [p.name for p in second])
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.skipif(not PLOTS, reason="matplotlib is not installed: no plots to compare")
def test_a_report_of_one_pareto_scenario_removes_the_last_reports_other_pareto_plots(tmp_path):
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    build_report(tmp_path / "results", out, "first", outputs=("markdown", "png"))
    assert (out / "pareto_medium_batch.png").exists()
    build_report(tmp_path / "results", out, "second", pareto="interactive", outputs=("markdown", "png"))
    assert not (out / "pareto_medium_batch.png").exists()
    assert "pareto_medium_batch.png" not in (out / "report.md").read_text()


def test_a_folder_without_the_record_of_its_last_report_keeps_its_files_and_says_so(tmp_path, caplog):
    """A report written before the record was kept: which of the files it
    wrote cannot be told from the user's, so none is removed."""
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    out.mkdir()
    (out / "pareto_medium_batch.png").write_bytes(b"older report's")
    build_report(tmp_path / "results", out, "T", outputs=("markdown",))
    assert (out / "pareto_medium_batch.png").read_bytes() == b"older report's"
    assert "pareto_medium_batch.png" in caplog.text and "left as they are" in caplog.text


def test_a_record_naming_a_file_outside_the_folder_removes_nothing_there(tmp_path):
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    outside = tmp_path / "keep.md"
    outside.write_text("mine")
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({"files": ["../keep.md", str(outside)]}))
    build_report(tmp_path / "results", out, "T", outputs=("markdown",))
    assert outside.read_text() == "mine"


def test_a_record_naming_a_file_in_a_linked_folder_removes_nothing_there(tmp_path):
    """out/shared a link to the user's own folder and a record naming
    shared/notes.md: the cleanup deleted the user's file outside out_dir."""
    store(tmp_path / "results", main_rows())
    out, outside = tmp_path / "out", tmp_path / "users_own"
    outside.mkdir()
    (outside / "notes.md").write_text("mine")
    out.mkdir()
    os.symlink(outside, out / "shared")
    (out / MANIFEST).write_text(json.dumps({"files": ["shared/notes.md", "shared"]}))
    build_report(tmp_path / "results", out, "T", outputs=("markdown",))
    assert (outside / "notes.md").read_text() == "mine" and (out / "shared").is_symlink()


def test_a_link_by_the_name_of_a_file_of_the_last_report_stays(tmp_path):
    """The report writes no links: one where its file was is the user's."""
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    build_report(tmp_path / "results", out, "T", outputs=("markdown", "csv"))
    (tmp_path / "mine.csv").write_text("mine")
    (out / "runs.csv").unlink()
    os.symlink(tmp_path / "mine.csv", out / "runs.csv")
    build_report(tmp_path / "results", out, "T", outputs=("markdown",))
    assert (out / "runs.csv").is_symlink() and (out / "runs.csv").read_text() == "mine"
