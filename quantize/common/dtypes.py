"""Which dtype to compute in when the checkpoint's own dtype would be slow.

`auto` everywhere in quantbench (calibration, the accuracy reference, the hf
engine) means the checkpoint's dtype, except float32 for a bf16 or fp16
checkpoint computed on a CPU that does not multiply that dtype in hardware."""
import json
from pathlib import Path
from typing import Collection

from quantize.common.machine import HALF, detect


def cpu_native_half() -> frozenset:
    """The half-precision dtypes this CPU multiplies in hardware (see quantize.common.machine)."""
    return detect().cpu_native_half


def fast_faithful_dtype(checkpoint: str, on_cpu: bool, cpu_native_half: Collection[str]) -> str:
    """The checkpoint's dtype name, except float32 for a half-precision dtype
    the CPU does not multiply natively (Machine.cpu_native_half): the same
    numbers, several times faster. Not the other half dtype: bf16 holds
    fewer mantissa bits than fp16, and fp16 a narrower range than bf16."""
    return "float32" if checkpoint in HALF and on_cpu and checkpoint not in cpu_native_half else checkpoint


def checkpoint_dtype(model_dir: Path):
    """The dtype a Hugging Face checkpoint's config.json declares (float32 if none)."""
    return config_dtype(json.loads((Path(model_dir) / "config.json").read_text()))


def config_dtype(config: dict):
    """The dtype a config.json's object declares (float32 if none)."""
    import torch
    return getattr(torch, config.get("dtype") or config.get("torch_dtype") or "float32")


def requested_dtype(requested, key: str = "dtype"):
    """A requested dtype name as a torch floating dtype; None for auto (or unset).
    Checked as the config is read: `dtype=0` or `dtype=` is a typo, not auto."""
    if requested is None or requested == "auto":
        return None
    import torch
    dtype = getattr(torch, requested, None) if isinstance(requested, str) else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        from quantize.common.errors import UserError
        from quantize.common.settings import shown
        raise UserError(f"{key}={shown(requested)}: unknown dtype; use auto, float32, bfloat16 or float16")
    return dtype


def dtype_name(requested) -> str | None:
    """A requested dtype name as torch's own name for that dtype (half ->
    float16, float -> float32, double -> float64); None for auto (or unset).
    torch takes these aliases, so widths and kernel rules must read them alike.
    A name torch lacks comes back as it is, for the engine to refuse."""
    if requested in ("float64", "float32", *HALF):
        return requested  # the usual names, without importing torch
    from quantize.common.errors import UserError
    try:
        dtype = requested_dtype(requested)
    except UserError:  # no torch dtype: the engine's own check of its args names it, in its own terms
        return requested
    return None if dtype is None else str(dtype).removeprefix("torch.")


def compute_dtype(checkpoint, requested: str = "auto", device: str | None = None):
    """`requested` as a torch dtype; `auto` is the checkpoint's dtype, except
    float32 for a half-precision checkpoint on such a CPU. `device` None means
    the accelerator if there is one, else the CPU."""
    import torch
    dtype = requested_dtype(requested)
    if dtype is not None:
        return dtype
    on_cpu = str(device).startswith("cpu") if device else not torch.accelerator.is_available()
    name = str(checkpoint).removeprefix("torch.")
    return getattr(torch, fast_faithful_dtype(name, on_cpu, cpu_native_half() if on_cpu else frozenset()))
