"""What the sitecustomize.py of a tests/hosts/ folder shares: patching a
module right after it is imported (the module itself is imported lazily, as
the program would), and running the next sitecustomize on sys.path, so host
folders stack (e.g. cuda_host over no_vllm_host). A sitecustomize loads this
file by its path: at interpreter start tests/ need not be importable."""
import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import PathFinder
from importlib.util import module_from_spec
from typing import Callable


class PatchAfterImport(MetaPathFinder):
    """Finds the named modules as usual and calls patch(module) once each has run."""

    def __init__(self, patches: dict[str, Callable]):
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        if name not in self.patches:
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.patches[name](module)

        spec.loader.exec_module = exec_module
        return spec


def patch_after_import(patches: dict[str, Callable]) -> None:
    sys.meta_path.insert(0, PatchAfterImport(patches))


def run_next_sitecustomize(here: str) -> None:
    """The first sitecustomize in the sys.path entries after the folder `here`."""
    paths = [os.path.abspath(p or ".") for p in sys.path]
    after = sys.path[paths.index(here) + 1:] if here in paths else []
    spec = PathFinder.find_spec("sitecustomize", after)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(module_from_spec(spec))
