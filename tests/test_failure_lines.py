"""Whatever stops a command is one `error:` line on stderr and the exit
status of its kind (quantize.common.errors.ExitCode), never a traceback:
Ctrl-C during quantize and during evaluate (130, nothing half-written, the
same command then does the rest), vLLM's engine core killed mid-run (3, a
failed row per run it owed). The trace is kept in the job's log file, and
-v prints it too. A refused evaluate makes no results folder."""
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress

import psutil
import pytest

from quantize.common.errors import ExitCode
from tests.conftest import SMALL_CALIB, quantize_env, run_cli, tail
from tests.evaluate.engines.gate import HELD
from tests.hosts.held_oneshot import HELD_IN_ONESHOT

GATED_HF = "tests.evaluate.engines.gated_hf_engine.GatedHfEngine"
GATED_VLLM = "tests.evaluate.engines.gated_vllm_engine.GatedVllmEngine"
HANG_GUARD_S = 600   # a vLLM start on 2 busy cores: past this the test has hung
# enough decode steps that a signal or a kill lands inside a timed run
LONG_RUNS = ("scenario=interactive", "scenario.input_len=16", "scenario.output_len=128", "runs=4", "accuracy=none")


def start(module: str, *args: str, cwd, host: str | None = None) -> subprocess.Popen:
    """`python -m module args` in a process group of its own, as a shell runs a command (Ctrl-C reaches the group),
    optionally with a folder of tests/hosts/ first on its PYTHONPATH."""
    env = quantize_env({"VLLM_CPU_KVCACHE_SPACE": "1"}, host)
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(proc: subprocess.Popen, phrase: str) -> None:
    """Read its output until a line holds `phrase`."""
    end = time.monotonic() + HANG_GUARD_S
    for line in proc.stdout:
        if phrase in line:
            return
        assert time.monotonic() < end, f"no {phrase!r} in time"
    raise AssertionError(f"exited with {proc.wait()} before {phrase!r}: {proc.stderr.read()[-3000:]}")


def ctrl_c(proc: subprocess.Popen) -> tuple[int, str]:
    """SIGINT to its whole process group, as Ctrl-C in a terminal; (exit status, stderr)."""
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    return proc.returncode, err


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    (line,) = [line for line in stderr.splitlines() if line.startswith("error: ")]
    return line


INTERRUPTED = ("error: interrupted (Ctrl-C): what was complete is kept and nothing half-written; rerun the same "
               "command to do the rest")


def whole_rows(results_dir) -> list[dict]:
    """The store's rows; each line whole JSON with its newline, nothing moved aside as torn."""
    path = results_dir / "results.jsonl"
    text = path.read_text()
    assert text.endswith("\n") and not list(results_dir.glob("results.jsonl.torn-*"))
    return [json.loads(line) for line in text.splitlines()]


def test_ctrl_c_during_quantize_is_one_line_and_keeps_nothing(tiny_model, tmp_path):
    """Signalled while oneshot waits (tests/hosts/held_oneshot): a tiny model's build
    would otherwise be over before a busy machine delivers the signal."""
    arts = tmp_path / "artifacts"
    proc = start("quantize", "recipe=w4a16_gptq", f"model={tiny_model}", *SMALL_CALIB, f"artifacts_dir={arts}",
                 cwd=tmp_path, host="held_oneshot")
    wait_for(proc, HELD_IN_ONESHOT)
    code, err = ctrl_c(proc)
    assert code == ExitCode.INTERRUPTED == 130
    assert one_error_line(err) == INTERRUPTED
    assert not arts.exists() or list(arts.rglob("*")) == []   # no artifact, staging folder or empty <model>/


def test_ctrl_c_during_evaluate_is_one_line_and_the_same_command_measures_the_rest(tiny_model, tmp_path):
    """Ctrl-C lands while run index 1 is held (the warm-up and run 0 go free):
    on "run 1/4" alone a busy machine could finish all four runs first."""
    gate = tmp_path / "gate"
    args = (f"model={tiny_model}", "engine=hf", *LONG_RUNS, f"engine._target_={GATED_HF}", f"+engine.gate={gate}",
            "+engine.free_runs=2", f"results_dir={tmp_path / 'results'}")
    proc = start("evaluate", *args, cwd=tmp_path)
    try:
        wait_for(proc, HELD)
        code, err = ctrl_c(proc)
    finally:
        gate.touch()  # the rerun's runs go free; a test failing early leaves no evaluate held for ever
    assert code == ExitCode.INTERRUPTED
    assert one_error_line(err) == INTERRUPTED
    kept = whole_rows(tmp_path / "results")
    assert [(r["run_index"], r["status"]) for r in kept] == [(0, "ok")]   # an interrupted run is no failure
    again = run_cli("evaluate", *args, cwd=tmp_path)
    assert again.returncode == 0, tail(again)
    assert sorted(r["run_index"] for r in whole_rows(tmp_path / "results")) == [0, 1, 2, 3]


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.needs_vllm
def test_ctrl_c_while_vllm_serves_is_one_line(tiny_model, tmp_path):
    """Ctrl-C reaches vLLM's engine core too (one process group): still the
    interruption's line, not the engine's death, and no engine left."""
    gate = tmp_path / "gate"   # run index 1 held (GatedVllmEngine): on "run 1/4" alone all four could be done first
    proc = start("evaluate", f"model={tiny_model}", *LONG_RUNS, "engine.args.enforce_eager=true",
                 f"engine._target_={GATED_VLLM}", f"+engine.gate={gate}", "+engine.free_runs=2",
                 f"results_dir={tmp_path / 'results'}", cwd=tmp_path)
    try:
        wait_for(proc, HELD)
        engine = psutil.Process(proc.pid).children(recursive=True)
        code, err = ctrl_c(proc)
    finally:
        gate.touch()  # a test that fails before the signal leaves no evaluate held for ever
    assert code == ExitCode.INTERRUPTED
    assert one_error_line(err) == INTERRUPTED
    assert [(r["run_index"], r["status"]) for r in whole_rows(tmp_path / "results")] == [(0, "ok")]
    psutil.wait_procs(engine, timeout=10)
    assert not [p for p in engine if alive(p)]


