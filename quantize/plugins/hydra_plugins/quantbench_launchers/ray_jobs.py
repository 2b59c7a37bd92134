"""hydra-ray-launcher's RayLauncher, made safe for long sweeps.

The plugin's `launch()` returns `[ray.get(run) for run in runs]`: the first
job whose worker died (the out-of-memory killer, kill -9, a crash, a lost
node) raises, the whole multirun stops with a traceback, the results of the
jobs after it are never collected and the sweep's failure summary never
runs. This launcher submits the same way and then collects each job on its
own: such a job becomes a FAILED.json in its Hydra job dir, like a job that
failed in Python (quantize.common.jobs), the other jobs' results are kept
and `FailureSummary` lists it and exits 1. The presets set the tasks'
`max_retries: 0`: Ray would otherwise run a killed job up to 3 more times.

A job that ran but whose Hydra job dir is not in its sweep dir as this
process sees it (a Ray worker started in another directory resolves a
relative sweep dir, and artifacts_dir, results_dir, against its own; a node
without a shared folder writes to its own disk) is recorded as failed too,
naming where its output went, instead of a summary of "0 job(s) ok".

It also refuses, in one line, a GPU request (`ray.remote.num_gpus`) no node
of the Ray instance it started can meet: Ray would leave the jobs pending
forever. On a cluster it joined it warns instead: an autoscaling cluster
starts GPU nodes only once work waits for them.

Where Ray or hydra-ray-launcher is not installed, this module still imports
(Hydra imports every plugin module on every command), and choosing a preset
is refused in one line naming the install step, before anything is written.

Use it through the presets: hydra/launcher=ray_local or ray_gpu.
"""
import importlib.util
import logging
import os
from pathlib import Path
from typing import List, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from omegaconf import open_dict

log = logging.getLogger(__name__)

try:
    from hydra_plugins.hydra_ray_launcher.ray_launcher import RayLauncher
except ImportError:  # a machine without it: the presets still compose, and setup() says what to install
    from hydra.core.config_store import ConfigStore
    from hydra.plugins.launcher import Launcher

    class RayLauncher(Launcher):  # type: ignore[no-redef]
        def __init__(self, ray) -> None:
            self.ray_cfg = ray

        def setup(self, **_) -> None:
            raise NotImplementedError

        def launch(self, job_overrides, initial_job_idx):
            raise NotImplementedError

    # The node the presets extend (hydra-ray-launcher's `ray`), with the keys they and its docs set.
    ConfigStore.instance().store(group="hydra/launcher", name="ray", provider="quantbench", node={
        "_target_": f"{__name__}.CollectingRayLauncher", "ray": {"init": {"address": None}, "remote": {}}})

KILLED = ("killed: the job's Ray worker ended without a result (killed by a signal: the out-of-memory killer, "
          "kill -9, or a crash)")
OUT_OF_MEMORY = "out of memory: Ray's memory monitor killed the job's worker"
NODE_LOST = "node failure: the Ray node running the job died"


