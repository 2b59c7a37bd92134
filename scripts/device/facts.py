"""The machine as the device check's Python sees it: interpreter, torch and
its devices, the versions of what the stages use, and whether each module the
stages import imports (with where from: the device's own site-packages or the
carried wheels). Exits 1 if a module the stages need does not import.

    python scripts/device/facts.py
"""
import importlib
import sys
from importlib import metadata

# What `python -m quantize` / `python -m evaluate` and the tests import.
NEEDED = ("torch", "transformers", "safetensors", "numpy", "yaml", "psutil", "accelerate", "datasets",
          "compressed_tensors", "llmcompressor", "hydra", "omegaconf", "submitit", "aiohttp", "pynvml",
          "matplotlib", "pytest", "xdist")
# Reported, never required here: the serving engine.
OPTIONAL = ("vllm",)
DISTRIBUTIONS = ("torch", "transformers", "accelerate", "llmcompressor", "compressed-tensors", "hydra-core",
                 "omegaconf", "datasets", "pyarrow", "pydantic", "huggingface-hub", "safetensors", "tokenizers",
                 "numpy", "triton", "nvidia-ml-py", "pytest", "pytest-xdist", "vllm")


def main() -> int:
    print(f"python {sys.version.split()[0]} ({sys.executable})")
    import torch
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.get_num_threads()} CPU threads")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"  cuda:{i} {p.name}, sm{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB, "
                  f"{p.multi_processor_count} SMs")
        print(f"  bf16 supported: {torch.cuda.is_bf16_supported()}")
    else:
        print("  no CUDA device")
    print("versions:")
    for name in DISTRIBUTIONS:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "-"
        print(f"  {name:20s} {version}")
    missing = []
    print("imports:")
    for mod in NEEDED + OPTIONAL:
        try:
            m = importlib.import_module(mod)
            print(f"  {mod:20s} ok   {getattr(m, '__file__', '?')}")
        except Exception as e:  # noqa: BLE001 - any failure to import is the answer
            print(f"  {mod:20s} FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200])
            if mod in NEEDED:
                missing.append(mod)
    if missing:
        print(f"facts: {len(missing)} module(s) the stages need do not import: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
