"""Rows validated on read (evaluate.row_validity): a row with an impossible
value, or an ok row without what every reader relies on, is listed under
"Rejected rows" with its file, line and why, and counts nowhere else: the
report of a store with such rows planted is the report of the store without
them, plus that section."""
import json

import pytest

from evaluate.report import build_report
from evaluate.row_validity import why_rejected

from .rows import main_rows, speed_run, store
from .test_main_cli import report_cli

PLANTED = {  # name -> (row, words of why)
    "negative throughput": (speed_run("w4a16_gptq", "interactive", 0).but(
        metrics={"latency_s": 0.5, "output_throughput": -500.0}), "cannot be negative"),
    "1e9 tok/s": (speed_run("w8a8_smooth_ptq", "medium_batch", 1).but(
        metrics={"latency_s": 2.0, "output_throughput": 1e9}), "above what 1024 output tokens in latency_s 2 s"),
    "no metrics": (speed_run("original", "interactive", 2).but(metrics={}), "without metrics"),
    "no artifact id": (speed_run("w4a16_gptq", "medium_batch", 0).but(artifact_id=None), "without artifact_id"),
    "infinite latency": (speed_run("original", "medium_batch", 0).but(
        metrics={"latency_s": float("inf"), "output_throughput": 10.0}), "latency_s is inf"),
}


def report_md(out) -> str:
    """report.md without the lines that differ between any two reports (time, row count)."""
    text = (out / "report.md").read_text()
    return "\n".join(line for line in text.splitlines() if not line.startswith(("- Generated: ", "- Results: ")))


def test_planted_rows_are_listed_with_why_and_count_nowhere(tmp_path):
    clean = tmp_path / "clean"
    good = store(clean, main_rows())
    build_report(clean, tmp_path / "clean-report", "t", outputs=("markdown",))
    planted = tmp_path / "planted"
    store(planted, good[:3] + [row for row, _ in PLANTED.values()] + good[3:])
    proc = report_cli(tmp_path, f"results_dir={planted}", f"out_dir={tmp_path / 'out'}", "title=t",
                      "output=[markdown]")
    assert proc.returncode == 0, proc.stderr
    md = report_md(tmp_path / "out")
    section = md.split("## Rejected rows\n", 1)[1].split("\n## ", 1)[0]
    assert "5 row(s) whose values cannot be true and 0 line(s) that are not rows" in section
    lines = [line for line in section.splitlines() if line.startswith(f"| `{planted / 'results.jsonl'}` |")]
    for (name, (_, why)), line_number, line in zip(PLANTED.items(), range(4, 9), lines):
        assert line.split(" | ")[1] == str(line_number) and why in line, (name, line)
    assert len(lines) == len(PLANTED)
    without_section = md.replace(f"## Rejected rows\n{section}\n", "")
    assert without_section == report_md(tmp_path / "clean-report")
    assert "16768569" not in md and "-500" not in without_section


@pytest.mark.parametrize("name", list(PLANTED))
def test_each_planted_row_is_rejected_and_every_row_of_the_fixtures_is_not(name):
    row, why = PLANTED[name]
    assert why in why_rejected(json.loads(json.dumps(row.to_dict())))
    assert all(why_rejected(r.to_dict()) is None for r in main_rows())
