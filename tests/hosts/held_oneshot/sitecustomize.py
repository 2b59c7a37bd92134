"""On PYTHONPATH, llm-compressor's oneshot prints HELD_IN_ONESHOT (this
folder's __init__.py) and then waits until a signal ends the process: a test
that signals quantize mid-build does so while it waits here, inside the
build's oneshot phase, however fast or busy the machine. Used by the tests
that signal or kill a build (tests/test_failure_lines.py, test_atomic.py,
test_build_lock.py, test_sweeps.py) through quantize_env(host="held_oneshot").
A sitecustomize further down sys.path still runs."""
import os
import time
from importlib.util import module_from_spec, spec_from_file_location

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = spec_from_file_location("_host_after_import", os.path.join(_HERE, os.pardir, "after_import.py"))
after_import = module_from_spec(_spec)
_spec.loader.exec_module(after_import)
_spec = spec_from_file_location("_held_oneshot", os.path.join(_HERE, "__init__.py"))
names = module_from_spec(_spec)
_spec.loader.exec_module(names)

POLL_S = 0.1  # Ctrl-C's KeyboardInterrupt is raised in the sleep


def _hold(module):
    def held(*args, **kwargs):
        print(names.HELD_IN_ONESHOT, flush=True)
        while True:
            time.sleep(POLL_S)

    module.oneshot = held


after_import.patch_after_import({"llmcompressor": _hold})
after_import.run_next_sitecustomize(_HERE)
