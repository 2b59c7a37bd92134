"""hydra-submitit-launcher's `submitit_local`, made safe for long sweeps: a job
whose process ends without a result (killed by the out-of-memory killer or
kill -9, a crash of Python itself, stopped at hydra.launcher.timeout_min)
becomes a FAILED.json in its Hydra job dir, the other jobs run on and are
collected, and the sweep's failure summary lists it and exits 1
(quantbench_launchers.collect, shared with the Slurm launcher).

Use it through the preset: hydra/launcher=local_submitit.
"""
from hydra_plugins.quantbench_launchers.collect import CollectingLauncher

TIME_LIMIT = "time limit: the job was stopped at hydra.launcher.timeout_min={timeout_min}"
# submitit's local controller does not keep the job's exit status: the signal is not known.
KILLED = ("killed: the job's process ended without a result (killed by a signal: the out-of-memory killer, "
          "kill -9, or a crash)")


class LocalLauncher(CollectingLauncher):
    _EXECUTOR = "local"
    _KIND = "local"

    def _why_ended(self, job, error: Exception) -> str:
        from quantize.common.jobs import submitit_timed_out
        if job.paths.result_pickle.exists():  # it raised outside quantbench's own handling (run_job)
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            return f"failed: {lines[-1] if lines else type(error).__name__}"
        # submitit logs "this job is timed-out" in the job's log when its timeout warning comes.
        log = job.stderr() or ""
        if submitit_timed_out(str(error)) or submitit_timed_out(log):
            return TIME_LIMIT.format(timeout_min=self.params.get("timeout_min"))
        return KILLED
