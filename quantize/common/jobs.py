"""One job = one Hydra run, and how every command ends: whatever stops it
(bad input, a dead engine, a full disk, Ctrl-C, a bug) is one `error:` line
on stderr and the exit status of its kind (quantize.common.errors.ExitCode);
its trace goes to the job's log file, and to stderr too with -v. In a
multirun, a failing job is recorded and the sweep goes on (Ctrl-C stops it)."""
import json
import logging
import os
import shlex
import signal
import sys
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, NoReturn

from hydra.experimental.callback import Callback

from quantize.common import atomic
from quantize.common.credentials import (check_folder_names, hide_typed, keep_out_of_logs, may_hold_typed,
                                         redact_override)
from quantize.common.errors import DiskFull, Interrupted, OneLineError, UserError, first_line, is_no_room

log = logging.getLogger("quantbench")

FAILURE_FILE = "FAILED.json"
# A submitit job (Slurm or local) warned that its time limit is near (submitit raises in the job).
TIME_LIMIT = ("time limit: the launcher is about to stop the job (hydra.launcher.timeout_min); completed "
              "results are kept, rerun the sweep to resume or raise hydra.launcher.timeout_min")
INTERRUPTED = ("interrupted (Ctrl-C): what was complete is kept and nothing half-written; rerun the same "
               "command to do the rest")
# -v on any command line: a failure's trace is printed on stderr too (the entry
# point takes the flag off before Hydra reads the arguments, and sets this for the job).
VERBOSE_ENV = "QUANTBENCH_VERBOSE"
VERBOSE_FLAGS = ("-v", "--verbose")


def run_job(fn, cfg, needs_hub: bool = False):
    """Run `fn(cfg)`, the entry point's own function, on what Hydra composed:
    run_job only wraps the entry (one-line errors, sweep failures) and reads
    nothing of `cfg`; the entry converts it to typed objects.

    `needs_hub`: the job downloads from the Hugging Face hub (hub calibration
    sets, lm-eval hub tasks); other jobs default to HF_HUB_OFFLINE=1 so they
    never wait on the network, for that job only. A value the user set always wins."""
    # SIGTERM (kill, Slurm preemption) unwinds like an exception, so `finally`
    # blocks shut engines down instead of orphaning their worker processes.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with offline_unless_set(not needs_hub):
            return fn(cfg)
    except (Exception, KeyboardInterrupt) as e:
        failure = as_one_line(e)
        keep_trace(e)
        if not in_multirun() or isinstance(failure, Interrupted):  # Ctrl-C stops the whole sweep
            end(failure)
        log.error("job failed: %s", failure)
        _record_failure(str(failure), traceback.format_exc(), failure.exit_code)
        return None


@contextmanager
def offline_unless_set(offline: bool) -> Iterator[None]:
    """HF_HUB_OFFLINE=1 for this block if `offline` and no one set it, put
    back as it was after it, in os.environ and in the hub libraries loaded
    meanwhile: a later job of the same process (a sweep, a reused worker)
    must not inherit one job's value."""
    set_here = offline and "HF_HUB_OFFLINE" not in os.environ
    if set_here:
        os.environ["HF_HUB_OFFLINE"] = "1"
    _sync_offline()
    try:
        yield
    finally:
        if set_here:
            os.environ.pop("HF_HUB_OFFLINE", None)
        _sync_offline()


def _sync_offline() -> None:
    """The loaded hub libraries keep the offline flag as read at their import:
    read it again from os.environ, as they do."""
    def true(value: str | None) -> bool:
        return (value or "").upper() in ("1", "ON", "YES", "TRUE")
    hub = true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    if "huggingface_hub.constants" in sys.modules:
        sys.modules["huggingface_hub.constants"].HF_HUB_OFFLINE = hub
    if "datasets.config" in sys.modules:
        own = os.environ.get("HF_DATASETS_OFFLINE")
        datasets = sys.modules["datasets.config"]
        datasets.HF_HUB_OFFLINE = datasets.HF_DATASETS_OFFLINE = hub if own is None else true(own)


def as_one_line(e: BaseException) -> OneLineError:
    """What any exception says to the user: the one line and the exit status
    of its kind. One that is none of the known kinds says where its trace is."""
    if isinstance(e, KeyboardInterrupt) or interrupted():
        return Interrupted(INTERRUPTED)
    if isinstance(e, OneLineError):
        return e
    if is_no_room(e):
        return DiskFull(f"no room to write: {first_line(e)}; free some space (df -h shows where), or write to "
                        "another disk (artifacts_dir=, results_dir=)")
    if time_limit_reached(e):
        return OneLineError(TIME_LIMIT)
    where = log_file()
    return OneLineError(f"{type(e).__name__}: {first_line(e)} (unexpected: its trace is in "
                        f"{where or 'no log file'}; -v prints it)")


