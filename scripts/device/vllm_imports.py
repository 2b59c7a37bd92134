"""Does the carried vLLM import, with every module the `python -m evaluate
engine=vllm` path loads, in this Python? Prints each module with where it
came from (the carried site or the image's own packages) and exits 1 naming
the first package that is missing, so the device check stops before it
quantizes anything for an engine that cannot start.

    python scripts/device/vllm_imports.py [--no-gpu]

--no-gpu (the CPU dry run): vLLM's native kernels need the GPU driver
(libcuda.so.1), so their ImportError is reported, not counted; any other
failure still counts.
"""
import importlib
import sys
import time
from importlib import metadata

# The in-process engine's path, in the order a start loads it (vLLM 0.26-0.32
# layout): the public API, the engine and its client, the GPU worker and model
# runner, the model, the compressed-tensors schemes, attention and sampling,
# the executors, the custom ops; then quantbench's own engine module.
MODULES = (
    "vllm", "vllm.entrypoints.llm", "vllm.v1.engine.async_llm", "vllm.v1.engine.core", "vllm.v1.engine.core_client",
    "vllm.v1.executor.uniproc_executor", "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.model_executor.models.llama",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
    "vllm.v1.attention.backends.flash_attn", "vllm.v1.sample.sampler", "vllm._custom_ops",
    "evaluate.engines.vllm", "evaluate.engines.vllm_schemes", "evaluate.engines.vllm_startup",
)
# vLLM's native kernels (CUDA build, 0.26 layout): they load only beside an NVIDIA driver.
NATIVE = ("vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch", "vllm.vllm_flash_attn.flash_attn_interface")


def main(argv: list[str]) -> int:
    no_gpu = "--no-gpu" in argv
    try:
        print(f"vllm {metadata.version('vllm')} from {metadata.distribution('vllm').locate_file('')}, "
              f"torch {metadata.version('torch')}, transformers {metadata.version('transformers')}, "
              f"python {sys.version.split()[0]}")
    except metadata.PackageNotFoundError as e:
        print(f"vllm_imports: {e.name} is not installed in this Python: install the bundle first "
              "(bash scripts/device_check.sh joins and installs it)", file=sys.stderr)
        return 1
    for name in MODULES + NATIVE:
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure to import is the answer
            text = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            # a missing Python package (ModuleNotFoundError) counts even here
            if no_gpu and name in NATIVE and isinstance(e, ImportError) and not isinstance(e, ModuleNotFoundError):
                print(f"  {name:78s} needs the GPU driver ({text[:120]})")
                continue
            missing = getattr(e, "name", None)
            print(f"  {name:78s} FAIL {text[:200]}")
            print(f"vllm_imports: {name} does not import ({text[:200]})"
                  + (f": add {missing} to the bundle (scripts/device/vllm-*.txt)" if missing else ""),
                  file=sys.stderr)
            return 1
        print(f"  {name:78s} ok  {time.perf_counter() - t0:5.1f} s  {getattr(module, '__file__', '?')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
