"""What the evaluate stage records, or says, when a job cannot measure: a
format the engine cannot serve here, a recipe not quantized, an engine that
fails or does not finish its start."""
import pytest

from tests.conftest import run_cli, serve_verdict
from tests.evaluate.pipeline_fixtures import eval_artifacts, scen  # noqa: F401  (fixtures)
from evaluate import results
from evaluate.pipeline import DEVICE_DIED


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


def test_missing_artifact_for_recipe_names_quantize(tmp_path):
    """transformers serves W4A16 on any CPU (vLLM on an AVX2-only one has no int4
    kernel, and says so first, as the test above shows)."""
    out = run_cli("evaluate", "engine=hf", "recipe=w4a16_gptq", f"artifacts_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2
    assert "python -m quantize recipe=w4a16_gptq" in out.stderr.strip().splitlines()[-1]


@pytest.mark.needs_vllm
def test_a_start_past_its_timeout_fails_its_job_and_the_sweep_goes_on(eval_artifacts, tmp_path, scen):
    """The first job's vLLM engine core never becomes ready (it hangs, as
    tests/hosts/stalled_engine_core makes it, whatever the machine's speed or
    load): at the 5 s timeout its processes are stopped and its row is
    recorded failed; the next job (transformers: no second vLLM start)
    measures."""
    out = run_cli("evaluate", "-m", f"model={eval_artifacts['original']}", scen["test_tiny_a"], "runs=1",
                  "accuracy=none", "engine=vllm,hf", "++engine.startup_timeout_s=5",
                  f"results_dir={tmp_path}", cwd=tmp_path, host="stalled_engine_core",
                  env={"QUANTBENCH_TEST_STALL_MARKER": str(tmp_path / "stalled")})
    assert out.returncode == 1, out.stderr[-3000:]  # the sweep says a job failed
    assert (tmp_path / "stalled").is_file()  # vLLM's start was the one that hung
    rows = results.read(tmp_path)
    assert [(r.engine, r.status) for r in rows] == [("vllm", "failed"), ("hf", "ok")]
    assert rows[0].reason == ("engine start-up failed: vLLM was not ready after 5 s; raise "
                              "engine.startup_timeout_s, or see the log above for the phase it was in")


def test_engine_start_failure_records_a_failed_row_per_measurement(eval_artifacts, tmp_path, scen):
    """A checkpoint that the engine cannot load (a tensor of the wrong shape)
    fails at engine start-up; every measurement the job owed, the accuracy
    pass included, is a failed row whose reason is one line. The pipeline
    does this alike for every engine: transformers fails the start here
    (no vLLM start); vLLM's own failing start is the timeout test above."""
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
    out = run_cli("evaluate", f"model={broken}", "engine=hf", scen["test_pair"], "verify=false",
                  f"results_dir={res}", cwd=tmp_path)
    assert out.returncode != 0
    rows = results.read(res)
    assert {(r.kind, r.scenario) for r in rows} == {
        ("speed", "test_tiny_a"), ("speed", "test_tiny_b"), ("accuracy", "austen")}
    assert all(r.engine == "hf" and r.status == "failed" for r in rows)
    assert all(r.reason.startswith("engine start-up failed: ") for r in rows)
    assert all("\n" not in r.reason for r in rows)


def _failing_batch(size: int, kind: str, accuracy: bool = False) -> dict:
    """run_cli's host and env for an engine=hf whose runs of `size` requests
    (and accuracy pass, if `accuracy`) fail with `kind` (tests/hosts/failing_hf_runs)."""
    return {"host": "failing_hf_runs", "env": {"QUANTBENCH_TEST_FAIL_BATCH": str(size), "QUANTBENCH_TEST_FAIL_AS": kind,
                                                "QUANTBENCH_TEST_FAIL_ACCURACY": "1" if accuracy else "0"}}


def test_a_scenario_that_fails_on_its_own_leaves_its_rows_failed_and_the_job_goes_on(eval_artifacts, tmp_path,
                                                                                      scen):
    """A CUDA out-of-memory error at one batch size (test_tiny_a's, the first
    scenario) fails that scenario alone: its row is failed with the error's
    line, the next scenario and the accuracy pass are measured, and the job
    exits 4 naming the failure. The same command then measures only it."""
    res = tmp_path / "results"
    args = ("evaluate", f"model={eval_artifacts['original']}", "engine=hf", scen["test_pair"], "runs=1",
            f"results_dir={res}")
    out = run_cli(*args, cwd=tmp_path, **_failing_batch(1, "oom"))
    assert out.returncode == 4, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith(
        "error: 1 run(s) failed while the others were measured (the first: OutOfMemoryError: CUDA out of memory.")
    rows = {(r.kind, r.scenario): r for r in results.read(res)}
    assert {k: r.status for k, r in rows.items()} == {
        ("speed", "test_tiny_a"): "failed", ("speed", "test_tiny_b"): "ok", ("accuracy", "austen"): "ok"}
    failed = rows[("speed", "test_tiny_a")]
    assert failed.run_index == 0 and failed.reason.startswith("OutOfMemoryError: CUDA out of memory.")
    assert "\n" not in failed.reason

    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    new = results.read(res)[len(rows):]
    assert [(r.scenario, r.run_index, r.status) for r in new] == [("test_tiny_a", 0, "ok")]


def test_a_lost_device_ends_the_job_with_a_failed_row_for_every_scenario_it_owed(eval_artifacts, tmp_path, scen):
    """A CUDA error after which every kernel fails (an illegal memory access)
    at the first scenario ends the job as a dead vLLM engine does, exit 3 and
    one line: the scenario after it is recorded failed with the same line,
    never run on the lost device."""
    res = tmp_path / "results"
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf", scen["test_pair"], "runs=1",
                  "accuracy=none", f"results_dir={res}", cwd=tmp_path, **_failing_batch(1, "device_lost"))
    assert out.returncode == 3, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == "error: " + DEVICE_DIED.format(
        error="RuntimeError: CUDA error: an illegal memory access was encountered")
    assert "Traceback" not in out.stderr
    rows = results.read(res)
    assert [(r.scenario, r.status) for r in rows] == [("test_tiny_a", "failed"), ("test_tiny_b", "failed")]
    assert all(r.reason == "RuntimeError: CUDA error: an illegal memory access was encountered" for r in rows)