class CollectingRayLauncher(RayLauncher):
    def setup(self, *, hydra_context, task_function, config) -> None:
        require_ray(config.hydra.runtime.choices.get("hydra/launcher") or "ray")
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.hydra_ray_launcher._launcher_util import launch_job_on_ray, start_ray
        from quantize.common.jobs import note_jobs

        # As the plugin's launch(): start or join Ray, one task per job.
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Ray Launcher is launching {len(job_overrides)} jobs, sweep output dir: {sweep_dir}")
        self.ray_cfg.init.setdefault("object_store_memory", 78643200)  # as the plugin: enough on a small host
        start_ray(self.ray_cfg.init)
        init = self.ray_cfg.init
        joined = joins_cluster(init.get("address"), init.get("_temp_dir"))
        check_gpus(self.ray_cfg.remote.get("num_gpus") or 0, joined)
        jobs = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id = f"job_id_for_{idx}"
                cfg.hydra.job.num = idx
            ref = launch_job_on_ray(self.hydra_context, self.ray_cfg.remote, cfg, self.task_function,
                                    Singleton.get_state())
            job_sweep = sweep_dir  # the job's own sweep dir: hydra.sweep.dir=out/${action} differs per job
            try:  # where Hydra puts this job's output, seen from here
                job_sweep = Path(str(cfg.hydra.sweep.dir))
                job_dir = job_sweep / str(cfg.hydra.sweep.subdir)
            except Exception as e:  # an interpolation only the running job resolves (${hydra:...})
                log.warning("job dir of #%d: %s; using %s", idx, e, job_sweep / str(idx))
                job_dir = job_sweep / str(idx)
            jobs.append((list(overrides), idx, job_dir, job_sweep, ref))
        returns = [self._collect(*job) for job in jobs]
        note_jobs(returns)
        return returns

    def _collect(self, overrides: List[str], idx: int, job_dir: Path, sweep_dir: Path, ref) -> JobReturn:
        """The job's own JobReturn, or a recorded failure when Ray has none
        or the job's output is not in this sweep dir. `job_dir`: where the
        job's output should be, or a stand-in where that needs the running job."""
        import ray
        from hydra_plugins.quantbench_launchers.collect import record
        try:
            ret = ray.get(ref)
            if ret.hydra_cfg is None:  # nothing says where it wrote
                return ret
            went = Path(str(ret.hydra_cfg.hydra.runtime.output_dir))  # as the job's node saw it
            inside = went.resolve().is_relative_to(sweep_dir.resolve())
            subdir = ret.hydra_cfg.hydra.get("output_subdir")  # Hydra writes it unless null
            if inside and (went / subdir if subdir is not None else went).is_dir():  # here too, not only on its node
                return ret
            if inside:  # a node without this machine's folders, at the same path
                job_dir = went
                message = (f"elsewhere: the job wrote to {went} on its Ray node, and this machine has no such job "
                           "folder; put hydra.sweep.dir, artifacts_dir and results_dir on a folder all Ray nodes "
                           "share (absolute paths)")
            else:
                message = (f"elsewhere: the job ran in its Ray worker's directory and wrote to {went} (on that node), "
                           f"not in {sweep_dir.resolve()}; start the Ray workers (`ray start`) in this directory with "
                           "this environment, or use absolute paths on a shared folder (hydra.sweep.dir, "
                           "artifacts_dir, results_dir)")
            error = message
        except ray.exceptions.RayError as e:
            message = f"{why_ended(e)}; completed results are kept, rerun the sweep to resume"
            error = str(e)
        log.error("job #%d failed: %s", idx, message)
        record(job_dir, message, error, overrides)
        ret = JobReturn(overrides=overrides, working_dir=str(job_dir), status=JobStatus.COMPLETED)
        ret.return_value = None
        return ret


def require_ray(preset: str) -> None:
    """One line naming the install step where Ray or hydra-ray-launcher is missing."""
    missing = [name for module, name in (("ray", "ray"), ("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher"))
               if not _installed(module)]
    if missing:
        from hydra_plugins.quantbench_launchers.slurm import fail
        fail(f"hydra/launcher={preset} needs {' and '.join(missing)}, not installed here; `bash scripts/setup.sh` "
             "installs them (by hand: the ray[default] pin of requirements/common.txt, then hydra-ray-launcher "
             "from requirements/no-deps.txt with pip install --no-deps), or use hydra/launcher=local_submitit")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package that is missing or broken
        return False


def why_ended(error: Exception) -> str:
    """What a Ray error that left a job without a result says to the user."""
    import ray
    if isinstance(error, ray.exceptions.OutOfMemoryError):
        return OUT_OF_MEMORY
    if isinstance(error, ray.exceptions.NodeDiedError):
        return NODE_LOST
    if isinstance(error, ray.exceptions.WorkerCrashedError):
        return KILLED
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"failed: {lines[-1] if lines else type(error).__name__}"


def joins_cluster(address: Optional[str], temp_dir: Optional[str] = None) -> bool:
    """Whether ray.init(address=...) joined a running cluster rather than
    starting an instance here, decided as ray.init decides: the address,
    where unset or "auto" $RAY_ADDRESS, where still unset the cluster
    `ray start` last started on this machine; "local" starts one here."""
    from ray._private import services
    if address in (None, "auto") and os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]
    if address and "://" in address:  # Ray Client: a cluster elsewhere
        return True
    return services.canonicalize_bootstrap_address(address, temp_dir) is not None


def check_gpus(wanted: float, joined: bool) -> None:
    """One line naming the setting when no node of the cluster has the GPUs one
    job asks for: refused for the instance started here, a warning on a joined
    cluster (an autoscaling one adds GPU nodes only once work is pending)."""
    import ray
    if not wanted:
        return
    most = max((node["Resources"].get("GPU", 0) for node in ray.nodes() if node.get("Alive")), default=0)
    if wanted <= most:
        return
    fix = (f"set hydra.launcher.ray.remote.num_gpus={most:g} or use hydra/launcher=ray_local for CPU jobs")
    if joined:
        log.warning("hydra.launcher.ray.remote.num_gpus=%g asks for more GPUs than any live node of the Ray cluster "
                    "has (%g): the jobs wait until the cluster adds such a node (an autoscaling cluster does), "
                    "else forever; if it cannot, %s", wanted, most, fix)
        return
    from hydra_plugins.quantbench_launchers.slurm import fail
    fail(f"hydra.launcher.ray.remote.num_gpus={wanted:g} asks for more GPUs than any node of the Ray cluster "
         f"has ({most:g}); {fix}")
