"""Accuracy figures defined and bounded (evaluate/analysis/accuracy_bounds.py,
evaluate/report/accuracy_markdown.py): report.md says what each figure is,
recovery, KL and last-word recovery carry a 95% interval over the windows
or items the rows kept, the answer applies the floor to the point estimate
and says where the interval reaches below it, and the original's recovery
is its own row's wherever it is shown."""
import math
import random

import numpy as np
import pytest

from evaluate.analysis.accuracy_bounds import RESAMPLES, bounds, samples_of
from evaluate.analysis.groups import aggregate
from evaluate.report import build_report
from evaluate.report.formatting import MISSING

from .rows import base_row, heading, main_rows, md_tables, speed_run, store
from .test_answer import answer_table

WINDOWS, TOKENS, ITEMS = 8, 511, 64
RECOVERY = "Accuracy recovery (%, 95% CI)"
CONFIG = {"name": "austen", "text": "austen", "books": ["prideprejudice", "persuasion"], "num_windows": WINDOWS,
          "window_len": TOKENS + 1, "top_k": 20, "reference": None, "reference_device": "cpu", "enabled": True,
          "lastword": {"num_items": ITEMS, "min_words": 30, "context_tokens": 128}}


def accuracy_row(recipe: str, nats_lost: float, kl: float, hits: int, seed: int):
    """An accuracy row as evaluate writes it: per-window sums whose totals
    are the metrics, `nats_lost` more NLL per token than the reference."""
    rng = random.Random(seed)
    ref = [TOKENS * (math.log(26.0) + rng.gauss(0, 0.05)) for _ in range(WINDOWS)]
    nll = [r + TOKENS * (nats_lost + rng.gauss(0, nats_lost / 3)) for r in ref]
    kls = [TOKENS * max(kl + rng.gauss(0, kl / 4), 0.0) for _ in range(WINDOWS)]
    top1 = [round(TOKENS * 0.9) for _ in range(WINDOWS)]
    ref_hits = [1] * 14 + [0] * (ITEMS - 14)
    item_hits = [1] * hits + [0] * (ITEMS - hits)
    tokens = TOKENS * WINDOWS
    metrics = {"perplexity": math.exp(sum(nll) / tokens), "reference_perplexity": math.exp(sum(ref) / tokens),
               "recovery_pct": 100 * math.exp((sum(ref) - sum(nll)) / tokens), "kl_divergence": sum(kls) / tokens,
               "top1_agreement": sum(top1) / tokens, "lastword_accuracy": hits / ITEMS,
               "reference_lastword_accuracy": 14 / ITEMS, "lastword_recovery_pct": 100 * hits / 14,
               "scored_tokens": tokens, "lastword_items": ITEMS, "top_k": 20, "reference_dtype": "float32"}
    samples = {"window_nll": nll, "window_reference_nll": ref, "window_kl": kls, "window_top1": top1,
               "window_tokens": [TOKENS] * WINDOWS, "item_hits": item_hits, "item_reference_hits": ref_hits}
    return base_row(recipe, kind="accuracy", scenario="austen", metrics=metrics, accuracy_samples=samples,
                    accuracy_config=CONFIG)


def speed(recipe: str, outs) -> list:
    return [speed_run(recipe, "interactive", i).but(metrics={"output_throughput": v}) for i, v in enumerate(outs)]


def rows() -> list:
    """original (its engine 0.08 % off the reference), w8a8 faster at 95.5 %
    recovery, whose interval reaches below a 95 % floor."""
    return (speed("original", [30.0, 30.3, 29.7]) + speed("w8a8_smooth_ptq", [40.0, 40.4, 39.6])
            + [accuracy_row("original", 0.0008, 0.0004, 14, 1), accuracy_row("w8a8_smooth_ptq", 0.045, 0.03, 13, 3)])