CORE_DIED = ("error: vLLM's engine core died mid-run (EngineDeadError): its log above says why (killed, or the "
             "kernel's OOM killer: dmesg | tail); the runs it owed are recorded failed, and the same command measures them")
CORE_HUNG = ("error: vLLM gave no output for 5 s (engine.stall_timeout_s): its engine is taken as hung and stopped; "
             "the runs it owed are recorded failed, and the same command measures them (raise engine.stall_timeout_s "
             "where one step can take that long)")



@pytest.mark.slow
@pytest.mark.needs_vllm
@pytest.mark.parametrize("fault, expected", [("kill", CORE_DIED), ("suspend", CORE_HUNG)], ids=["killed", "hung"])
def test_vllms_engine_core_killed_or_hung_mid_run_is_one_line_and_a_failed_row_per_owed_run(
        tiny_model, tmp_path, fault, expected):
    """Killed: vLLM says its engine core is dead. Hung (SIGSTOP, as a wedged
    kernel): no output for engine.stall_timeout_s stops the engine, not wait
    for ever. Either way one line, and the runs owed are failed rows."""
    # Run index 1 must be under way when the signal lands. Signalling on the
    # "run 1/4" line (run index 0 done) raced it: on busy cores its 128 tokens
    # could be done first, and it was recorded ok; a longer run only makes that
    # rarer. The real vLLM engine, gated (tests/evaluate/engines/gated_vllm_engine.py),
    # holds its third run (the warm-up, run index 0, then 1) before its requests
    # reach vLLM until the gate file exists, which the test creates only after
    # signalling: run index 1 surely meets a dead or stopped core, at any speed.
    gate = tmp_path / "gate"
    proc = start("evaluate", f"model={tiny_model}", *LONG_RUNS, "warmup_runs=1", "engine.args.enforce_eager=true",
                 "engine.stall_timeout_s=5", f"engine._target_={GATED_VLLM}", f"+engine.gate={gate}",
                 "+engine.free_runs=2", f"results_dir={tmp_path / 'results'}", cwd=tmp_path)
    wait_for(proc, HELD)
    try:
        (core,) = [p for p in psutil.Process(proc.pid).children(recursive=True) if "EngineCore" in p.name()]
        try:
            getattr(core, fault)()
            gate.touch()
            _, err = proc.communicate(timeout=HANG_GUARD_S)
            left_behind = alive(core)
        finally:
            with suppress(psutil.NoSuchProcess):
                core.kill()
    finally:
        gate.touch()  # a test that fails before opening it leaves no evaluate held for ever
    assert proc.returncode == ExitCode.ENGINE_DIED, err[-3000:]
    line = one_error_line(err)
    assert line == expected
    rows = whole_rows(tmp_path / "results")
    assert [(r["run_index"], r["status"]) for r in rows] == [(0, "ok"), (1, "failed"), (2, "failed"), (3, "failed")]
    assert all(r["reason"] == line.removeprefix("error: ") for r in rows[1:])
    assert not left_behind  # evaluate stopped the hung core too


def test_the_trace_is_in_the_jobs_log_and_v_prints_it(tmp_path):
    missing = tmp_path / "no-such-model"
    quiet = run_cli("quantize", "recipe=original", f"model={missing}", cwd=tmp_path)
    assert quiet.returncode == ExitCode.BAD_INPUT and "Traceback" not in quiet.stderr
    (log,) = (tmp_path / "logs" / "quantize").glob("*/quantize.log")
    assert "trace of the failure:\nTraceback (most recent call last):" in log.read_text()
    loud = run_cli("quantize", "-v", "recipe=original", f"model={missing}", cwd=tmp_path)
    assert loud.returncode == ExitCode.BAD_INPUT
    assert "Traceback (most recent call last):" in loud.stderr
    assert loud.stderr.strip().splitlines()[-1] == one_error_line(quiet.stderr)


def test_a_refused_evaluate_makes_no_results_folder(tiny_model, tmp_path):
    """Refused after the store was found writable: the folder is made with the first row only."""
    proc = run_cli("evaluate", f"model={tiny_model}", "engine=hf", "engine.args.max_model_len=99999",
                   f"results_dir={tmp_path / 'results'}", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, tail(proc)
    assert "max_model_len=99999 is past the" in one_error_line(proc.stderr)
    assert not (tmp_path / "results").exists()
