"""On PYTHONPATH, makes every Python process see a CUDA machine (one NVIDIA
H200, sm90) in quantbench's machine facts: quantize.common.machine's CUDA
probe answers it, so `python -m evaluate` picks the cuda profile
(conf/hardware/cuda.yaml) and the capability layer applies its CUDA rules.
torch itself still sees no GPU, so the work runs on the CPU: an accuracy
reference asked for on cuda is computed on the CPU. Used by the tests that
check the CUDA entry point on any host (tests/evaluate/test_hardware_cuda_host.py). A
sitecustomize further down sys.path (e.g. tests/hosts/no_vllm_host) still runs."""
import os
from importlib.util import module_from_spec, spec_from_file_location

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = spec_from_file_location("_host_after_import", os.path.join(_HERE, os.pardir, "after_import.py"))
after_import = module_from_spec(_spec)
_spec.loader.exec_module(after_import)

GPUS = {"cuda": ((9, 0),), "gpu_names": ("NVIDIA H200",)}


def _machine(module):
    module.gpus = lambda: dict(GPUS)


def _accuracy(module):
    init = module.Reference.__init__

    def on_the_cpu(self, path, device):
        init(self, path, "cpu" if str(device).startswith("cuda") else device)

    module.Reference.__init__ = on_the_cpu


_PATCHES = {"quantize.common.machine": _machine, "evaluate.accuracy": _accuracy}

after_import.patch_after_import(_PATCHES)
after_import.run_next_sitecustomize(_HERE)
