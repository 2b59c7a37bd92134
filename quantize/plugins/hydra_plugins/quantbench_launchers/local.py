"""hydra-submitit-launcher's `submitit_local`, made safe for long sweeps: a job
whose process ends without a result (killed by the out-of-memory killer or
kill -9, a crash of Python itself, stopped at hydra.launcher.timeout_min)
becomes a FAILED.json in its Hydra job dir, the other jobs run on and are
collected, and the sweep's failure summary lists it and exits 1
(quantbench_launchers.collect, shared with the Slurm launcher).

Without hydra.launcher.gpus_per_node, the jobs see the GPUs this process
sees (submitit's local executor would hide them all: CUDA_VISIBLE_DEVICES="").

Use it through the preset: hydra/launcher=local_submitit.
"""
import os

from hydra_plugins.quantbench_launchers.collect import CollectingLauncher

TIME_LIMIT = "time limit: the job was stopped at hydra.launcher.timeout_min={timeout_min}"
# submitit's local controller does not keep the job's exit status: the signal is not known.
KILLED = ("killed: the job's process ended without a result (killed by a signal: the out-of-memory killer, "
          "kill -9, or a crash)")


class LocalLauncher(CollectingLauncher):
    _EXECUTOR = "local"
    _KIND = "local"
    # The parent's CUDA_VISIBLE_DEVICES for the jobs: [value], or [] where it sets none
    # (every GPU visible); None when gpus_per_node is set and submitit picks the GPUs.
    _parent_gpus = None

    def launch(self, job_overrides, initial_job_idx):
        # submitit counts an unset gpus_per_node as 0 and hides every GPU from the job.
        if self.params.get("gpus_per_node") is None:
            gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
            self._parent_gpus = [] if gpus is None else [gpus]
        return super().launch(job_overrides, initial_job_idx)

    def __call__(self, *args, **kwargs):
        """In the job, before anything initialises CUDA: the parent's GPUs."""
        if self._parent_gpus == []:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        elif self._parent_gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = self._parent_gpus[0]
        return super().__call__(*args, **kwargs)

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
