"""What quantbench's submitit launchers (Slurm, local) share: submit the sweep
as one array, then collect each job on its own.

The plugin's `launch()` returns `[job.results()[0] for job in jobs]`: the first
job that ended without a result (Slurm's time limit or `scancel`, a local job
killed by a signal) raises, the whole multirun stops with a traceback, the
results of the jobs after it are never collected and the sweep's failure
summary never runs. Here such a job becomes a FAILED.json in its Hydra job dir,
exactly like a job that failed in Python (quantize.common.jobs), so the other
jobs' results are kept and `FailureSummary` lists it and exits 1. Subclasses
say when a job has a result (`_has_result`) and why one ended without
(`_why_ended`).
"""
import logging
from pathlib import Path
from typing import List, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


class CollectingLauncher(BaseSubmititLauncher):
    _KIND = "submitit"  # how the log names the jobs: "Slurm job 42"
    # hydra.launcher keys this launcher reads itself: submitit's executor refuses unknown ones.
    _OWN_KEYS: frozenset = frozenset()

    def __call__(self, *args, **kwargs) -> JobReturn:
        """In the job. submitit answers the time-limit warning (Slurm's, or the
        local executor's before its timeout_min) by raising UncompletedJobError
        wherever the job is; raised inside an import or a library's broad
        `except`, it can surface as some other error. A job that was warned and
        then failed is recorded as what it is: time limit."""
        import signal
        import submitit
        warned = []
        sig = submitit.JobEnvironment._usr_sig()
        previous = signal.getsignal(sig)

        def on_warning(signum, frame):
            warned.append(signum)
            if callable(previous):
                previous(signum, frame)  # submitit: requeue when preempted, raise on time limit

        signal.signal(sig, on_warning)
        ret = super().__call__(*args, **kwargs)
        out = ret.hydra_cfg.hydra.runtime.output_dir if ret.hydra_cfg is not None else None
        failed = Path(str(out)) / "FAILED.json" if out else None
        if warned and failed is not None and failed.is_file():
            from quantize.common.jobs import TIME_LIMIT, read_failure
            info = read_failure(failed)
            if not info["error"].startswith("time limit"):
                record(failed.parent, TIME_LIMIT, f"{info['error']}\n{info['traceback']}",
                       info["overrides"] or list(ret.overrides or []))
        return ret

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit
        from quantize.common.jobs import note_jobs

        assert self.config is not None
        job_overrides = self._prepare([list(o) for o in job_overrides])

        # As the plugin's launch(): executor, parameters, sweep dir, one array.
        # No requeue on a time limit unless max_num_timeout asks (submitit's local default is 3).
        init_keys = {"submitit_folder", "max_num_timeout", *self._OWN_KEYS}
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=self.params["submitit_folder"], **{
            f"{self._EXECUTOR}_max_num_timeout": self.params.get("max_num_timeout", 0)})
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{self._EXECUTOR}_{k}": v
                                      for k, v in self.params.items() if k not in init_keys})
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        log.info(f"Submitit '{self._EXECUTOR}' sweep output dir : {sweep_dir}")
        sweep_dir.mkdir(parents=True, exist_ok=True)
        args = []
        for n, overrides in enumerate(job_overrides):
            idx = initial_job_idx + n
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            args.append((overrides, "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        returns = self._run(executor, args)
        note_jobs(returns)
        return returns

    def _run(self, executor, args: List[tuple]) -> List[JobReturn]:
        """Submit the jobs (`args`: each one's arguments to __call__) as one array, then collect each."""
        try:
            jobs = executor.map_array(self, *zip(*args))
        except Exception as e:
            self._refused(e)
        log.info("submitted %s job(s) %s", self._KIND, ", ".join(j.job_id for j in jobs))
        return [self._collect(job, overrides, idx) for (overrides, _, idx, _, _), job in zip(args, jobs)]

    def _prepare(self, job_overrides: List[List[str]]) -> List[List[str]]:
        """Checks before submitting; the overrides each job gets."""
        return job_overrides

    def _refused(self, error: Exception) -> None:
        """The executor would not take the jobs."""
        raise error

    def _has_result(self, job) -> bool:
        return job.paths.result_pickle.exists()

    def _why_ended(self, job, error: Exception) -> str:
        """Why `job` ended without a result (`error`: what submitit said)."""
        raise NotImplementedError

    def _collect(self, job, overrides: List[str], idx: int) -> JobReturn:
        """The job's own JobReturn, or a recorded failure when it ended without one."""
        from submitit.core.utils import FailedJobError, UncompletedJobError
        job.wait()
        try:
            if self._has_result(job):
                return job.results()[0]
            error: Exception = UncompletedJobError(f"{self._KIND} job {job.job_id} ended {job.state} without a result")
        except (UncompletedJobError, FailedJobError) as e:
            error = e
        message = (f"{self._why_ended(job, error)}; {self._KIND} job {job.job_id}, log {job.paths.stderr}; "
                   "completed results are kept, rerun the sweep to resume")
        job_dir = self._job_dir(overrides, idx)
        log.error("job #%d failed: %s", idx, message)
        record(job_dir, message, str(error), overrides)
        ret = JobReturn(overrides=overrides, working_dir=str(job_dir), status=JobStatus.COMPLETED)
        ret.return_value = None
        return ret

    def _job_dir(self, overrides: List[str], idx: int) -> Path:
        """Where Hydra puts this job's output (its own hydra.sweep.dir / hydra.sweep.subdir:
        hydra.sweep.dir=out/${x} differs per job)."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            cfg.hydra.job.num = idx
            return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        except Exception as e:  # an interpolation only a running job can resolve
            log.warning("job dir of #%d: %s; using %s", idx, e, sweep_dir / str(idx))
            return sweep_dir / str(idx)


def record(job_dir: Path, message: str, trace: str, overrides: List[str]) -> None:
    """FAILED.json in the job's dir; a job that never started also gets the
    .hydra/overrides.yaml Hydra would have written, so the summary counts it;
    a password typed in them is *** in both, as in a job that ran."""
    from quantize.common.credentials import redact_override
    from quantize.common.jobs import write_failure
    hydra_dir = job_dir / ".hydra"
    if not hydra_dir.is_dir():
        hydra_dir.mkdir(parents=True)
        shown = [redact_override(str(arg)) for arg in overrides]
        (hydra_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(shown)))
    write_failure(job_dir, message, trace, overrides)
