"""hydra-submitit-launcher's `submitit_local`, made safe for long sweeps: a job
whose process ends without a result (killed by the out-of-memory killer or
kill -9, a crash of Python itself, stopped at hydra.launcher.timeout_min)
becomes a FAILED.json in its Hydra job dir, the other jobs run on and are
collected, and the sweep's failure summary lists it and exits 1
(quantbench_launchers.collect, shared with the Slurm launcher).

Without hydra.launcher.gpus_per_node, the jobs see the GPUs this process
sees (submitit's local executor would hide them all: CUDA_VISIBLE_DEVICES="").
With it, each job gets GPUs of its own out of those this process sees, and a
job waits until a running one frees them: submitit's local executor would
start every job at once on the same first GPUs (CUDA_VISIBLE_DEVICES=0 for each).

Use it through the preset: hydra/launcher=local_submitit.
"""
import logging
import os
import time
from typing import Dict, List, Optional

from hydra_plugins.quantbench_launchers.collect import CollectingLauncher

log = logging.getLogger(__name__)

TIME_LIMIT = "time limit: the job was stopped at hydra.launcher.timeout_min={timeout_min}"
# submitit's local controller does not keep the job's exit status: the signal is not known.
KILLED = ("killed: the job's process ended without a result (killed by a signal: the out-of-memory killer, "
          "kill -9, or a crash)")
POLL_S = 1.0  # how often a job waiting for GPUs looks for a finished one


class LocalLauncher(CollectingLauncher):
    _EXECUTOR = "local"
    _KIND = "local"
    _OWN_KEYS = frozenset({"visible_gpus"})
    # The CUDA_VISIBLE_DEVICES each job gets, by job number (None: unset, every GPU
    # visible); a job not listed keeps submitit's.
    _gpus: Dict[int, Optional[str]] = {}
    # With gpus_per_node: the GPU sets jobs take in turn, each a CUDA_VISIBLE_DEVICES value.
    _groups: Optional[List[str]] = None

    def setup(self, **kwargs) -> None:
        super().setup(**kwargs)
        per_job = self.params.get("gpus_per_node")
        if per_job:
            self._groups = gpu_groups(per_job, self.params.get("visible_gpus"))

    def launch(self, job_overrides, initial_job_idx):
        # submitit counts an unset gpus_per_node as 0 and hides every GPU from the job.
        if self.params.get("gpus_per_node") is None:
            parent = os.environ.get("CUDA_VISIBLE_DEVICES")
            self._gpus = {initial_job_idx + n: parent for n in range(len(job_overrides))}
        return super().launch(job_overrides, initial_job_idx)

    def __call__(self, *args, **kwargs):
        """In the job, before anything initialises CUDA: its GPUs."""
        idx = args[2]  # (overrides, job dir key, job number, job id, Hydra's state)
        if idx in self._gpus:
            if self._gpus[idx] is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = self._gpus[idx]
        return super().__call__(*args, **kwargs)

    def _run(self, executor, args):
        """With GPU sets, as many jobs at once as there are sets, each on its own."""
        if not self._groups:
            return super()._run(executor, args)
        free, running, returns = list(self._groups), [], {}
        for arg in args:
            while not free:
                ended = [run for run in running if run[0].done()]
                if not ended:
                    time.sleep(POLL_S)
                for run in ended:
                    running.remove(run)
                    returns[run[1][2]] = self._collect(run[0], run[1][0], run[1][2])
                    free.append(run[2])
            group = free.pop(0)
            self._gpus = {arg[2]: group}  # pickled with the job as it is submitted
            try:
                job = executor.submit(self, *arg)
            except Exception as e:
                self._refused(e)
            log.info("submitted local job %s (#%d) on GPU(s) %s", job.job_id, arg[2], group)
            running.append((job, arg, group))
        for job, arg, _ in running:
            returns[arg[2]] = self._collect(job, arg[0], arg[2])
        return [returns[arg[2]] for arg in args]

    def _why_ended(self, job, error: Exception) -> str:
        from quantize.common.jobs import submitit_timed_out
        if job.paths.result_pickle.exists():  # it raised outside quantbench's own handling (run_job)
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            return f"failed: {lines[-1] if lines else type(error).__name__}"
        # submitit logs "this job is timed-out" in the job's log when its timeout warning comes.
        text = job.stderr() or ""
        if submitit_timed_out(str(error)) or submitit_timed_out(text):
            return TIME_LIMIT.format(timeout_min=self.params.get("timeout_min"))
        return KILLED


def gpu_groups(per_job: int, given: Optional[List[int]] = None) -> List[str]:
    """The GPU sets of `per_job` GPUs each that jobs take in turn, out of
    hydra.launcher.visible_gpus (`given`), else this process's
    CUDA_VISIBLE_DEVICES, else every GPU NVML finds; one line naming the
    setting where not even one set fits."""
    pool = [str(g) for g in given] if given else visible_gpus()
    groups = [",".join(pool[i:i + per_job]) for i in range(0, len(pool) - per_job + 1, per_job)]
    if not groups:
        from hydra_plugins.quantbench_launchers.slurm import fail
        seen = f"{len(pool)}: {','.join(pool)}" if pool else "none"
        fix = f"hydra.launcher.gpus_per_node={len(pool)} or less" if pool else "hydra.launcher.gpus_per_node=null"
        fail(f"hydra.launcher.gpus_per_node={per_job} asks for more GPUs than this machine shows ({seen}); "
             f"set {fix}")
    return groups


def visible_gpus() -> List[str]:
    """The entries of CUDA_VISIBLE_DEVICES (indices or UUIDs), or where it is
    unset the index of each GPU NVML finds (none without a driver)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVIDIA driver here
        return []
