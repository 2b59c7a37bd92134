"""On PYTHONPATH with QUANTBENCH_TEST_FAIL_BATCH=<n>, engine=hf fails every
run (warm-up or timed) of a batch of n requests, as a GPU does on one batch
size too large for its memory; other batches run as usual. With
QUANTBENCH_TEST_FAIL_ACCURACY=1 its accuracy pass (prompt_logprobs) fails.
QUANTBENCH_TEST_FAIL_AS says how: `oom` (torch's CUDA out-of-memory error:
the device stays usable) or `device_lost` (a CUDA error after which every
later kernel fails, such as an illegal memory access). Used by
tests/evaluate/test_pipeline_failures.py. A sitecustomize further down
sys.path still runs."""
import os
from importlib.util import module_from_spec, spec_from_file_location

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = spec_from_file_location("_host_after_import", os.path.join(_HERE, os.pardir, "after_import.py"))
after_import = module_from_spec(_spec)
_spec.loader.exec_module(after_import)


def _error():
    import torch
    if os.environ.get("QUANTBENCH_TEST_FAIL_AS") == "device_lost":
        return RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
                            "asynchronously reported at some other API call")
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                  "of 139.80 GiB of which 1.10 GiB is free.")


def _fail(module):
    run = module.HfEngine.run
    batch = int(os.environ.get("QUANTBENCH_TEST_FAIL_BATCH") or 0)

    def failing_run(self, prompts, output_len, stream=True):
        if len(prompts) == batch:
            raise _error()
        return run(self, prompts, output_len, stream)

    def failing_prompt_logprobs(self, prompts, k):
        raise _error()

    module.HfEngine.run = failing_run
    if os.environ.get("QUANTBENCH_TEST_FAIL_ACCURACY") == "1":
        module.HfEngine.prompt_logprobs = failing_prompt_logprobs


after_import.patch_after_import({"evaluate.engines.hf": _fail})
after_import.run_next_sitecustomize(_HERE)
