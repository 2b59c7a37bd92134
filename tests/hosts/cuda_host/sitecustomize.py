"""On PYTHONPATH, makes every Python process see a CUDA machine (one NVIDIA
H200, sm90) in quantbench's machine facts: quantize.common.machine's CUDA
probe answers it, so `python -m evaluate` picks the cuda profile
(conf/hardware/cuda.yaml) and the capability layer applies its CUDA rules.
torch itself still sees no GPU, so the work runs on the CPU: an accuracy
reference asked for on cuda is computed on the CPU. Used by the tests that
check the CUDA entry point on any host (tests/evaluate/test_hardware_cuda_host.py). A
sitecustomize further down sys.path (e.g. tests/hosts/no_vllm_host) still runs."""
import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import PathFinder
from importlib.util import module_from_spec

_HERE = os.path.dirname(os.path.abspath(__file__))
GPUS = {"cuda": ((9, 0),), "gpu_names": ("NVIDIA H200",)}


def _machine(module):
    module._cuda = lambda: dict(GPUS)


def _accuracy(module):
    init = module.Reference.__init__

    def on_the_cpu(self, path, device):
        init(self, path, "cpu" if str(device).startswith("cuda") else device)

    module.Reference.__init__ = on_the_cpu


_PATCHES = {"quantize.common.machine": _machine, "evaluate.accuracy": _accuracy}


class _PatchAfterImport(MetaPathFinder):
    """Finds the modules above as usual and patches each once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES:
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchAfterImport())

# The next sitecustomize: the first one in the sys.path entries after this folder.
_after = [os.path.abspath(p or ".") for p in sys.path]
_after = sys.path[_after.index(_HERE) + 1:] if _HERE in _after else []
_spec = PathFinder.find_spec("sitecustomize", _after)
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(module_from_spec(_spec))
