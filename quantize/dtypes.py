"""Which dtype to compute in when the checkpoint's own dtype would be slow.

`auto` everywhere in quantbench (calibration, the accuracy reference, the hf
engine) means the checkpoint's dtype, except float32 for a bf16/fp16
checkpoint computed on a CPU without fast half-precision matmul."""
import json
import platform
from pathlib import Path

HALF = ("bfloat16", "float16")


def cpu_has_native_half() -> bool:
    """x86 CPUs without AVX512-BF16 or AMX run bf16/fp16 matmuls through a slow
    conversion path (measured on an AVX2 EPYC: a 512x576x1536 linear at
    17 GFLOPS in bf16 vs 147 in fp32). Other architectures are trusted."""
    import torch
    if platform.machine().lower() not in ("x86_64", "amd64", "i686"):
        return True
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def checkpoint_dtype(model_dir: Path):
    """The dtype a Hugging Face checkpoint's config.json declares (float32 if none)."""
    import torch
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return getattr(torch, config.get("dtype") or config.get("torch_dtype") or "float32")


def compute_dtype(checkpoint, requested: str = "auto", device: str | None = None):
    """`requested` as a torch dtype; `auto` is the checkpoint's dtype, except
    float32 for a half-precision checkpoint on such a CPU. `device` None means
    the accelerator if there is one, else the CPU."""
    import torch
    if requested not in (None, "auto"):
        dtype = getattr(torch, str(requested), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            from quantize.errors import UserError
            raise UserError(f"unknown dtype {requested!r}; use auto, float32, bfloat16 or float16")
        return dtype
    on_cpu = str(device).startswith("cpu") if device else not torch.accelerator.is_available()
    name = str(checkpoint).removeprefix("torch.")
    if name in HALF and on_cpu and not cpu_has_native_half():
        return torch.float32
    return checkpoint
