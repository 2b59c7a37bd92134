"""On PYTHONPATH, makes every Python process see a machine without Ray, as
one set up from a minimal set of wheels: `import ray` and `import
hydra_plugins.hydra_ray_launcher` (or any module below them) raise
ModuleNotFoundError, importlib.util.find_spec answers None for them, and
Hydra's plugin scan (pkgutil) does not find hydra_ray_launcher's folder.
A sitecustomize further down sys.path still runs."""
import importlib.util
import os
import pkgutil
from importlib.abc import MetaPathFinder
from importlib.util import module_from_spec, spec_from_file_location
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = spec_from_file_location("_host_after_import", os.path.join(_HERE, os.pardir, "after_import.py"))
after_import = module_from_spec(_spec)
_spec.loader.exec_module(after_import)

_HIDDEN = ("ray", "hydra_plugins.hydra_ray_launcher")


def _hidden(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in _HIDDEN)


class _NoRay(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if _hidden(name):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by tests/hosts/no_ray_host)", name=name)
        return None


sys.meta_path.insert(0, _NoRay())
_find_spec = importlib.util.find_spec
_iter_modules = pkgutil.iter_modules


def _find_spec_without_ray(name, package=None):
    return None if _hidden(name) else _find_spec(name, package)


def _iter_modules_without_ray(path=None, prefix=""):
    return (m for m in _iter_modules(path, prefix) if not _hidden(prefix + m.name))


importlib.util.find_spec = _find_spec_without_ray
pkgutil.iter_modules = _iter_modules_without_ray

after_import.run_next_sitecustomize(_HERE)
