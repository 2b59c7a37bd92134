"""The cost per 1M output tokens (evaluate/analysis/cost.py, evaluate/report/cost_markdown.py):
USD per hour ÷ (output tok/s × 3600) × 10^6 for each artifact and scenario in the Summary,
the answer and summary.csv, and under load at the level the recommendation picks; one
price for every row, one per GPU (times the GPUs a run used) or one per hardware profile;
none, said in one sentence, without a price."""
import csv

import pytest

from evaluate.analysis.cost import Prices, usd_per_million_tokens
from evaluate.report.__main__ import main
from evaluate.report.cost_markdown import COST_HEADER
from quantize.common.errors import UserError

from .rows import HARDWARE, heading, main_rows, md_tables, ok_speed, store
from .test_answer import answer_table
from .test_serving_markdown import accuracy_rows, level_metrics, recommendation, serving_store

NO_PRICE = "No cost per 1M output tokens: no price is set"


def reported(tmp_path, rows, *overrides) -> tuple[str, list[dict]]:
    """report.md and summary.csv's records of the rows, with these overrides."""
    store(tmp_path / "results", rows)
    out = tmp_path / "out"
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={out}", "output=[markdown,csv]", *overrides]) == 0
    with open(out / "summary.csv", newline="") as f:
        return (out / "report.md").read_text(), list(csv.DictReader(f))


def mean_speed(rows, recipe: str, scenario: str) -> float:
    values = [r.metrics["output_throughput"] for r in ok_speed(rows, recipe, scenario)]
    return sum(values) / len(values)


def test_the_rule():
    assert usd_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)   # 3.6 M tokens an hour for USD 3.60
    assert usd_per_million_tokens(None, 1000.0) is None and usd_per_million_tokens(2.5, None) is None


def test_one_price_gives_every_artifact_and_scenario_its_cost(tmp_path):
    rows = main_rows()
    md, records = reported(tmp_path, rows, "cost.usd_per_hour=2.5")
    for scenario in ("interactive", "medium_batch"):
        for row in md_tables(md, "Summary")[heading(scenario)]:
            expected = 2.5 / (mean_speed(rows, row["Recipe"], scenario) * 3600) * 1e6
            assert float(row[COST_HEADER]) == pytest.approx(expected, rel=1e-3)
        pick = answer_table(md)[heading(scenario)]
        assert float(pick[COST_HEADER]) == pytest.approx(
            2.5 / (mean_speed(rows, "w8a8_smooth_ptq", scenario) * 3600) * 1e6, rel=1e-3)
        assert list(pick)[-2:] == [COST_HEADER, "Runner-up"]
    assert "= USD per hour ÷ (output tok/s × 3600) × 10^6 at the mean output throughput, with USD 2.5 per hour." in md
    assert NO_PRICE not in md
    for r in records:
        assert float(r["usd_per_hour"]) == 2.5
        assert float(r["usd_per_1m_output_tokens"]) == pytest.approx(
            2.5 / (float(r["output_throughput_mean"]) * 3600) * 1e6)


def test_without_a_price_there_is_no_cost_and_one_sentence_says_so(tmp_path):
    md, records = reported(tmp_path, main_rows())
    assert md.count(NO_PRICE) == 1 and COST_HEADER not in md
    assert all(r["usd_per_hour"] == r["usd_per_1m_output_tokens"] == "" for r in records)


def test_a_price_per_hardware_profile_applies_to_the_rows_of_that_profile(tmp_path):
    rows = [r.but(hardware_defaults="cpu") for r in main_rows()]
    md, records = reported(tmp_path, rows, "cost.per_profile.cuda=2.5", "cost.per_profile.cpu=0.2")
    summary = md_tables(md, "Summary")[heading("interactive")]
    original = next(r for r in summary if r["Recipe"] == "original")
    assert float(original[COST_HEADER]) == pytest.approx(0.2 / (mean_speed(rows, "original", "interactive") * 3600)
                                                         * 1e6, rel=1e-3)
    assert {r["usd_per_hour"] for r in records} == {"0.2"}
    md, records = reported(tmp_path / "cuda", rows, "cost.per_profile.cuda=2.5")   # no price for hardware=cpu
    assert {r[COST_HEADER] for r in md_tables(md, "Summary")[heading("interactive")]} == {"—"}
    assert "; — where no price is set for a row's GPUs or hardware profile." in md


