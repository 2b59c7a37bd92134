"""A run's plan, progress and ETA across its Hydra stages (scripts/run_matrix.sh).

The plan (evaluate.matrix_plan) writes a run file: the run's jobs in order,
each with the work it has left, and where this host's job times are kept. Its
path travels to every job in $QUANTBENCH_RUN; the `JobProgress` Hydra callback
appends the job's duration to the job-times file (one O_APPEND line, so
parallel and remote jobs count too) and prints "k/N done, elapsed, ETA", with
k counted from that file's lines of this run.

The ETA sums, over the jobs left, what like jobs took on this host kind
(same stage and model; the same recipe where one was measured), as if they ran
one after another: for a build, their mean; for an evaluate job, its
measurements left at the like jobs' time per measurement, plus a fixed part
per job where their differing amounts of work show one (estimate). A job with
nothing left to do (an artifact already complete, every run already stored)
counts what such skips took."""
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import mean

from hydra.experimental.callback import Callback

from quantize.common.atomic import append_line, write_text

log = logging.getLogger("quantbench")

RUN_ENV = "QUANTBENCH_RUN"        # the run file's path, for the jobs of a run
TIMES_FILE = "job_times.jsonl"    # beside the run files: every job's duration, all runs


@dataclass(frozen=True)
class PlannedJob:
    """One Hydra job of the run, as the plan found it."""
    stage: str              # "quantize" | "evaluate"
    model: str
    recipe: str | None
    work: int               # quantize: 1 = build, 0 = complete; evaluate: measurements left (0: no engine)
    note: str = ""          # why there is nothing to do, for the plan's listing

    def same_job(self, stage: str, model: str, recipe: str | None) -> bool:
        return (self.stage, self.model, self.recipe) == (stage, model, recipe)


@dataclass(frozen=True)
class JobTime:
    """One finished job: a line of the job-times file."""
    run: str
    stage: str
    model: str
    recipe: str | None
    host: str               # host_kind() of the machine that ran it
    seconds: float
    work: int
    ok: bool
    finished: str = ""      # ISO 8601, UTC

    @classmethod
    def from_dict(cls, data: dict) -> "JobTime":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class Eta:
    seconds: float | None
    why_unknown: str = ""

    def __str__(self) -> str:
        return f"ETA {duration(self.seconds)}" if self.seconds is not None else f"ETA unknown ({self.why_unknown})"