def test_a_lost_device_in_the_accuracy_pass_ends_the_job_as_a_dead_engine(eval_artifacts, tmp_path, scen):
    res = tmp_path / "results"
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf", scen["test_tiny_a"], "runs=1",
                  f"results_dir={res}", cwd=tmp_path, **_failing_batch(0, "device_lost", accuracy=True))
    assert out.returncode == 3, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith("error: the GPU failed mid-run (RuntimeError: CUDA error:")
    rows = {r.kind: r for r in results.read(res)}
    assert {kind: r.status for kind, r in rows.items()} == {"speed": "ok", "accuracy": "failed"}


def test_an_accuracy_pass_that_fails_on_its_own_ends_the_job_as_failed_runs(eval_artifacts, tmp_path, scen):
    """A CUDA out-of-memory error in the accuracy pass fails its row alone:
    the job goes on (to lm-eval, when asked) and ends as runs that failed,
    exit 4, not as an unexpected error."""
    res = tmp_path / "results"
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf", scen["test_tiny_a"], "runs=1",
                  f"results_dir={res}", cwd=tmp_path, **_failing_batch(0, "oom", accuracy=True))
    assert out.returncode == 4, out.stderr[-2000:]
    assert "(the first: OutOfMemoryError: CUDA out of memory." in out.stderr.strip().splitlines()[-1]
    rows = {r.kind: r for r in results.read(res)}
    assert {kind: r.status for kind, r in rows.items()} == {"speed": "ok", "accuracy": "failed"}
    assert rows["accuracy"].reason.startswith("OutOfMemoryError: CUDA out of memory.")


def test_the_launchers_time_limit_warning_ends_the_job_where_a_scenarios_own_failure_goes_on():
    """submitit's warning near a Slurm time limit is a RuntimeError: it was
    taken for one scenario's failure, and the job measured on past it."""
    from submitit.core.utils import UncompletedJobError
    from evaluate.pipeline import _ends_job
    assert _ends_job(UncompletedJobError("Job not requeued because: timed-out and not checkpointable."))
    assert not _ends_job(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
