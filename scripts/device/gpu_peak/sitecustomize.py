"""On PYTHONPATH (scripts/device_check.sh puts it there for each GPU step),
records the process's peak GPU memory as torch's caching allocator saw it:
at exit, a process that used CUDA appends `<pid> <peak reserved MiB>` to the
file named by DEVICE_CHECK_GPU_PEAK_FILE. That is the step's own memory,
without the CUDA context (~0.5 GiB) and without other processes on the GPU.
A sitecustomize further down sys.path (a distribution's own) still runs."""
import atexit
import os
import sys
from importlib.machinery import PathFinder
from importlib.util import module_from_spec

_HERE = os.path.dirname(os.path.abspath(__file__))


def _record() -> None:
    path = os.environ.get("DEVICE_CHECK_GPU_PEAK_FILE")
    torch = sys.modules.get("torch")
    if not path or torch is None:
        return
    try:
        if not torch.cuda.is_initialized():
            return
        peak = max(torch.cuda.max_memory_reserved(i) for i in range(torch.cuda.device_count()))
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {peak / 2**20:.0f}\n")
    except Exception:  # noqa: BLE001 - a measurement must never fail the step
        pass


atexit.register(_record)

# The next sitecustomize: the first one in the sys.path entries after this folder.
_after = [os.path.abspath(p or ".") for p in sys.path]
_after = sys.path[_after.index(_HERE) + 1:] if _HERE in _after else []
_spec = PathFinder.find_spec("sitecustomize", _after)
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(module_from_spec(_spec))
