"""On PYTHONPATH with QUANTBENCH_TEST_STALL_MARKER=<file>, the engine core of
the first vLLM start (the one that creates the marker file) sleeps instead of
initialising, as a start-up that hangs does (a stuck compile, a lost worker):
vLLM's front end waits for it, so that start is never ready however fast or
loaded the machine is, and later starts run normally. The front end picks
the start (AsyncLLM.from_engine_args) and tells its engine core through the
environment the core inherits. Used by the start-up timeout test
(tests/evaluate/test_pipeline_failures.py). A sitecustomize further down sys.path
still runs."""
import functools
import os
import time
from importlib.util import module_from_spec, spec_from_file_location

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = spec_from_file_location("_host_after_import", os.path.join(_HERE, os.pardir, "after_import.py"))
after_import = module_from_spec(_spec)
_spec.loader.exec_module(after_import)

MARKER = "QUANTBENCH_TEST_STALL_MARKER"
STALL = "QUANTBENCH_TEST_STALL_THIS_CORE"


def _first_start() -> bool:
    try:
        os.close(os.open(os.environ[MARKER], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except (KeyError, FileExistsError):
        return False


def _mark_first_start(module):
    from_engine_args = module.AsyncLLM.from_engine_args.__func__

    def marked(cls, *args, **kwargs):
        if not _first_start():
            return from_engine_args(cls, *args, **kwargs)
        os.environ[STALL] = "1"  # the engine core starts inside this call and inherits it
        try:
            return from_engine_args(cls, *args, **kwargs)
        finally:
            os.environ.pop(STALL, None)

    module.AsyncLLM.from_engine_args = classmethod(marked)


def _stall_marked_core(module):
    run = module.EngineCoreProc.run_engine_core

    @functools.wraps(run)  # pickled by name when the core is spawned
    def run_engine_core(*args, **kwargs):
        while os.environ.get(STALL):  # until the front end's start-up timeout kills this process
            time.sleep(1)
        return run(*args, **kwargs)

    module.EngineCoreProc.run_engine_core = staticmethod(run_engine_core)


after_import.patch_after_import({"vllm.v1.engine.async_llm": _mark_first_start,
                                 "vllm.v1.engine.core": _stall_marked_core})
after_import.run_next_sitecustomize(_HERE)
