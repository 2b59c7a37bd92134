"""hydra-submitit-launcher's `submitit_slurm`, made safe for long sweeps.

The plugin's `launch()` returns `[job.results()[0] for job in jobs]`: the first
job that Slurm ended (time limit, `scancel`, node failure, out of memory)
raises, the whole multirun stops with a traceback, the results of the jobs
after it are never collected and the sweep's failure summary never runs. This
launcher submits the same way and then:

- before submitting, checks the request against the partition (`sinfo`): a
  partition that does not exist, or more CPUs, memory, GPUs or time than any of
  its nodes allows, is one line naming the `hydra.launcher.*` setting to change
  and exit status 2, instead of a job pending forever;
- waits for every job; a job Slurm ended becomes a FAILED.json in its Hydra job
  dir ("time limit", "cancelled", ...), exactly like a job that failed in Python
  (quantize.common.jobs), so the other jobs' results are kept and `FailureSummary`
  lists it and exits 1 (quantbench_launchers.collect, shared with the local launcher);
- gives evaluate jobs their own results shard (`results_per_process=true`)
  unless the command line sets it: jobs of one sweep may run on several nodes
  writing to one shared folder, where appends from different hosts can tear.

Use it through the presets: hydra/launcher=slurm_cpu, slurm_gpu or slurm_local.
"""
import logging
import re
import shutil
import subprocess
import sys
from typing import List, Optional

from hydra_plugins.quantbench_launchers.collect import CollectingLauncher

log = logging.getLogger(__name__)

SHARD_KEY = "results_per_process"
# sacct states of a job that ended without producing its result, and what to say.
ENDED_BY_SLURM = {
    "TIMEOUT": "time limit: Slurm stopped the job at hydra.launcher.timeout_min={timeout_min}",
    "WARNED": "time limit: Slurm's warning, hydra.launcher.signal_delay_s={signal_delay_s} before "
              "hydra.launcher.timeout_min={timeout_min}, stopped the job",
    "CANCELLED": "cancelled: the Slurm job was cancelled ({state})",
    "NODE_FAIL": "node failure: the Slurm job's node died",
    "BOOT_FAIL": "node failure: the Slurm job's node did not boot",
    "OUT_OF_MEMORY": "out of memory: the job used more than hydra.launcher.mem_gb={mem_gb}",
    "DEADLINE": "deadline: the Slurm job reached its deadline",
    "PREEMPTED": "preempted: the Slurm job was preempted and not requeued",
    "FAILED": "failed: the Slurm job exited non-zero ({state})",
}


class SlurmLauncher(CollectingLauncher):
    _EXECUTOR = "slurm"
    _KIND = "Slurm"

    def _prepare(self, job_overrides: List[List[str]]) -> List[List[str]]:
        check_request(self.params)
        self.params = warn_in_time(self.params)
        return [self._with_shard(o) for o in job_overrides]

    def _refused(self, error: Exception) -> None:  # sbatch refused: bad account, QOS, partition limits, ...
        refused(error)

    def _with_shard(self, overrides: List[str]) -> List[str]:
        if SHARD_KEY in self.config and not any(o.lstrip("+~").startswith(SHARD_KEY + "=") for o in overrides):
            return overrides + [f"{SHARD_KEY}=true"]
        return overrides

    def _has_result(self, job) -> bool:
        return ended_by_slurm(job.state) is None or job.paths.result_pickle.exists()

    def _why_ended(self, job, error: Exception) -> str:
        state = job.state.upper()
        reason = ended_by_slurm(state) or "FAILED"
        if reason == "FAILED" and stopped_by_warning(job.job_id, error):
            reason = "WARNED"
        return ENDED_BY_SLURM[reason].format(state=state, **self.params)


def ended_by_slurm(state: str) -> Optional[str]:
    """The ENDED_BY_SLURM key of a job state that ended it without a result, if any."""
    return next((k for k in ENDED_BY_SLURM if state.upper().startswith(k)), None)


