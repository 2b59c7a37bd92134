"""scripts/run_matrix.sh end to end: quantize, evaluate and report through
real llm-compressor, vLLM and files, on a tiny model; and the script's own
choices (when to stop, what it passes on) with its Python stages stubbed."""
import platform
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, quantize_env
from evaluate import results


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="an x86 host is emulated")
def test_the_cpu_matrix_on_an_avx2_host_quantizes_only_what_it_can_serve(tmp_path):
    """The sweep `make run` does, as an AVX2-only host sees it: vLLM loads its
    real _C_AVX2 library (no int4 kernel), so W4A16 is not quantized but still
    recorded as unsupported with the reason and the way out; W8A8 is
    quantized, measured in float32 and reported, and the matrix exits 0.
    The one real vLLM start on an AVX2 host in the suite."""
    from quantize.common.assets import ensure_default_model
    from quantize.common.tiny_model import build_tiny_llama
    model = build_tiny_llama(tmp_path / "tiny-llama", ensure_default_model())
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text("name: tiny\nbatch_size: 1\ninput_len: 32\noutput_len: 8\n")
    env = quantize_env({"VLLM_CPU_KVCACHE_SPACE": "1", "PY": sys.executable, "RECIPES": "w8a8_smooth_ptq,w4a16_rtn",
                        "SCENARIO": str(scenario), "RUNS": "1", "RESULTS": str(tmp_path / "results"),
                        "REPORT": str(tmp_path / "reports")})

    def run_matrix(**extra_env):
        out = subprocess.run(["bash", str(ROOT / "scripts" / "as_avx2_host.sh"), "bash",
                              str(ROOT / "scripts" / "run_matrix.sh"), "cpu", f"model={model}",
                              f"artifacts_dir={tmp_path / 'artifacts'}", "engine.args.enforce_eager=true"],
                             cwd=tmp_path, env=env | extra_env, capture_output=True, text=True, timeout=1200)
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        return out

    out = run_matrix()
    assert "quantizing only what can be served here: w8a8_smooth_ptq (SERVABLE_ONLY=0 quantizes all)" in out.stdout
    assert "plan: 3 jobs (1 quantize, 2 evaluate)" in out.stdout and "progress: 3/3 done" in out.stdout
    assert "matrix cpu wall time: quantize" in out.stdout
    artifacts = tmp_path / "artifacts" / "tiny-llama"
    assert (artifacts / "w8a8_smooth_ptq" / "manifest.json").is_file() and not (artifacts / "w4a16_rtn").exists()
    rows = results.read(tmp_path / "results")
    by_recipe = {recipe: {r.status for r in rows if r.recipe == recipe} for recipe in ("w8a8_smooth_ptq", "w4a16_rtn")}
    assert by_recipe == {"w8a8_smooth_ptq": {"ok"}, "w4a16_rtn": {"unsupported"}}
    assert all("_C_AVX2" in r.reason and "engine=hf" in r.reason for r in rows if r.recipe == "w4a16_rtn")
    assert {r.engine_args["dtype"] for r in rows if r.recipe == "w8a8_smooth_ptq"} == {"float32"}
    assert all(r.machine["vllm_library"] == "_C_AVX2" and r.machine["cpu_native_half"] is False for r in rows)
    md = (tmp_path / "reports" / "report.md").read_text()
    problems = md.split("## Skipped, unsupported and failed\n", 1)[1]
    assert "| unsupported |" in problems and "w4a16_rtn" in problems
    assert "vLLM kernel library _C_AVX2 with onednn_scaled_mm" in md
    # SERVABLE_ONLY=0 builds it anyway (e.g. for another machine); it is still unsupported here
    again = run_matrix(SERVABLE_ONLY="0", RECIPES="w4a16_rtn")
    assert "quantizing only" not in again.stdout and (artifacts / "w4a16_rtn" / "manifest.json").is_file()
    assert "progress: 2/2 done" in again.stdout


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="an x86 host is emulated")
def test_make_run_prints_its_plan_first_then_k_of_n_after_each_job(tmp_path):
    """The real script, stages and llm-compressor on a tiny model, with no
    engine to start (W4A16 is unsupported on an AVX2 host, so evaluate records
    that): the plan comes before any job, every job of both stages prints
    "k/N done" with N the plan's; the next run's plan has an ETA from them."""
    from quantize.common.assets import ensure_default_model
    from quantize.common.tiny_model import build_tiny_llama
    model = build_tiny_llama(tmp_path / "tiny-llama", ensure_default_model())
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text("name: tiny\nbatch_size: 1\ninput_len: 16\noutput_len: 4\n")
    env = quantize_env({"PY": sys.executable, "RECIPES": "w4a16_rtn", "SCENARIO": str(scenario), "RUNS": "1",
                        "SERVABLE_ONLY": "0", "RESULTS": str(tmp_path / "results"),
                        "REPORT": str(tmp_path / "reports")})

    def run_matrix() -> list[str]:
        out = subprocess.run(["bash", str(ROOT / "scripts" / "as_avx2_host.sh"), "bash",
                              str(ROOT / "scripts" / "run_matrix.sh"), "cpu", f"model={model}",
                              f"artifacts_dir={tmp_path / 'artifacts'}"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        return out.stdout.splitlines()

    first = run_matrix()
    shown = "\n".join(line for line in first if line.startswith(("plan", "  ", "progress")))
    plan_at = next(i for i, line in enumerate(first) if line.startswith("plan: "))
    assert first[plan_at].startswith("plan: 2 jobs (1 quantize, 1 evaluate) on "), shown
    assert first[plan_at + 1:plan_at + 4] == [
        "  quantize: build w4a16_rtn; complete, skipped: none",
        f"  evaluate on scenario {scenario} (1 scenario) x 1 runs: 1 engine to start (measurements left: "
        "w4a16_rtn 2)", "  ETA unknown (first run on this host)"], shown
    done = [(i, line) for i, line in enumerate(first) if line.startswith("progress: ")]
    assert [line.split(",")[0] for _, line in done] == ["progress: 1/2 done", "progress: 2/2 done"], shown
    assert done[0][0] > plan_at and "ETA unknown (no evaluate job of tiny-llama measured" in done[0][1], shown
    assert re.search(r"elapsed \d+ (min \d+ )?s, ETA 0 s \(evaluate w4a16_rtn ok in (\d+ min )?\d+ s\)$",
                     done[1][1]), shown

    # the next run's plan has this host's times: what the skips and the jobs took
    plan = subprocess.run(["bash", str(ROOT / "scripts" / "as_avx2_host.sh"), sys.executable, "-m",
                           "evaluate.matrix_plan", "--quantize", "w4a16_rtn", "--evaluate", "w4a16_rtn",
                           "--scenario", str(scenario), "--runs", "2", "--results-dir", str(tmp_path / "results"),
                           "--run-file", str(tmp_path / "results" / "progress" / "run-next.json"),
                           f"model={model}", f"artifacts_dir={tmp_path / 'artifacts'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    lines = plan.stdout.splitlines()
    assert lines[1] == "  quantize: build none; complete, skipped: w4a16_rtn"
    assert lines[2].endswith("0 engines to start; nothing to measure: w4a16_rtn (every run stored or unsupported)")
    assert re.fullmatch(r"  ETA \d+ s", lines[3]), lines


def test_the_cpu_matrix_runs_until_its_interval_is_narrow(tmp_path):
    """`make run`'s preset (conf/matrix/cpu.env) asks for runs=auto: each
    scenario gets timed runs until its 95% interval is narrow enough, at most
    conf/evaluate.yaml's max_runs, which the plan counts as owed."""
    import yaml
    preset = subprocess.run(["bash", "-c", f"source {ROOT / 'conf' / 'matrix' / 'cpu.env'} && echo $RUNS"],
                            capture_output=True, text=True, check=True)
    assert preset.stdout.strip() == "auto"
    cap = yaml.safe_load((ROOT / "conf" / "evaluate.yaml").read_text())["max_runs"]
    results_dir = tmp_path / "results"
    out = subprocess.run([sys.executable, "-m", "evaluate.matrix_plan", "--quantize", "original", "--evaluate",
                          "original", "--scenario", "cpu", "--runs", preset.stdout.strip(), "--results-dir",
                          str(results_dir), "--run-file", str(results_dir / "run.json")],
                         cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    scenarios = 3  # conf/scenario/cpu.yaml
    assert f"({scenarios} scenarios) x auto runs" in out.stdout
    assert f"measurements left: original {scenarios * cap + 1}" in out.stdout  # + the accuracy pass


# --- the script's own logic, with every Python stage stubbed -----------------------------
STUB_PY = """#!/bin/sh
# PY for run_matrix.sh: logs each call's module and arguments; STUB_RC_<module> sets its exit status.
echo "$*" >> "$CALLS"
case "$2" in
  evaluate.hardware) echo cpu ;;
  evaluate.capabilities) r="${3#servable=[}"; echo "${r%]}" ;;
esac
var=STUB_RC_$(echo "$2" | tr . _)
eval "exit \\${$var:-0}"
"""


def stub_matrix(tmp_path, *args: str, extra_env: dict | None = None,
                **stage_rc: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    """run_matrix.sh with a stub PY; `stage_rc`: exit status per module (quantize=130,
    evaluate_report=2); returns the run and the modules called, in order."""
    stub = tmp_path / "python"
    stub.write_text(STUB_PY)
    stub.chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {"PATH": "/usr/bin:/bin", "PY": str(stub), "CALLS": str(calls), "RESULTS": str(tmp_path / "results"),
           "REPORT": str(tmp_path / "reports")} | {f"STUB_RC_{k}": str(v) for k, v in stage_rc.items()} | (extra_env or {})
    out = subprocess.run(["bash", str(ROOT / "scripts" / "run_matrix.sh"), *args], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    return out, [line.split()[1] for line in calls.read_text().splitlines()]


@pytest.mark.parametrize("stage, rc", [("quantize", 130), ("evaluate", 130), ("evaluate", 2)])
def test_ctrl_c_or_a_usage_error_in_a_stage_stops_the_matrix(tmp_path, stage, rc):
    """A stage that exited 130 (Ctrl-C) or 2 (a usage error, said in one line)
    ends the matrix with that status: no later stage starts."""
    out, called = stub_matrix(tmp_path, "cpu", **{stage: rc})
    assert out.returncode == rc, out.stdout + out.stderr
    assert called[-1] == stage and "evaluate.report" not in called
    assert "wall time" not in out.stdout


@pytest.mark.parametrize("rc, expected", [(130, 130), (2, 2), (1, 2)])
def test_ctrl_c_in_the_capability_check_is_exit_130(tmp_path, rc, expected):
    """The capability check (SERVABLE_ONLY=1) loads llm-compressor for some
    seconds: Ctrl-C there ended the matrix as a usage error, exit 2; it is 130
    now, and any other failure of the check still stops before any stage."""
    out, called = stub_matrix(tmp_path, "cpu", evaluate_capabilities=rc)
    assert out.returncode == expected, out.stdout + out.stderr
    assert called[-1] == "evaluate.capabilities" and "quantize" not in called


@pytest.mark.parametrize("value", ["true", "yes", "", " 1"])
def test_servable_only_other_than_0_or_1_is_refused(tmp_path, value):
    """SERVABLE_ONLY=true quantized every recipe without a word (only 1 turned the
    check on); a value other than 0 or 1 is one line naming both, exit 2."""
    out, called = stub_matrix(tmp_path, "cpu", extra_env={"SERVABLE_ONLY": value})
    if value == "":  # unset in effect: the preset's, 1
        assert out.returncode == 0 and "evaluate.capabilities" in called, out.stdout + out.stderr
        return
    assert out.returncode == 2 and called == [], out.stdout + out.stderr
    assert out.stderr == f"error: SERVABLE_ONLY={value}: use 1 (quantize only what this machine can serve, " \
                         "the default) or 0 (quantize every recipe)\n"


def test_a_failed_stage_still_runs_the_later_ones_and_exits_1(tmp_path):
    out, called = stub_matrix(tmp_path, "cpu", quantize=1)
    assert out.returncode == 1, out.stdout + out.stderr
    assert called[-3:] == ["quantize", "evaluate", "evaluate.report"]


@pytest.mark.parametrize("launcher, asks_here", [
    ([], True), (["hydra/launcher=local_parallel"], True), (["hydra/launcher=local_submitit"], True),
    (["hydra/launcher=ray_local"], True), (["hydra/launcher=slurm_local"], True),
    (["hydra/launcher=slurm_gpu"], False), (["hydra/launcher=slurm_cpu"], False),
    (["hydra/launcher=ray_gpu"], True),
    (["hydra/launcher=ray", "hydra.launcher.ray.init.address=head:6379"], False),
    (["hydra/launcher=ray_gpu", "hydra.launcher.ray.init.address=head:6379"], False),
])
def test_only_launchers_that_run_the_jobs_elsewhere_skip_the_capability_check(tmp_path, launcher, asks_here):
    """SERVABLE_ONLY asks this machine what it can serve: right for every
    launcher whose jobs run here, wrong for one that sends them to other nodes."""
    out, called = stub_matrix(tmp_path, "cpu", *launcher)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("evaluate.capabilities" in called) == asks_here
    assert ("the jobs run on other machines" in out.stdout) != asks_here


def test_a_mistyped_preset_is_one_line_naming_the_presets(tmp_path):
    """A first argument that is neither a preset nor an override (key=value)
    was taken as an override and failed later; it is refused before any stage."""
    presets = ", ".join(sorted(p.stem for p in (ROOT / "conf" / "matrix").glob("*.env")))
    out, called = stub_matrix(tmp_path, "refernce")
    assert out.returncode == 2 and called == []
    assert out.stderr == f"error: no matrix preset refernce (have: {presets})\n"
    out, called = stub_matrix(tmp_path, "runs_here=1")  # an override: the default preset
    assert out.returncode == 0 and "evaluate" in called, out.stderr


@pytest.mark.parametrize("override, only_in", [("force=true", "quantize"), ("calibration.num_samples=8", "quantize"),
                                               ("engine=hf", "evaluate")])
def test_a_setting_of_one_stage_is_named_so_whether_or_not_servable_only(tmp_path, override, only_in):
    """The real script and stages: an override only one stage has is the
    plan's one line naming that stage, exit 2, before any stage or run file;
    SERVABLE_ONLY=1 (the default) said "evaluate.capabilities has no key force"."""
    said = {}
    for servable_only in ("1", "0"):
        env = quantize_env({"PY": sys.executable, "RECIPES": "original,w4a16_rtn", "SERVABLE_ONLY": servable_only,
                            "RESULTS": str(tmp_path / "results"), "REPORT": str(tmp_path / "reports")})
        out = subprocess.run(["bash", str(ROOT / "scripts" / "run_matrix.sh"), "cpu", override], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 2, out.stdout + out.stderr
        said[servable_only] = out.stderr
    key = override.partition("=")[0]
    assert said["1"] == said["0"], said
    assert said["1"].startswith(f"error: {key} is a setting of {only_in} only") and said["1"].count("\n") == 1
    assert not (tmp_path / "results").exists() and "plan: " not in out.stdout