@pytest.fixture(scope="module")
def md(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recovery")
    store(tmp / "res", rows())
    build_report(tmp / "res", tmp / "out", "t", outputs=("markdown",))
    return (tmp / "out" / "report.md").read_text()


def test_each_figure_is_defined(md):
    section = md.split("## Accuracy\n", 1)[1].split("\n## ", 1)[0]
    assert ("- Perplexity, KL divergence and top-1 agreement: 8 windows × 512 tokens of the held-out text `austen` "
            "(prideprejudice, persuasion), 4,088 scored tokens, from the engine's prompt logprobs (top-20;") in section
    assert ("against the reference: the artifact's unquantized base model in transformers (float32, on cpu)."
            in section)
    assert "Accuracy recovery (%) = the reference's perplexity ÷ the artifact's × 100" in section
    assert ("Last-word accuracy: 64 held-out paragraphs of ≥ 30 words, the last 128 tokens as context" in section
            and "the reference gets 14 of 64 right, so one item moves it by 7.1 points" in section)
    assert f"percentile bootstrap ({RESAMPLES} resamples) over the windows" in section


def test_recovery_kl_and_last_word_carry_their_interval(md):
    table = {r["Recipe"]: r for r in md_tables(md, "Accuracy")["austen"]}
    for recipe in ("original", "w8a8_smooth_ptq"):
        for column in ("Accuracy recovery (%, 95% CI)", "KL divergence (nats, 95% CI)",
                       "Last-word recovery (%, 95% CI)"):
            value, interval = table[recipe][column].split(" (")
            low, high = map(float, interval.rstrip(")").split("–"))
            assert low <= float(value) <= high, (recipe, column)
    lastword = table["w8a8_smooth_ptq"]["Last-word recovery (%, 95% CI)"]
    low, high = map(float, lastword.split(" (")[1].rstrip(")").split("–"))
    assert high - low > 20   # 13 of 14 reference hits: one item is 7 points, so the interval is wide


def test_the_originals_recovery_is_its_own_row_in_the_summary_and_the_answer(md):
    summary = {r["Recipe"]: r[RECOVERY] for r in md_tables(md, "Summary")[heading("interactive")]}
    accuracy = {r["Recipe"]: r["Accuracy recovery (%, 95% CI)"] for r in md_tables(md, "Accuracy")["austen"]}
    assert summary["original"].startswith("99.9 (") and accuracy["original"].startswith("99.92 (")
    assert "or 100 % by definition where it has none" in md
    assert "is 100 % by definition)" not in md


def test_the_floor_applies_to_the_point_estimate_and_says_where_the_interval_reaches_below_it(md):
    pick = answer_table(md)[heading("interactive")]
    assert pick["Use"] == "**w8a8_smooth_ptq**"
    recovery, note = pick[RECOVERY].split(" ⚠ ")
    low = float(recovery.split(" (")[1].split("–")[0])
    assert float(recovery.split(" (")[0]) >= 95.0 > low and note == "interval below 95 %"
    assert "The floor applies to the recovery's point estimate" in md


def test_each_reference_setup_is_named_with_its_own_dtype_and_device(tmp_path):
    """Two configs (the reference on a GPU in bf16, on a CPU in float32): each
    line names its own rows' dtype and device, not the first row's."""
    gpu = dict(CONFIG, reference_device="cuda")
    original, w8a8 = (r for r in rows() if r.kind == "accuracy")
    on_gpu = original.but(accuracy_config=gpu, metrics=original.metrics | {"reference_dtype": "bfloat16"})
    store(tmp_path / "res", [on_gpu, w8a8.but(metrics=w8a8.metrics | {"reference_device": "cpu"})])
    build_report(tmp_path / "res", tmp_path / "out", "t", outputs=("markdown",))
    section = (tmp_path / "out" / "report.md").read_text().split("## Accuracy\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("- Perplexity, KL divergence")]
    assert [line.rsplit("in transformers ", 1)[1] for line in lines] == ["(bfloat16, on cuda).", "(float32, on cpu)."]


def test_each_last_word_task_is_described_with_its_own_settings(tmp_path):
    """Two configs whose last-word tasks differ: the line named the first's
    paragraphs for both."""
    longer = dict(CONFIG, lastword={"num_items": ITEMS, "min_words": 60, "context_tokens": 256})
    original, w8a8 = (r for r in rows() if r.kind == "accuracy")
    store(tmp_path / "res", [original, w8a8.but(accuracy_config=longer)])
    build_report(tmp_path / "res", tmp_path / "out", "t", outputs=("markdown",))
    section = (tmp_path / "out" / "report.md").read_text().split("## Accuracy\n", 1)[1].split("\n## ", 1)[0]
    (line,) = [line for line in section.splitlines() if line.startswith("- Last-word accuracy")]
    assert "≥ 30 words, the last 128 tokens as context" in line and "≥ 60 words, the last 256 tokens" in line


def test_rows_without_per_window_values_have_no_interval_and_say_so(tmp_path):
    old = [r.but(accuracy_samples=None) if r.kind == "accuracy" else r for r in rows()]
    store(tmp_path / "res", old)
    build_report(tmp_path / "res", tmp_path / "out", "t", outputs=("markdown",))
    text = (tmp_path / "out" / "report.md").read_text()
    table = {r["Recipe"]: r for r in md_tables(text, "Accuracy")["austen"]}
    w8a8 = next(r for r in old if r.kind == "accuracy" and r.recipe == "w8a8_smooth_ptq")
    assert table["w8a8_smooth_ptq"]["Accuracy recovery (%, 95% CI)"] == f"{w8a8.metrics['recovery_pct']:.4g}"
    assert "have none (2 of 2 here): measure them again for an interval" in text
    assert "⚠ interval below" not in text


def test_the_bootstrap_is_fixed_and_tight_where_the_windows_agree():
    (group,) = aggregate([accuracy_row("w8a8_smooth_ptq", 0.045, 0.03, 13, 3)], "accuracy")
    first, again = bounds(samples_of(group)), bounds(samples_of(group))
    assert first == again   # the same store gives the same report
    same = {k: [v[0]] * len(v) for k, v in group.runs[0].accuracy_samples.items()}
    flat = bounds({k: np.asarray(v, dtype=float) for k, v in same.items()})
    low, high = flat["recovery_pct"]
    assert high - low == pytest.approx(0, abs=1e-9)


def test_an_original_without_a_row_is_100_by_definition_in_the_summary_as_in_the_answer(tmp_path):
    """Accuracy measured for w8a8 only (90 %, below the floor): the answer
    picks the original at 100 % by definition, and the Summary says the same
    rather than that its accuracy is unknown; with no accuracy rows at all
    the Summary has no recovery column to disagree with."""
    rows = [r if r.kind != "accuracy" else r.but(metrics={**r.metrics, "recovery_pct": 90.0})
            for r in main_rows() if not (r.kind == "accuracy" and r.recipe == "original")]
    for name, stored in (("some", rows), ("none", [r for r in rows if r.kind != "accuracy"])):
        store(tmp_path / name, stored)
        build_report(tmp_path / name, tmp_path / f"{name}-out", "t", outputs=("markdown",))
        md = (tmp_path / f"{name}-out" / "report.md").read_text()
        pick = answer_table(md)[heading("interactive")]
        assert pick["Use"] == "**original**" and pick[RECOVERY] == "100.0 (by definition)"
        summary = {r["Recipe"]: r for r in md_tables(md, "Summary")[heading("interactive")]}
        if name == "some":
            assert summary["original"][RECOVERY] == pick[RECOVERY]
            assert summary["w8a8_smooth_ptq"][RECOVERY] == "90.0" and summary["w4a16_gptq"][RECOVERY] == MISSING
        else:
            assert all(RECOVERY not in r for r in summary.values())