def end(failure: OneLineError):
    """Say `failure` in one line on stderr and exit with its status."""
    print(f"error: {hide_typed(str(failure))}", file=sys.stderr)
    raise SystemExit(int(failure.exit_code)) from None


def keep_trace(e: BaseException) -> None:
    """The trace of `e` into the job's log file only (its console handler
    would print it), and on stderr with -v."""
    trace = "".join(traceback.format_exception(e))
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "trace of the failure:\n%s", (trace,), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
    if os.environ.get(VERBOSE_ENV):
        print(hide_typed(trace), file=sys.stderr, end="")


def log_file() -> str | None:
    """The job's log file (Hydra's job logging writes one), if any."""
    return next((h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)), None)


_sigint = threading.Event()


def _on_sigint(signum, frame):
    """Ctrl-C, remembered: a failure it causes on its way out (an engine whose
    processes got it too) is still reported as the interruption it is."""
    _sigint.set()
    raise KeyboardInterrupt


def interrupted() -> bool:
    return _sigint.is_set()


def take_verbose(argv: list[str]) -> list[str]:
    """`argv` without -v/--verbose; either one sets VERBOSE_ENV for the job."""
    if any(arg in VERBOSE_FLAGS for arg in argv):
        os.environ[VERBOSE_ENV] = "1"
    return [arg for arg in argv if arg not in VERBOSE_FLAGS]


def run_command(main: Callable[[], int | None], module: str, config_name: str) -> NoReturn:
    """Every entry point's outermost frame (its __main__): -v comes off the
    command line, Ctrl-C anywhere is exit 130, and Hydra raises its own
    errors here (HYDRA_FULL_ERROR) instead of printing them, to be said in one
    line naming the nearest key (quantize.common.hydra_errors). `main`
    returns the exit status (None: 0)."""
    from quantize.common import hydra_errors
    sys.argv[1:] = take_verbose(sys.argv[1:])
    keep_out_of_logs(sys.argv[1:])   # before Hydra logs a sweep's jobs, overrides and all
    signal.signal(signal.SIGINT, _on_sigint)
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        code = main()
    except (Exception, KeyboardInterrupt) as e:
        failure = hydra_errors.as_user_error(e, module, config_name, sys.argv[1:]) or as_one_line(e)
        keep_trace(e)
        _list_other_failures(e)
        end(failure)
    raise SystemExit(code or 0)


def job_command(module: str, drop: tuple[str, ...] = ()) -> str | None:
    """The shell command that runs this job again on its own: the launch
    folder and the job's overrides (in a sweep, the values this job got),
    without the keys in `drop`, a URL's password as *** (the command is
    written to manifests and rows). None outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig
    if not HydraConfig.initialized():
        return None
    overrides = HydraConfig.get().overrides
    # Of Hydra's own overrides only the search path changes what the job
    # composes; the others shape logs and launchers.
    found_in = [a for a in overrides.hydra if a.lstrip("+").startswith("hydra.searchpath=")]
    args = found_in + [redact_override(a) for a in overrides.task if a.lstrip("+~").partition("=")[0] not in drop]
    return " ".join(["cd", shlex.quote(os.getcwd()), "&&", "python", "-m", module, *map(shlex.quote, args)])


def _hide_job_passwords() -> None:
    """A URL's password in this job's overrides kept out of its log lines
    (a job a launcher started in another process too) and out of the
    .hydra/ files and multirun.yaml that Hydra wrote before the job started."""
    from hydra.core.hydra_config import HydraConfig
    if not HydraConfig.initialized():
        return
    config = HydraConfig.get()
    keep_out_of_logs([*config.overrides.hydra, *config.overrides.task])
    saved = []
    if config.output_subdir is not None:
        saved = [Path(config.runtime.output_dir) / config.output_subdir / name
                 for name in ("config.yaml", "hydra.yaml", "overrides.yaml")]
    if in_multirun():
        saved.append(Path(config.runtime.cwd) / config.sweep.dir / "multirun.yaml")
    for path in saved:
        _hide_in_yaml(path)


def _hide_in_yaml(path: Path) -> None:
    """`path` (a YAML file) rewritten with each typed password as ***, if it
    holds one; read as YAML, so a value Hydra wrote quoted or folded is found too."""
    import yaml
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    if not may_hold_typed(text):
        return
    saved = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    shown = _hide_in_values(saved)
    if shown != saved:
        atomic.write_text(path, yaml.dump(shown, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                                          sort_keys=False, allow_unicode=True))


def _hide_in_values(values):
    if isinstance(values, dict):
        return {_hide_in_values(k): _hide_in_values(v) for k, v in values.items()}
    if isinstance(values, list):
        return [_hide_in_values(v) for v in values]
    return hide_typed(values) if isinstance(values, str) else values


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def in_multirun() -> bool:
    """This job is one of a Hydra multirun (`-m`), not a run on its own."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def swept_keys() -> tuple[str, ...]:
    """The override keys this job's multirun sweeps (`seed=0,1`: seed), from
    the multirun.yaml Hydra's sweeper writes first; () outside a multirun or
    where that file is not there to read."""
    if not in_multirun():
        return ()
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    import yaml
    saved = Path(HydraConfig.get().sweep.dir) / "multirun.yaml"
    if not saved.is_file():
        return ()
    overrides = ((yaml.safe_load(saved.read_text()) or {}).get("hydra") or {}).get("overrides", {}).get("task") or []
    parsed = OverridesParser.create().parse_overrides([str(o) for o in overrides])
    return tuple(o.key_or_group for o in parsed if o.is_sweep_override())


