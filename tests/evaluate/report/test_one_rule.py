"""One significance rule across report.md (evaluate/analysis/significance.py):
where the 95% intervals of two means overlap but the interval of their ratio
excludes 1.0, the Summary, the Ranking, the answer, summary.csv and the plots
all say the two differ; where the rule finds no difference, all say so."""
import csv
import html
import re

import pytest

from evaluate.analysis.groups import aggregate
from evaluate.analysis.significance import Contrast, Estimate, Verdict, compare, letters
from evaluate.report import build_report

from .rows import PLOTS, base_row, heading, md_tables, store
from .test_answer import answer_table

SPEEDUP = "Speed-up vs original (x, 95% CI)"
ORIGINAL = [30.0, 30.5, 29.5]                  # mean 30.0, its 95% interval 28.76–31.24
FASTER = [31.6, 32.1, 31.1]                    # 30.36–32.84: overlaps; ratio 1.05x (1.01–1.10)
SLOWER = [28.4, 28.9, 27.9]                    # 27.16–29.64: overlaps; ratio 0.95x (0.91–0.99)
SAME = [30.4, 32.4, 28.4]                      # ratio 1.01x, interval holds 1.0


def speed(recipe: str, outs: list[float], scenario: str) -> list:
    return [base_row(recipe, scenario, run_index=i, metrics={"output_throughput": v}) for i, v in enumerate(outs)]


def rows() -> list:
    """interactive: w4a16 faster; medium_batch: w4a16 slower, w8a8 no
    different; every mean's interval overlaps the original's."""
    out = speed("original", ORIGINAL, "interactive") + speed("w4a16_gptq", FASTER, "interactive")
    out += speed("original", ORIGINAL, "medium_batch") + speed("w4a16_gptq", SLOWER, "medium_batch")
    out += speed("w8a8_smooth_ptq", SAME, "medium_batch")
    return out + [base_row(r, kind="accuracy", scenario="pride_and_prejudice", metrics={"recovery_pct": 99.0})
                  for r in ("original", "w4a16_gptq", "w8a8_smooth_ptq")]


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one_rule")
    store(tmp / "res", rows())
    build_report(tmp / "res", tmp / "out", "t", outputs=("markdown", "csv", "html"))
    return (tmp / "out" / "report.md").read_text(), tmp / "out"


def test_the_rows_are_a_case_where_overlapping_means_and_the_ratio_disagree():
    groups = {(g.scenario.name, g.recipe): g for g in aggregate(rows())}
    for scenario, recipe, verdict in (("interactive", "w4a16_gptq", Verdict.HIGHER),
                                      ("medium_batch", "w4a16_gptq", Verdict.LOWER),
                                      ("medium_batch", "w8a8_smooth_ptq", Verdict.SAME)):
        ours, base = groups[scenario, recipe], groups[scenario, "original"]
        (lo, hi), (blo, bhi) = ours.interval("output_throughput"), base.interval("output_throughput")
        assert lo <= bhi and blo <= hi                   # the means' intervals overlap
        assert compare(ours.estimate(), base.estimate()).verdict is verdict


def ranking_letters(md: str, scenario: str) -> dict[str, str]:
    block = md.split("## Ranking\n", 1)[1].split(f"**{heading(scenario)}**", 1)[1].split("\n\n**", 1)[0]
    return {m[2]: m[1] for m in re.finditer(r"^\d+\. \[(\w+)\] (\S+) —", block, re.M)}


def test_summary_ranking_answer_and_csv_agree(reported):
    md, out = reported
    summary = {(h.split(" ")[0], r["Recipe"]): r[SPEEDUP] for h, t in md_tables(md, "Summary").items() for r in t}
    assert summary["interactive", "w4a16_gptq"] == "1.05x (1.01–1.10)"
    assert summary["medium_batch", "w4a16_gptq"] == "0.95x (0.91–0.99)"
    assert summary["medium_batch", "w8a8_smooth_ptq"].endswith(", no significant difference")
    fast, slow = ranking_letters(md, "interactive"), ranking_letters(md, "medium_batch")
    assert not set(fast["w4a16_gptq"]) & set(fast["original"])          # differ
    assert not set(slow["w4a16_gptq"]) & set(slow["original"])
    assert set(slow["w8a8_smooth_ptq"]) & set(slow["original"])         # no difference
    answer = answer_table(md)
    assert answer[heading("interactive")]["Use"] == "**w4a16_gptq**"
    assert answer[heading("interactive")]["Runner-up"] == "original: 30.00 tok/s, 269.1 MB"   # not "tied"
    assert answer[heading("medium_batch")]["Use"] == "**w8a8_smooth_ptq**"
    assert answer[heading("medium_batch")]["Runner-up"].endswith("(no significant difference)")
    with open(out / "summary.csv", newline="") as f:
        verdicts = {(r["scenario"], r["recipe"]): r["speedup_verdict"] for r in csv.DictReader(f)}
    assert verdicts == {("interactive", "original"): "", ("interactive", "w4a16_gptq"): "faster",
                        ("medium_batch", "original"): "", ("medium_batch", "w4a16_gptq"): "slower",
                        ("medium_batch", "w8a8_smooth_ptq"): "no significant difference"}


@pytest.mark.skipif(not PLOTS, reason="matplotlib is not installed here: no plots")
def test_the_bars_carry_the_rankings_letters(reported):
    md, out = reported
    page = html.unescape((out / "report.html").read_text())
    for scenario in ("interactive", "medium_batch"):
        svg = page.split(f'id="throughput_{scenario}-', 1)[1].split("</svg>", 1)[0]
        texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
        for recipe, mark in ranking_letters(md, scenario).items():
            mean = md_tables(md, "Summary")[heading(scenario)]
            value = next(r["Output throughput (tok/s)"] for r in mean if r["Recipe"] == recipe).split(" ± ")[0]
            assert any(f"{float(value):.1f} (" in t and t.endswith(f"[{mark}]") for t in texts), (recipe, texts)


def test_letters_split_only_what_differs():
    differ = {(0, 2), (1, 3)}
    marks = letters(range(4), lambda a, b: (a, b) in differ)
    for a in range(4):
        for b in range(a + 1, 4):
            assert bool(set(marks[a]) & set(marks[b])) != ((a, b) in differ), marks
    assert letters(range(3), lambda a, b: True) == ["a", "b", "c"]
    assert letters(range(3), lambda a, b: False) == ["a", "a", "a"]
    assert letters([], lambda a, b: True) == []


def test_a_mean_on_both_sides_cancels_and_a_single_run_is_not_tested():
    base, a = Estimate("base", 30.0, 0.5, 3), Estimate("a", 33.0, 0.5, 3)
    assert Contrast.ratio(a, base).minus(Contrast.ratio(a, base)).compare().interval == (1.0, 1.0)
    assert compare(Estimate("one", 33.0, None, 1), base).verdict is Verdict.UNTESTED
    assert compare(a, base).verdict is Verdict.HIGHER and compare(base, a).verdict is Verdict.LOWER
