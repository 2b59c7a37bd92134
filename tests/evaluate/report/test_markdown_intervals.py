"""95% intervals of the means in report.md, the Ranking's letters of the one
significance rule (evaluate/analysis/significance.py), the overall geometric
mean over one scenario set, and how runs=auto decided each run count
(Row.precision)."""
import math
import statistics

import pytest

from evaluate.metrics import mean_interval
from evaluate.report import build_report
from evaluate.analysis.groups import add_speedups, aggregate
from evaluate.analysis.ranking import rank_overall, rank_scenarios

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
    return [line for line in block.splitlines() if line.strip() and not line.startswith(("![", "*"))]  # no plots


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


def test_means_the_rule_cannot_tell_apart_share_a_letter(tmp_path):
    rows = (speed("original", [30.0, 30.5, 29.5]) + speed("w8a8_smooth_ptq", [40.0, 40.4, 39.6])
            + speed("w4a16_gptq", [39.0, 41.5, 40.2]))  # w8a8 ± 1.0, w4a16 ± 3.1: the rule finds no difference
    assert ranking(report(tmp_path, rows)) == [
        "1. [a] w4a16_gptq — 40.23 tok/s (1.34x vs original)",
        "2. [a] w8a8_smooth_ptq — 40.00 tok/s (1.33x vs original)",
        "3. [b] original — 30.00 tok/s (1.00x vs original)"]


def test_means_that_differ_have_no_letter_in_common(tmp_path):
    rows = speed("original", [30.0, 30.5, 29.5]) + speed("w8a8_smooth_ptq", [40.0, 40.4, 39.6])
    assert ranking(report(tmp_path, rows)) == ["1. [a] w8a8_smooth_ptq — 40.00 tok/s (1.33x vs original)",
                                               "2. [b] original — 30.00 tok/s (1.00x vs original)"]


def test_letters_never_chain_neighbours():
    """w8a8 ~ w4a16 and w4a16 ~ original, but w8a8 and original differ:
    tiers of neighbours would put all three together."""
    rows = (speed("original", [30.0, 30.2, 29.8]) + speed("w8a8_smooth_ptq", [31.0, 31.2, 30.8])
            + speed("w4a16_gptq", [30.5, 31.5, 29.5]))  # wide: no difference from either
    (only,) = rank_scenarios(aggregate(rows))
    assert [(r.group.recipe, r.letters) for r in only.ranked] == [
        ("w8a8_smooth_ptq", "a"), ("w4a16_gptq", "ab"), ("original", "b")]
    (lone,) = rank_scenarios(aggregate(speed("original", [30.0]) + speed("w4a16_gptq", [30.0, 30.1])))
    assert [r.group.recipe for r in lone.ranked] == ["w4a16_gptq"]
    assert [g.recipe for g in lone.untested] == ["original"]  # a single run cannot be tested


def test_a_single_run_is_listed_apart_in_every_section(tmp_path):
    md = report(tmp_path, speed("original", [30.0, 30.3, 29.7]) + speed("w8a8_smooth_ptq", [40.0]))
    assert ranking(md) == ["1. [a] original — 30.00 tok/s (1.00x vs original)",
                           "- not ranked: w8a8_smooth_ptq — 40.00 tok/s (1.33x vs original; ⚠ 1 run: no spread "
                           "measured): a single run cannot be tested"]
    assert overall(md) == ["1. [a] original — 1.00x (95% interval 1.00–1.00)"]
    assert "- not ranked: w8a8_smooth_ptq — 1.33x; ⚠ flagged in interactive: no interval" in md


def test_a_single_run_original_is_not_ranked_first_overall(tmp_path):
    """Its speed-up over itself is 1.00x with an interval of width 0 whatever
    its runs: the overall ranked it first, above a recipe 1.33x faster that the
    scenario ranking (rightly) lists apart."""
    md = report(tmp_path, speed("original", [30.0]) + speed("w8a8_smooth_ptq", [40.0, 40.4, 39.6]))
    assert overall(md) == []
    assert "- not ranked: original — 1.00x; ⚠ flagged in interactive: no interval, a scenario has a single run" in md
    assert "- not ranked: w8a8_smooth_ptq — 1.33x; ⚠ flagged in interactive: no interval" in md


def overall(md: str) -> list[str]:
    return [line for line in md.split("**Overall**", 1)[1].splitlines() if line[:1].isdigit()]


def two_scenarios(w8a8, w4a16) -> list:
    """original at 30 and 60 tok/s; the others' runs given per scenario."""
    rows = speed("original", [30.0, 30.3, 29.7]) + speed("original", [60.0, 60.6, 59.4], "medium_batch")
    for recipe, (interactive, medium) in (("w8a8_smooth_ptq", w8a8), ("w4a16_gptq", w4a16)):
        rows += speed(recipe, interactive) + speed(recipe, medium, "medium_batch")
    return rows