def describe_error(e: BaseException) -> str:
    """What a failure says in a result row: its own line, or its type and text."""
    if isinstance(e, OneLineError):
        return str(e)
    if time_limit_reached(e):
        return TIME_LIMIT
    return f"{type(e).__name__}: {e}"


def time_limit_reached(e: BaseException) -> bool:
    """submitit raised this inside a Slurm job: Slurm's warning signal came
    near the time limit and the job may not be requeued (max_num_timeout=0)."""
    return type(e).__name__ == "UncompletedJobError" and submitit_timed_out(str(e))


def submitit_timed_out(text: str) -> bool:
    """submitit's error (or its traceback) when Slurm's time-limit warning came
    and the job may not be requeued: "Job not requeued because: timed-out ..."."""
    return "timed-out" in text


def one_line(e: BaseException, limit: int = 400) -> str:
    """describe_error cut to one line, for a result row (engines raise screenfuls)."""
    text = next((line.strip() for line in describe_error(e).splitlines() if line.strip()), type(e).__name__)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _record_failure(message: str, trace: str, exit_code: int) -> None:
    """FAILED.json in the job's dir. On a disk too full for it, an empty one
    still marks the job failed for the summary and progress, whichever
    process they run in (it reads as unreadable, naming the job dir); where
    not even that can be made, the job raises and the sweep ends on its error."""
    from hydra.core.hydra_config import HydraConfig
    job_dir = HydraConfig.get().runtime.output_dir
    try:
        write_failure(job_dir, message, trace, HydraConfig.get().overrides.task, exit_code)
    except OSError as e:
        path = Path(job_dir) / FAILURE_FILE
        log.error("the failure could not be written to %s: %s", path, first_line(e))
        if not _mark_failed(path):
            unrecorded = OneLineError(f"{message} (and its {FAILURE_FILE} could not be written: {first_line(e)})")
            unrecorded.exit_code = exit_code
            # Hydra skips FailureSummary: run_command lists the sweep's other failures (an attribute survives pickling)
            unrecorded.sweep_dir = str(Path(HydraConfig.get().runtime.cwd) / HydraConfig.get().sweep.dir)
            raise unrecorded from e


def _mark_failed(path: Path) -> bool:
    """An empty `path`, if none is there: a new file needs no data block, so a
    full disk usually allows it. False: there is no `path` for readers to see."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666))
        return True
    except OSError:
        return path.exists()


def write_failure(job_dir, message: str, trace: str, overrides, exit_code: int = 1) -> None:
    """The FAILED.json that `FailureSummary` lists, written whole or not at
    all; also written by the Slurm and local submitit launchers for a job that
    ended without a result (time limit, scancel, node failure, killed by a signal).
    `exit_code`: the job's exit on its own (2: bad input, answered in one line; 1: a failure).
    A URL's password in an override is hidden: the sweep's summary prints them."""
    atomic.write_json(Path(job_dir) / FAILURE_FILE, {"error": hide_typed(message), "traceback": hide_typed(trace),
                                                     "exit_code": exit_code,
                                                     "overrides": [redact_override(str(o)) for o in overrides]})


def read_failure(path: Path) -> dict:
    """A FAILED.json's error, traceback and overrides; one that cannot be read
    (a hand edit, a disk that filled as an older version wrote it) is a
    failure that says so and names its job dir."""
    try:
        info = json.loads(Path(path).read_text())
        return {"error": str(info["error"]), "traceback": str(info.get("traceback", "")),
                "overrides": [str(o) for o in info.get("overrides", [])]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return {"error": f"failed; its {FAILURE_FILE} is unreadable ({first_line(e)}): see {Path(path).parent}",
                "traceback": "", "overrides": []}


# This process's multirun: the folder of each job its launcher ran, which may be
# outside the sweep folder (hydra.sweep.dir=out/${x}, a hydra.sweep.subdir
# outside it). The launchers note them (note_jobs); FailureSummary looks there too.
_job_dirs: list[Path] = []


def note_jobs(returns) -> None:
    """The folder of each of a launcher's JobReturns, for FailureSummary."""
    for ret in returns:
        out = ret.hydra_cfg.hydra.runtime.output_dir if ret.hydra_cfg is not None else ret.working_dir
        if out:
            _job_dirs.append(Path(str(out)))


