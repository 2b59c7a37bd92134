"""evaluate/report/tables_csv.py: summary.csv and runs.csv."""
import csv
import statistics

import pytest

from evaluate.metrics import mean_interval
from evaluate.report.tables_csv import SUMMARY_FIELDS, summary_records, to_csv

from .rows import ARTIFACTS, SCENARIOS, auto_dtype_rows, ok_speed, store


def test_csvs_parse(report_dir):
    out, rows = report_dir
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert len(summary) == len(SCENARIOS) * len(ARTIFACTS)
    row = next(r for r in summary if r["recipe"] == "w4a16_gptq" and r["scenario"] == "medium_batch")
    values = [r.metrics["output_throughput"] for r in ok_speed(rows, "w4a16_gptq", "medium_batch")]
    assert float(row["output_throughput_mean"]) == pytest.approx(statistics.mean(values))
    assert float(row["output_throughput_std"]) == pytest.approx(statistics.stdev(values))
    _, low, high = mean_interval(values)
    assert (float(row["output_throughput_ci95_low"]), float(row["output_throughput_ci95_high"])) == \
        (pytest.approx(low), pytest.approx(high))
    assert float(row["ttft_ms_mean_ci95_low"]) < float(row["ttft_ms_mean_mean"]) < float(row["ttft_ms_mean_ci95_high"])
    lo, hi = float(row["speedup_ci95_low"]), float(row["speedup_ci95_high"])
    assert lo < float(row["speedup_vs_original"]) < hi
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert len(runs) == sum(r.ok for r in rows)
    assert "metrics.input_throughput" in runs[0] and "metrics.recovery_pct" in runs[0]
    assert runs[0]["engine_args"] == '{"dtype": "bfloat16", "max_model_len": 4096}'


def test_no_groups_give_just_the_header():
    assert to_csv(summary_records([]), SUMMARY_FIELDS) == ",".join(SUMMARY_FIELDS) + "\n"


def test_each_summary_line_says_its_dtypes_setup_and_store(tmp_path):
    """The CSV keeps what report.md shows beside a speed-up across dtypes, and
    which of several stores a line came from."""
    from evaluate.report import build_report

    for name in ("a", "b"):
        store(tmp_path / name, auto_dtype_rows())
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "t", outputs=("csv",))
    with open(tmp_path / "out" / "summary.csv") as f:
        lines = list(csv.DictReader(f))
    w4 = [r for r in lines if r["recipe"] == "w4a16_gptq"]
    assert {r["store"] for r in w4} == {"a", "b"}
    assert all((r["baseline_dtype"], r["dtype"]) == ("float32", "bfloat16") and r["speedup_vs_original"] for r in w4)
    with open(tmp_path / "out" / "runs.csv") as f:
        runs = list(csv.DictReader(f))
    assert {r["comparison_id"] for r in runs} == {"auto-setup@a", "auto-setup@b"}


def test_both_csvs_carry_the_engines_serving_note(tmp_path):
    """hf's "decompressed to dense" note stays with its numbers in summary.csv and runs.csv."""
    from evaluate.report import build_report
    note = "weights decompressed to dense: its speed and memory are the dense model's, not the format's kernels'"
    rows = [r.but(serving_note=note) if r.recipe == "w4a16_gptq" else r for r in auto_dtype_rows()]
    store(tmp_path / "res", rows)
    build_report(tmp_path / "res", tmp_path / "out", "t", outputs=("csv",))
    for name in ("summary.csv", "runs.csv"):
        with open(tmp_path / "out" / name) as f:
            lines = list(csv.DictReader(f))
        notes = {r["recipe"]: r["serving_note"] for r in lines}
        assert notes.pop("w4a16_gptq") == note and set(notes.values()) == {""} and "original" in notes, name