def test_the_overall_speed_up_carries_its_interval_and_letters(tmp_path):
    close = two_scenarios(w8a8=([39.0, 39.4, 38.6], [78.0, 78.8, 77.2]),     # 1.30x, tight
                          w4a16=([39.9, 41.9, 37.9], [79.0, 82.0, 76.0]))    # 1.32x, wide: no difference
    lines = overall(report(tmp_path / "close", close))
    assert [line.split(" — ")[0] for line in lines] == ["1. [a] w4a16_gptq", "2. [a] w8a8_smooth_ptq",
                                                        "3. [b] original"]
    assert lines[2] == "3. [b] original — 1.00x (95% interval 1.00–1.00)"
    apart = two_scenarios(w8a8=([45.0, 45.3, 44.7], [90.0, 90.6, 89.4]),      # 1.50x
                          w4a16=([39.0, 39.4, 38.6], [78.0, 78.8, 77.2]))     # 1.30x
    assert [line.split(" — ")[0] for line in overall(report(tmp_path / "apart", apart))] == [
        "1. [a] w8a8_smooth_ptq", "2. [b] w4a16_gptq", "3. [c] original"]


def welch_log_interval(terms: list[tuple[float, list[float]]]) -> tuple[float, float]:
    """The 95% interval of exp(sum(w * log mean(runs))), computed here from scratch:
    delta-method variances, Welch-Satterthwaite degrees of freedom."""
    from evaluate.metrics import t95
    center = sum(w * math.log(statistics.mean(v)) for w, v in terms)
    parts = [(w * w * statistics.variance(v) / statistics.mean(v) ** 2 / len(v), len(v)) for w, v in terms]
    total = sum(p for p, _ in parts)
    df = total ** 2 / sum(p * p / (n - 1) for p, n in parts)
    half = t95(df) * math.sqrt(total)
    return math.exp(center - half), math.exp(center + half)


def test_the_overall_interval_is_welchs_on_the_mean_log_speed_up():
    orig = ([30.0, 30.3, 29.7], [60.0, 60.6, 59.4])
    w8a8, w4a16 = ([39.0, 39.4, 38.6], [78.0, 78.8, 77.2]), ([45.0, 45.3, 44.7], [90.0, 90.6, 89.4])
    groups = aggregate(two_scenarios(w8a8=w8a8, w4a16=w4a16))
    add_speedups(groups)
    (block,) = rank_overall(groups)
    entry = next(o for o in block.ranked if o.identity[1] == "w8a8_smooth_ptq")
    terms = [(0.5, w8a8[0]), (-0.5, orig[0]), (0.5, w8a8[1]), (-0.5, orig[1])]
    assert entry.speedup == pytest.approx(1.3)
    assert entry.interval == pytest.approx(welch_log_interval(terms))
    per = [g.speedup_ci for g in groups if g.recipe == "w8a8_smooth_ptq"]
    assert entry.interval[1] - entry.interval[0] < min(hi - lo for lo, hi in per)  # two scenarios: narrower
    # two recipes over one original: its noise cancels from their comparison
    other = next(o for o in block.ranked if o.identity[1] == "w4a16_gptq")
    between = other.contrast.minus(entry.contrast).compare()
    assert between.interval == pytest.approx(
        welch_log_interval([(0.5, w4a16[0]), (-0.5, w8a8[0]), (0.5, w4a16[1]), (-0.5, w8a8[1])]))


def test_the_overall_uses_one_scenario_set_with_flagged_speed_ups_included(tmp_path):
    """The old overall averaged each recipe over its unflagged scenarios only:
    a noisy recipe was ranked on fewer (and biased away from 1.0). Now every
    recipe is averaged over the same scenarios, and one that lacks a scenario
    is named apart."""
    rows = (two_scenarios(w8a8=([39.0, 39.4, 38.6], [78.0, 78.8, 77.2]),
                          w4a16=([45.0, 45.3, 44.7], [40.0, 80.0, 60.0]))    # CV 33 % in medium_batch
            + [r.but(recipe="w4a16_rtn", artifact_id="5e5e0000") for r in speed("w4a16_gptq", [20.0, 20.2, 19.8])])
    md = report(tmp_path, rows)
    lines = overall(md)
    w4 = next(line for line in lines if "w4a16_gptq" in line)
    assert "1.22x" in w4 and "⚠ flagged in medium_batch" in w4  # sqrt(1.5 x 1.0): both scenarios
    assert "over interactive, medium_batch (every scenario with a speed-up here" in md
    assert "- not in the overall: w4a16_rtn, no speed-up in medium_batch" in md
    assert not any("w4a16_rtn" in line for line in lines)


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