class FailureSummary(Callback):
    """Hydra callback of each entry that writes a job folder: after a multirun,
    list the jobs that failed (each left a FAILED.json in its output dir) and
    exit non-zero if any did. Also keeps a typed password out of each job's
    folder and lines, wherever its launcher runs it."""

    def on_run_start(self, config, **_) -> None:
        self._check_folder_names(config, "run")

    def on_multirun_start(self, config, **_) -> None:
        _job_dirs.clear()
        self._check_folder_names(config, "sweep")

    @staticmethod
    def _check_folder_names(config, mode: str) -> None:
        """Before Hydra makes a job folder: none named by a typed password."""
        from omegaconf import OmegaConf
        node = OmegaConf.select(config, f"hydra.{mode}", default=None)
        folders = OmegaConf.to_container(node, resolve=False) if node else {}
        try:
            check_folder_names({f"hydra.{mode}.{key}": value for key, value in folders.items()},
                               OmegaConf.select(config, "hydra.overrides.task", default=None) or [],
                               list(OmegaConf.select(config, "hydra.job.config.override_dirname.exclude_keys",
                                                     default=None) or []))
        except UserError as e:
            end(e)   # Hydra turns a callback's exception into a warning

    def on_job_start(self, config, **_) -> None:
        _hide_job_passwords()

    def on_job_end(self, config, job_return, **_) -> None:
        note_jobs([job_return])  # a job run in this process (Hydra's basic launcher); elsewhere, no effect
        # Hydra prints a job's overrides if it raised: a URL's password as ***
        job_return.overrides = [redact_override(str(o)) for o in job_return.overrides or []]

    def on_multirun_end(self, config, **_) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        dirs = job_dirs(sweep_dir, _job_dirs)
        _job_dirs.clear()  # this sweep's: none reaches the next multirun in this process
        failed = failed_jobs(dirs)
        if not failed:
            log.info("sweep finished: %d job(s) ok (%s)", len(dirs), sweep_dir)
            return
        print_failed(f"sweep finished: {len(failed)} of {len(dirs)} job(s) failed", failed)
        raise SystemExit(1)


def job_dirs(sweep_dir: Path, noted=()) -> dict[str, Path]:
    """The sweep's job folders, by the name the summary gives them: those in
    `sweep_dir` (its name there), then those `noted` elsewhere (their path)."""
    found = {p.name: p for p in sorted(sweep_dir.iterdir())
             if p.is_dir() and ((p / ".hydra").is_dir() or (p / FAILURE_FILE).exists())} if sweep_dir.is_dir() else {}
    seen = {p.resolve() for p in found.values()}
    for path in noted:
        if path.resolve() not in seen and path.is_dir():
            seen.add(path.resolve())
            name = os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path.resolve())
            found[name] = path
    return found


def failed_jobs(dirs: dict[str, Path]) -> dict[str, dict]:
    """Each of the job dirs (job_dirs) that holds a FAILED.json: what read_failure says."""
    return {name: read_failure(path / FAILURE_FILE) for name, path in dirs.items() if (path / FAILURE_FILE).exists()}


def print_failed(heading: str, failed: dict[str, dict]) -> None:
    print(f"{heading} (details in {FAILURE_FILE}):", file=sys.stderr)
    for name, info in failed.items():
        print("  " + ": ".join(part for part in (name, " ".join(info["overrides"]), info["error"]) if part),
              file=sys.stderr)


def _list_other_failures(e: BaseException) -> None:
    """A job whose failure could not be recorded ends the sweep on its error
    (_record_failure), and Hydra then skips FailureSummary: the jobs that did
    record theirs are listed here, above that error."""
    sweep_dir = getattr(e, "sweep_dir", None)
    failed = failed_jobs(job_dirs(Path(sweep_dir))) if sweep_dir else {}
    if failed:
        print_failed(f"sweep stopped by the error below; {len(failed)} other job(s) failed too", failed)
