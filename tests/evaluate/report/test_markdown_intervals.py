"""95% intervals of the means in report.md, "no significant difference" in
the ranking where two artifacts' intervals of output throughput overlap, and
how runs=auto decided each run count (Row.precision)."""
import math
import statistics

import pytest

from evaluate.metrics import mean_interval
from evaluate.report import build_report
from evaluate.analysis.groups import add_speedups, aggregate, overall_ranking, tiers

from .rows import SCENARIOS, base_row, heading, main_rows, md_tables, ok_speed, store

CI = "Output throughput 95% CI (tok/s)"


def speed(recipe: str, outs, scenario: str = "interactive", **changes) -> list:
    """Rows of `recipe` in `scenario` with these output throughputs, one per run."""
    return [base_row(recipe, scenario, run_index=i, metrics={"output_throughput": v}, **changes)
            for i, v in enumerate(outs)]


def report(tmp_path, rows) -> str:
    store(tmp_path / "res", rows)
    build_report(tmp_path / "res", tmp_path / "out", "t")
    return (tmp_path / "out" / "report.md").read_text()


def ranking(md: str, scenario: str = "interactive") -> list[str]:
    section = md.split("## Ranking\n", 1)[1].split("**Overall**", 1)[0]
    block = section.split(f"**{heading(scenario)}**", 1)[1].split("\n\n**", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_each_artifact_shows_the_interval_of_its_mean_output_throughput(tmp_path):
    rows = main_rows()
    summary = md_tables(report(tmp_path, rows), "Speed in detail")
    for scenario in SCENARIOS:
        for row in summary[heading(scenario)]:
            _, lo, hi = mean_interval([r.metrics["output_throughput"] for r in ok_speed(rows, row["Recipe"], scenario)])
            assert row[CI] == f"{lo:.2f}–{hi:.2f}"
            mean = statistics.mean(r.metrics["output_throughput"] for r in ok_speed(rows, row["Recipe"], scenario))
            assert lo < mean < hi


def test_a_single_run_has_no_interval(tmp_path):
    md = report(tmp_path, speed("original", [30.0]) + speed("w8a8_smooth_ptq", [40.0, 41.0]))
    table = {r["Recipe"]: r for r in md_tables(md, "Speed in detail")[heading("interactive")]}
    assert table["original"][CI] == "—" and table["w8a8_smooth_ptq"][CI] == "34.15–46.85"  # t(1 df) = 12.7


def test_overlapping_intervals_share_a_line_saying_no_significant_difference(tmp_path):
    rows = (speed("original", [30.0, 30.5, 29.5]) + speed("w8a8_smooth_ptq", [40.0, 40.4, 39.6])
            + speed("w4a16_gptq", [39.0, 41.5, 40.2]))  # w8a8 ± 1.0, w4a16 ± 3.1: they overlap
    lines = ranking(report(tmp_path, rows))
    assert lines[0].startswith("1. no significant difference (95% intervals of output throughput overlap): ")
    assert "w8a8_smooth_ptq — 40.00 tok/s" in lines[0] and "w4a16_gptq — 40.23 tok/s" in lines[0]
    assert lines[1] == "3. original — 30.00 tok/s (1.00x vs original)"  # places go on after a tie
    assert len(lines) == 2


def test_separate_intervals_are_ranked_one_per_line(tmp_path):
    rows = speed("original", [30.0, 30.5, 29.5]) + speed("w8a8_smooth_ptq", [40.0, 40.4, 39.6])
    lines = ranking(report(tmp_path, rows))
    assert lines == ["1. w8a8_smooth_ptq — 40.00 tok/s (1.33x vs original)",
                     "2. original — 30.00 tok/s (1.00x vs original)"]
    assert "no significant difference" not in "\n".join(lines)


def test_tiers_chain_neighbours_whose_intervals_overlap():
    rows = (speed("original", [30.0, 30.2, 29.8]) + speed("w8a8_smooth_ptq", [31.0, 31.2, 30.8])
            + speed("w4a16_gptq", [30.5, 31.5, 29.5]))  # wide: overlaps both
    groups = aggregate(rows)
    assert [[g.recipe for g in tier] for tier in tiers(groups)] == [["w8a8_smooth_ptq", "w4a16_gptq", "original"]]
    lone = aggregate(speed("original", [30.0]) + speed("w4a16_gptq", [30.0]))
    assert len(tiers(lone)) == 2  # without an interval nothing overlaps (the flag says why)


def overall(md: str) -> list[str]:
    return [line for line in md.split("**Overall**", 1)[1].splitlines() if line[:1].isdigit()]


def two_scenarios(w8a8, w4a16) -> list:
    """original at 30 and 60 tok/s; the others' runs given per scenario."""
    rows = speed("original", [30.0, 30.3, 29.7]) + speed("original", [60.0, 60.6, 59.4], "medium_batch")
    for recipe, (interactive, medium) in (("w8a8_smooth_ptq", w8a8), ("w4a16_gptq", w4a16)):
        rows += speed(recipe, interactive) + speed(recipe, medium, "medium_batch")
    return rows


def test_the_overall_speed_up_carries_its_interval_and_ties_share_a_line(tmp_path):
    close = two_scenarios(w8a8=([39.0, 39.4, 38.6], [78.0, 78.8, 77.2]),     # 1.30x, tight
                          w4a16=([39.9, 41.9, 37.9], [79.0, 82.0, 76.0]))    # 1.32x, wide: overlaps
    lines = overall(report(tmp_path / "close", close))
    assert len(lines) == 2 and lines[0].startswith("1. no significant difference (95% intervals of the speed-up "
                                                   "overlap): ")
    assert "w8a8_smooth_ptq — 1.30x over 2 scenario(s)" in lines[0] and "w4a16_gptq — 1.32x" in lines[0]
    assert lines[1].startswith("3. original — 1.00x over 2 scenario(s): interactive, medium_batch "
                               "(95% interval 1.00–1.00)")
    apart = two_scenarios(w8a8=([45.0, 45.3, 44.7], [90.0, 90.6, 89.4]),      # 1.50x
                          w4a16=([39.0, 39.4, 38.6], [78.0, 78.8, 77.2]))     # 1.30x
    assert [line.split(" — ")[0] for line in overall(report(tmp_path / "apart", apart))] == [
        "1. w8a8_smooth_ptq", "2. w4a16_gptq", "3. original"]


def test_the_overall_interval_combines_the_scenarios_in_log_space():
    groups = aggregate(two_scenarios(w8a8=([39.0, 39.4, 38.6], [78.0, 78.8, 77.2]),
                                     w4a16=([45.0, 45.3, 44.7], [90.0, 90.6, 89.4])))
    add_speedups(groups)
    entry = next(o for o in overall_ranking(groups) if o.identity[1] == "w8a8_smooth_ptq")
    per = [g.speedup_ci for g in groups if g.recipe == "w8a8_smooth_ptq"]
    halves = [(math.log(hi) - math.log(lo)) / 2 for lo, hi in per]
    half = math.sqrt(sum(h * h for h in halves)) / 2
    assert entry.speedup == pytest.approx(1.3)
    assert entry.interval == pytest.approx((1.3 * math.exp(-half), 1.3 * math.exp(half)))
    assert entry.interval[1] - entry.interval[0] < min(hi - lo for lo, hi in per)  # two scenarios: narrower


def auto(runs: int, stopped, ci, warmups=None) -> dict:
    p = {"rule": "auto", "runs": runs, "min_runs": 3, "max_runs": 5, "target_ci_pct": 5.0,
         "achieved_ci_pct": ci, "stopped": stopped}
    return p | ({"warmup_runs": warmups} if warmups else {})


def test_the_run_count_decision_is_shown_in_summary_and_details(tmp_path):
    met = speed("original", [30.0, 30.1, 29.9])
    met = [r.but(precision=auto(i + 1, "target met" if i == 2 else None, [None, 2.1, 0.8][i], 3))
           for i, r in enumerate(met)]
    capped = speed("w8a8_smooth_ptq", [40.0, 44.0, 36.0, 41.0, 39.0])
    capped = [r.but(precision=auto(i + 1, "max_runs reached" if i == 4 else None, 9.6)) for i, r in enumerate(capped)]
    fixed = speed("w4a16_gptq", [20.0, 20.1, 19.9])
    md = report(tmp_path, met + capped + fixed)
    summary = {r["Recipe"]: r["Runs (n)"] for r in md_tables(md, "Speed in detail")[heading("interactive")]}
    assert summary == {"original": "3 (auto: target met)", "w8a8_smooth_ptq": "5 (auto: cap reached)",
                       "w4a16_gptq": "3"}
    details = {(r["Recipe"], r["Run"]): r["Run count decision"]
               for r in md_tables(md, "Detailed runs")[heading("interactive")]}
    assert details["original", "run 1"] == "auto: —, target 5 %: continued; 3 warm-up runs (auto)"
    assert details["original", "run 2"] == "auto: ±2.1 %, target 5 %: continued; 3 warm-up runs (auto)"
    assert details["original", "run 3"] == "auto: target met (±0.8 % ≤ 5 %); 3 warm-up runs (auto)"
    assert details["w8a8_smooth_ptq", "run 5"] == "auto: cap reached at max_runs=5 (±9.6 % > 5 %)"
    assert details["w4a16_gptq", "run 1"] == "fixed"


def test_an_interrupted_auto_scenario_says_so(tmp_path):
    rows = [r.but(precision=auto(i + 1, None, 7.0)) for i, r in enumerate(speed("original", [30.0, 33.0]))]
    md = report(tmp_path, rows)
    assert md_tables(md, "Speed in detail")[heading("interactive")][0]["Runs (n)"] == "2 (auto: interrupted)"


@pytest.mark.parametrize("section", ["Speed in detail", "Detailed runs"])
def test_a_store_without_precision_keeps_its_columns(tmp_path, section):
    table = md_tables(report(tmp_path, main_rows()), section)[heading("interactive")]
    assert "Run count decision" not in table[0]
    if section == "Speed in detail":
        assert {r["Runs (n)"] for r in table} == {"3"}
