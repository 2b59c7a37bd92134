"""A figure beside a verdict about a boundary is never rounded onto it
(significance.on_its_side): a speed-up of 0.996, "slower", reads 0.996x, not
1.00x, in the Overall ranking and Across stores as in the scenario's Ranking;
the answer's pick whose recovery interval reaches below the floor shows a
lower bound below it."""
from evaluate.analysis.accuracy_bounds import Recovery
from evaluate.analysis.choice import Choice, Passed
from evaluate.report import build_report
from evaluate.report.answer_markdown import pick_recovery
from evaluate.scenarios import Scenario

from .rows import base_row, md_tables, store

JITTER = (0.999, 1.0, 1.001)   # steady runs: a 0.4 % difference is one the rule finds


def runs(recipe: str, factor: float) -> list:
    return [base_row(recipe, "interactive", run_index=i, metrics={"output_throughput": 30.0 * factor * j})
            for i, j in enumerate(JITTER)]


def section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_overall_keeps_a_slower_speed_up_below_one(tmp_path):
    store(tmp_path / "results", runs("original", 1.0) + runs("w8a8_smooth_ptq", 0.996))
    build_report(tmp_path / "results", tmp_path / "out", "t", outputs=("markdown",))
    ranking = section((tmp_path / "out" / "report.md").read_text(), "Ranking")
    overall = ranking.split("**Overall**", 1)[1]
    assert "w8a8_smooth_ptq — 0.996x (95% interval 0.99–0.998)" in overall
    assert "(0.996x vs original)" in ranking.split("**Overall**", 1)[0]   # as the scenario's Ranking says


def test_across_stores_keeps_a_slower_ratio_below_one(tmp_path):
    store(tmp_path / "a", runs("original", 1.0) + runs("w8a8_smooth_ptq", 1.0))
    store(tmp_path / "b", runs("original", 0.996) + runs("w8a8_smooth_ptq", 0.996))
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "t", outputs=("markdown",))
    (table,) = md_tables((tmp_path / "out" / "report.md").read_text(), "Across stores").values()
    cells = [row["Store b ÷ store a (x, 95% CI)"] for row in table]
    assert cells == ["0.996x (0.99–0.998), slower"] * 2


def test_the_pick_shows_its_interval_below_the_floor_below_it():
    c = Choice(Scenario("interactive", 1, 128, 64), "m", 95.0, Passed(None, Recovery(95.4, (94.96, 95.8), True)))
    assert pick_recovery(c) == "95.4 (94.96–95.8) ⚠ interval below 95 %"
    above = Choice(c.scenario, "m", 95.0, Passed(None, Recovery(95.4, (95.04, 95.8), True)))
    assert pick_recovery(above) == "95.4 (95.04–95.8)"
