"""One job = one Hydra run. Bad input becomes one line and a non-zero exit; in
a multirun, a failing job is recorded and the sweep goes on."""
import json
import logging
import os
import shlex
import signal
import sys
import threading
import traceback

from hydra.experimental.callback import Callback

from quantize.common.errors import UserError

log = logging.getLogger("quantbench")

FAILURE_FILE = "FAILED.json"
# A Slurm job warned that its time limit is near (submitit raises in the job).
TIME_LIMIT = ("time limit: Slurm is about to stop the job (hydra.launcher.timeout_min); completed "
              "results are kept, rerun the sweep to resume or raise hydra.launcher.timeout_min")


def run_job(fn, cfg, needs_hub: bool = False):
    """Run `fn(cfg)`, the entry point's own function, on what Hydra composed:
    run_job only wraps the entry (one-line errors, sweep failures) and reads
    nothing of `cfg`; the entry converts it to typed objects.

    `needs_hub`: the job downloads from the Hugging Face hub (hub calibration
    sets, lm-eval hub tasks); other jobs default to HF_HUB_OFFLINE=1 so they
    never wait on the network. A value the user set always wins."""
    if not needs_hub:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # SIGTERM (kill, Slurm preemption) unwinds like an exception, so `finally`
    # blocks shut engines down instead of orphaning their worker processes.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    multirun = in_multirun()
    try:
        return fn(cfg)
    except Exception as e:
        one_line = describe_error(e)
        if not multirun:
            if isinstance(e, UserError):
                print(f"error: {one_line}", file=sys.stderr)
                raise SystemExit(e.exit_code)
            raise
        log.error("job failed: %s", one_line)
        _record_failure(one_line, traceback.format_exc(), e.exit_code if isinstance(e, UserError) else 1)
        return None


def job_command(module: str, drop: tuple[str, ...] = ()) -> str | None:
    """The shell command that runs this job again on its own: the launch
    folder and the job's overrides (in a sweep, the values this job got),
    without the keys in `drop`. None outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig
    if not HydraConfig.initialized():
        return None
    overrides = HydraConfig.get().overrides
    # Of Hydra's own overrides only the search path changes what the job
    # composes; the others shape logs and launchers.
    found_in = [a for a in overrides.hydra if a.lstrip("+").startswith("hydra.searchpath=")]
    args = found_in + [a for a in overrides.task if a.lstrip("+~").partition("=")[0] not in drop]
    return " ".join(["cd", shlex.quote(os.getcwd()), "&&", "python", "-m", module, *map(shlex.quote, args)])


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def in_multirun() -> bool:
    """This job is one of a Hydra multirun (`-m`), not a run on its own."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def describe_error(e: BaseException) -> str:
    """What a failure says to the user, in FAILED.json and in result rows."""
    if isinstance(e, UserError):
        return str(e)
    # submitit raises this inside a Slurm job when Slurm's warning signal comes
    # near the time limit and the job may not be requeued (max_num_timeout=0).
    if type(e).__name__ == "UncompletedJobError" and submitit_timed_out(str(e)):
        return TIME_LIMIT
    return f"{type(e).__name__}: {e}"


def submitit_timed_out(text: str) -> bool:
    """submitit's error (or its traceback) when Slurm's time-limit warning came
    and the job may not be requeued: "Job not requeued because: timed-out ..."."""
    return "timed-out" in text


def one_line(e: BaseException, limit: int = 400) -> str:
    """describe_error cut to one line, for a result row (engines raise screenfuls)."""
    text = next((line.strip() for line in describe_error(e).splitlines() if line.strip()), type(e).__name__)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _record_failure(message: str, trace: str, exit_code: int) -> None:
    from hydra.core.hydra_config import HydraConfig
    write_failure(HydraConfig.get().runtime.output_dir, message, trace, HydraConfig.get().overrides.task, exit_code)


def write_failure(job_dir, message: str, trace: str, overrides, exit_code: int = 1) -> None:
    """The FAILED.json that `FailureSummary` lists; also written by the Slurm
    launcher for a job that Slurm ended (time limit, scancel, node failure).
    `exit_code`: the job's exit on its own (2: bad input, answered in one line; 1: a failure)."""
    with open(os.path.join(job_dir, FAILURE_FILE), "w") as f:
        json.dump({"error": message, "traceback": trace, "overrides": list(overrides), "exit_code": exit_code},
                  f, indent=2)


class FailureSummary(Callback):
    """Hydra callback: after a multirun, list the jobs that failed (each left a
    FAILED.json in its output dir) and exit non-zero if any did."""

    def on_multirun_end(self, config, **_) -> None:
        from pathlib import Path
        sweep_dir = Path(config.hydra.sweep.dir)
        failed = sorted(sweep_dir.glob(f"*/{FAILURE_FILE}"))
        total = len([p for p in sweep_dir.iterdir() if p.is_dir() and (p / ".hydra").is_dir()])
        if not failed:
            log.info("sweep finished: %d job(s) ok (%s)", total, sweep_dir)
            return
        print(f"sweep finished: {len(failed)} of {total} job(s) failed (details in {FAILURE_FILE}):",
              file=sys.stderr)
        for path in failed:
            info = json.loads(path.read_text())
            print(f"  {path.parent.name}: {' '.join(info['overrides'])}: {info['error']}", file=sys.stderr)
        raise SystemExit(1)