def on_gpus(row, *names: str, tp: int = 1, engine: str = "vllm"):
    return row.but(hardware={**HARDWARE, "accelerators": list(names)}, hardware_defaults="cuda", engine=engine,
                   engine_args={**row.engine_args, "tensor_parallel_size": tp})


def test_a_gpu_price_is_per_gpu_a_run_used_by_the_longest_part_of_its_name():
    prices = Prices.from_config({"per_gpu": {"H100": 2.5, "h100 nvl": 3.0, "A100": 1.3}, "per_profile": {"cuda": 9.0}})
    row = main_rows()[0]
    eight = ["NVIDIA H100 80GB HBM3"] * 8
    assert prices.of(on_gpus(row, *eight)) == 2.5                  # one of the node's 8 GPUs
    assert prices.of(on_gpus(row, *eight, tp=2)) == 5.0            # two of them
    assert prices.of(on_gpus(row, "NVIDIA H100 NVL")) == 3.0       # the longer name wins, in any case
    assert prices.of(on_gpus(row, "NVIDIA A100-SXM4-80GB")) == 1.3
    assert prices.of(on_gpus(row, "NVIDIA L40S")) == 9.0           # no GPU price: the profile's
    assert prices.of(on_gpus(row, "NVIDIA H100 80GB HBM3", tp=2)) == 9.0   # the second GPU is not recorded
    assert prices.of(on_gpus(row, *eight, engine="openai")) == 9.0  # a remote endpoint's GPUs are not these
    assert Prices.from_config({"usd_per_hour": 1.0, "per_gpu": {"H100": 2.5}}).of(on_gpus(row, *eight)) == 1.0


def test_the_report_prices_each_gpu_row_by_its_own_gpus(tmp_path):
    rows = [on_gpus(r, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", tp=2) for r in main_rows()]
    md, records = reported(tmp_path, rows, "cost.per_gpu={H100:2.5,A100:1.3}")
    summary = md_tables(md, "Summary")[heading("interactive")]
    original = next(r for r in summary if r["Recipe"] == "original")
    assert float(original[COST_HEADER]) == pytest.approx(5.0 / (mean_speed(rows, "original", "interactive") * 3600)
                                                         * 1e6, rel=1e-3)
    assert {r["usd_per_hour"] for r in records} == {"5.0"}
    assert "USD 2.5 per hour of each H100 GPU a run used" in md and "row's GPUs or hardware profile" in md


def test_a_price_that_is_not_a_positive_number_is_one_line(tmp_path, capsys):
    store(tmp_path / "results", main_rows())
    for bad in ("cost.usd_per_hour=-1", "cost.usd_per_hour=cheap", "cost.per_profile.cuda=0",
                "cost.per_gpu={H100:free}", "cost.per_gpu=2.5"):
        assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}", bad]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "price" in err[0] and "in USD per hour" in err[0], err
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError):
        Prices.from_config({"usd_per_hour": True})


def test_under_load_the_cost_is_at_the_level_that_meets_the_slo(tmp_path):
    """w8a8 sustains concurrency 8 under the SLO: its cost is at that level's output throughput."""
    md, _ = reported(tmp_path, serving_store() + accuracy_rows(), "cost.usd_per_hour=2.5")
    most = next(line for line in recommendation(md).splitlines() if line.startswith("- **Most load under the SLO**"))
    tok_s = level_metrics("w8a8_smooth_ptq", 8)["output_throughput"]
    cost = 2.5 / (tok_s * 3600) * 1e6
    assert f", USD {cost:.4g} per 1M output tokens at {tok_s:.1f} output tok/s" in most, most
    plain, _ = reported(tmp_path / "plain", serving_store() + accuracy_rows())
    assert "per 1M output tokens at" not in plain and plain.count(NO_PRICE) == 1