@dataclass
class RunFile:
    """What the plan hands the run's jobs (JSON, written atomically)."""
    run_id: str
    started: float                       # epoch seconds, when the plan ran
    times: str                           # the job-times file (absolute path)
    jobs: list[PlannedJob] = field(default_factory=list)

    def write(self, path: Path) -> None:
        write_text(Path(path), json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> "RunFile":
        data = json.loads(Path(path).read_text())
        return cls(run_id=data["run_id"], started=data["started"], times=data["times"],
                   jobs=[PlannedJob(**j) for j in data["jobs"]])

    def planned(self, stage: str, model: str, recipe: str | None) -> PlannedJob | None:
        return next((j for j in self.jobs if j.same_job(stage, model, recipe)), None)

    def progress(self, history: list[JobTime], host: str, now: float) -> str:
        """"k/N done, elapsed …, ETA …" after a job, from the job times of this run."""
        finished = [t for t in history if t.run == self.run_id]
        left = [j for j in self.jobs if not any(j.same_job(t.stage, t.model, t.recipe) for t in finished)]
        failed = sum(not t.ok for t in finished)
        return (f"progress: {len(finished)}/{len(self.jobs)} done" + (f" ({failed} failed)" if failed else "")
                + f", elapsed {duration(now - self.started)}, {eta(left, host, history)}")


def read_times(path: Path) -> list[JobTime]:
    """Every job time recorded in `path` (none if it does not exist); a line
    cut short by a crash is passed over."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            out.append(JobTime.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError, KeyError):
            continue
    return out


def estimate(job: PlannedJob, host: str, history: list[JobTime]) -> float | None:
    """Seconds `job` should take on `host`, from like jobs that finished ok
    there; None when none did. Jobs with work left and jobs without are told
    apart: a skip takes seconds, a build or an engine start minutes."""
    alike = [t for t in history if t.ok and t.host == host and t.stage == job.stage and t.model == job.model]
    if job.work == 0:
        skips = [t.seconds for t in alike if t.work == 0]
        return mean(skips) if skips else 0.0
    working = [t for t in alike if t.work > 0]
    like = [t for t in working if t.recipe == job.recipe] or working
    if not like:
        return None
    # quantize's work is 1 (a build); evaluate's the measurements left, which decide its time
    return mean(t.seconds for t in like) if job.stage == "quantize" else for_work(like, job.work)


def for_work(times: list[JobTime], work: int) -> float:
    """Seconds for `work` units, from past jobs' `times`: a fixed part (the
    engine start) and a part per unit, fitted (least squares) where past jobs
    had different amounts of work; in proportion to the work otherwise, or
    where the fit is not both >= 0 (too few or too noisy times)."""
    xs, ys = [t.work for t in times], [t.seconds for t in times]
    if len(set(xs)) > 1:
        mx, my = mean(xs), mean(ys)
        per_unit = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        fixed = my - per_unit * mx
        if per_unit >= 0 and fixed >= 0:
            return fixed + per_unit * work
    return sum(ys) / sum(xs) * work


def eta(jobs: list[PlannedJob], host: str, history: list[JobTime]) -> Eta:
    """The time `jobs` should take on `host`, one after another."""
    guesses = [(job, estimate(job, host, history)) for job in jobs]
    unknown = [job for job, seconds in guesses if seconds is None]
    if not unknown:
        return Eta(sum(seconds for _, seconds in guesses))
    if not any(t.host == host for t in history):
        return Eta(None, "first run on this host")
    stages = sorted({job.stage for job in unknown}, key=["quantize", "evaluate"].index)
    return Eta(None, f"no {' or '.join(stages)} job of {unknown[0].model} measured on this host yet")


def duration(seconds: float) -> str:
    """42 s, 3 min 10 s, 2 h 5 min."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def host_kind() -> str:
    """What makes a job faster or slower on this host: the CPU model and how
    many cores this process may use, the ISA and GPUs (quantize.common.machine),
    and the ISA caps a host emulation sets (scripts/as_avx2_host.sh)."""
    from quantize.common.machine import ISA_CAP_ENV, detect
    from quantize.common.provenance import cpu_model
    caps = [f"{name}={os.environ[name]}" for name in ISA_CAP_ENV if os.environ.get(name)]
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    return "; ".join([f"{cpu_model()}, {cores} cores", detect().describe(), *caps])


class JobProgress(Callback):
    """Hydra callback (conf/quantize.yaml, conf/evaluate.yaml): in a run with a
    plan ($QUANTBENCH_RUN), record each job's duration and print the run's
    progress. Runs where the job runs (a joblib worker, a Slurm node)."""

    def __init__(self, stage: str):
        self.stage = stage
        self._started: dict[str, float] = {}

    def on_job_start(self, config, **_) -> None:
        self._started[config.hydra.runtime.output_dir] = time.time()

    def on_job_end(self, config, job_return, **_) -> None:
        run_path = os.environ.get(RUN_ENV)
        started = self._started.pop(config.hydra.runtime.output_dir, None)
        if not run_path or started is None:
            return
        try:
            self._record(Path(run_path), config, job_return, started)
        except Exception as e:  # a progress line is never worth a failed job
            log.warning("progress not recorded: %s: %s", type(e).__name__, e)

    def _record(self, run_path: Path, config, job_return, started: float) -> None:
        from hydra.core.utils import JobStatus
        from quantize.common.jobs import FAILURE_FILE
        run = RunFile.read(run_path)
        model = str(config.model.name)
        recipe = str(config.recipe.name) if config.get("recipe") else None
        planned = run.planned(self.stage, model, recipe)
        ok = (job_return.status == JobStatus.COMPLETED
              and not (Path(config.hydra.runtime.output_dir) / FAILURE_FILE).exists())
        now, host = time.time(), host_kind()
        record = JobTime(run=run.run_id, stage=self.stage, model=model, recipe=recipe, host=host,
                         seconds=round(now - started, 1), work=planned.work if planned else 1, ok=ok,
                         finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        append_line(Path(run.times), json.dumps(asdict(record)))
        what = f"{self.stage} {recipe or model} {'ok' if ok else 'failed'} in {duration(record.seconds)}"
        print(f"{run.progress(read_times(Path(run.times)), host, now)} ({what})", flush=True)