def warn_in_time(params: dict) -> dict:
    """Slurm sends its time-limit warning signal_delay_s before the limit. A
    delay not shorter than the limit sends it as the job starts, before Python
    can answer it, and the signal kills the job unsaved: warn at half the limit."""
    limit_s = int(params.get("timeout_min") or 0) * 60
    delay_s = int(params.get("signal_delay_s") or 0)
    if not limit_s or delay_s < limit_s:
        return params
    log.warning("hydra.launcher.signal_delay_s=%d is not shorter than hydra.launcher.timeout_min=%s; "
                "Slurm warns the jobs %d s before the limit instead", delay_s, params["timeout_min"], limit_s // 2)
    return {**params, "signal_delay_s": limit_s // 2}


def stopped_by_warning(job_id: str, error: Exception) -> bool:
    """A job that Slurm's time-limit warning stopped before quantbench's handler
    ran: submitit raised at once (its error says so), or the signal came
    before Python could answer it (sacct: a step ended by that signal)."""
    import submitit
    from quantize.common.jobs import submitit_timed_out
    if submitit_timed_out(str(error)):
        return True
    sig = int(submitit.JobEnvironment._usr_sig())
    out = subprocess.run(["sacct", "-n", "-P", "-o", "ExitCode", "-j", job_id], capture_output=True, text=True)
    return out.returncode == 0 and any(code.strip().endswith(f":{sig}") for code in out.stdout.split())


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def refused(error: Exception) -> None:
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if "error" in line.lower() and line.strip()]
    why = lines[-1] if lines else text.strip().splitlines()[-1] if text.strip() else type(error).__name__
    why = re.sub(r"^.*?(sbatch: )?error: ", "", why)
    fail(f"Slurm refused the jobs: {why}; check hydra.launcher.partition, account, qos, "
         "cpus_per_task, mem_gb, gpus_per_node and timeout_min")


# --- what the cluster can run --------------------------------------------------------
def check_request(params: dict) -> None:
    """One line naming the setting to change when no node of the partition
    could ever run one job of this request (Slurm would leave it pending)."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        fail("sbatch/sinfo not found: run on a Slurm login node, or start the local cluster with "
             "`bash scripts/slurm_local.sh start` and export the SLURM_CONF it prints")
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%P|%c|%m|%G|%l"], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"Slurm does not answer ({(out.stderr.strip().splitlines() or ['sinfo failed'])[-1]}); "
             "start the local cluster with `bash scripts/slurm_local.sh start` and export the SLURM_CONF it "
             "prints, or set SLURM_CONF for your site")
    nodes = []
    for line in out.stdout.splitlines():
        part, cpus, mem, gres, limit = line.split("|")
        nodes.append({"partition": part.rstrip("*"), "default": part.endswith("*"), "cpus": _int(cpus),
                      "mem_mb": _int(mem), "gpus": _gpus(gres), "minutes": _minutes(limit)})
    partitions = sorted({n["partition"] for n in nodes})
    want = [p for p in str(params.get("partition") or "").split(",") if p]  # Slurm takes a list
    if want:
        unknown = [p for p in want if p not in partitions]
        if unknown:
            fail(f"hydra.launcher.partition={params['partition']}: no Slurm partition {unknown[0]} here (have: "
                 f"{', '.join(partitions) or 'none'}); set hydra.launcher.partition={(partitions or ['<name>'])[0]} "
                 "(or hydra/launcher=slurm_local for the cluster of scripts/slurm_local.sh)")
        nodes = [n for n in nodes if n["partition"] in want]
        where = f"partition {params['partition']}"
    else:
        nodes = [n for n in nodes if n["default"]]
        if not nodes:
            fail(f"no default Slurm partition; set hydra.launcher.partition=<one of: {', '.join(partitions)}>")
        where = f"partition {nodes[0]['partition']} (the default)"
    tasks = int(params.get("tasks_per_node") or 1)
    checks = [
        ("cpus_per_task", (params.get("cpus_per_task") or 1) * tasks, "cpus", "CPUs", 1 / tasks),
        ("mem_gb", (params.get("mem_gb") or 0) * 1024, "mem_mb", "GB of memory", 1 / 1024),
        ("gpus_per_node", params.get("gpus_per_node") or 0, "gpus", "GPUs", 1),
    ]
    for key, asked, field, unit, scale in checks:
        most = max((n[field] for n in nodes), default=0)
        if asked > most:
            fix = f"set hydra.launcher.{key}={int(most * scale)} or less" if most else \
                f"set hydra.launcher.{key}=null or pick another hydra.launcher.partition"
            fail(f"hydra.launcher.{key}={params.get(key)} asks for more {unit} than any node of {where} "
                 f"has ({int(most * scale)}); {fix}")
    limits = [n["minutes"] for n in nodes]
    limit = None if not limits or None in limits else max(limits)  # None: a node without a time limit
    if limit is not None and params.get("timeout_min", 0) > limit:
        fail(f"hydra.launcher.timeout_min={params['timeout_min']} is over the time limit of {where} "
             f"({limit} min); set hydra.launcher.timeout_min={limit} or less")


def _int(text: str) -> int:
    m = re.match(r"\d+", text.strip())
    return int(m.group()) if m else 0


def _gpus(gres: str) -> int:
    """`gpu:4`, `gpu:a100:4(S:0-1)`, `(null)` -> GPU count."""
    return sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", gres))


def _minutes(limit: str) -> Optional[int]:
    """sinfo time limit (`infinite`, `30:00`, `1-00:00:00`) -> minutes; None = no limit."""
    limit = limit.strip()
    if not limit or limit in ("infinite", "UNLIMITED", "n/a"):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    h, m, s = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 1440 + h * 60 + m + (1 if s else 0)

