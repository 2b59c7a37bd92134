"""Will the model fit? Checked before quantize loads anything, from the
safetensors headers alone, so a model too big for the machine fails in
milliseconds with one line instead of minutes later with the kernel's OOM kill.

- CPU memory holds the whole model: transformers loads it on the CPU, and
  llm-compressor's sequential pipeline moves one decoder layer at a time to
  the GPU (`pipelines/sequential/pipeline.py`: `set_onload_device`), keeping
  the rest, and the activations between layers, on the CPU.
- GPU memory (CUDA) holds the decoder layer being calibrated: its weights and,
  for GPTQ and SparseGPT, one float32 Hessian (in_features x in_features)
  per Linear in it, which for an 8B Llama outweighs the layer's own weights.
"""
import math
import re
from dataclasses import dataclass
from pathlib import Path

from quantize.common.checkpoint import read_header, weight_files
from quantize.common.errors import UserError

# Bytes per element of the dtypes a model is held in, by torch's name (dtype_width
# reads aliases such as half); auto or unset counts as float32's 4 (config.json's default dtype).
DTYPE_WIDTH = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
# Safetensors dtypes that `from_pretrained(dtype="auto")` casts to the model's
# dtype; integer tensors (packed quantized weights) keep their stored width.
FLOAT_TENSORS = {"F64", "F32", "F16", "BF16"}
STORED_WIDTH = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U64": 8, "I32": 4, "U32": 4,
                "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
# A decoder layer's tensors share the prefix up to its index (model.layers.7.,
# model.language_model.layers.7., transformer.h.7.).
LAYER = re.compile(r"^(.*?\.(?:layers|h|blocks)\.\d+)\.")
# Modifiers that keep a float32 Hessian per Linear of the layer being calibrated.
HESSIAN_MODIFIERS = ("GPTQModifier", "SparseGPTModifier")
# Beside the weights: the imported libraries (torch, transformers,
# llm-compressor: ~1 GiB resident), the calibration set and the activations
# cached between layers.
CPU_HEADROOM = 1 << 30
# Beside the layer: the calibration sample's activations and kernel workspaces.
GPU_HEADROOM = 512 << 20


@dataclass(frozen=True)
class Footprint:
    """What a checkpoint takes in memory, at the dtype the model is held in."""
    params: int
    dtype: str
    weight_bytes: int
    layer: str | None        # the largest decoder layer's name prefix
    layer_bytes: int         # its parameters
    layer_hessian_bytes: int  # its Hessians (0 when the recipe keeps none)

    @property
    def gpu_need(self) -> int:
        return self.layer_bytes + self.layer_hessian_bytes + GPU_HEADROOM


@dataclass(frozen=True)
class FreeMemory:
    """Memory available now; `gpu_bytes` None: no CUDA device."""
    ram_bytes: int
    gpu_bytes: int | None = None
    gpu_name: str = "the GPU"


def footprint(model_dir: Path, dtype: str, hessians: bool = False) -> Footprint:
    """The checkpoint's size held in `dtype` (floating tensors; integer ones
    keep their width), and its largest decoder layer with its Hessians."""
    width = dtype_width(dtype)
    params = total = 0
    layers: dict[str, list[int]] = {}  # prefix -> [weight bytes, hessian bytes]
    for path in weight_files(model_dir):
        header, _ = read_header(path)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            shape, kind = info["shape"], info["dtype"]
            n = math.prod(shape)
            size = n * (width if kind in FLOAT_TENSORS else STORED_WIDTH.get(kind, 1))
            params, total = params + n, total + size
            match = LAYER.match(name)
            if match:
                layer = layers.setdefault(match.group(1), [0, 0])
                layer[0] += size
                layer[1] += _hessian_bytes(name, shape) if hessians and kind in FLOAT_TENSORS else 0
    name, (layer_bytes, hessian) = max(layers.items(), key=lambda kv: sum(kv[1]), default=(None, (0, 0)))
    return Footprint(params, dtype, total, name, layer_bytes, hessian)


def _hessian_bytes(name: str, shape: list[int]) -> int:
    """GPTQ's float32 in x in Hessian of a Linear weight ([out, in]; stacked
    experts [n, out, in] become n Linears, quantize/common/moe.py)."""
    if not name.endswith("weight") or len(shape) not in (2, 3):
        return 0
    experts = shape[0] if len(shape) == 3 else 1
    return experts * shape[-1] ** 2 * 4


def wider(*dtypes: str | None) -> str:
    """Of the dtypes the model passes through, the one that takes most memory."""
    return max((d for d in dtypes if d), key=dtype_width)


def dtype_width(dtype: str | None) -> int:
    """Bytes per element of a dtype name (an alias as its dtype: half is 2, double 8)."""
    from quantize.common.dtypes import dtype_name
    return DTYPE_WIDTH.get(dtype_name(dtype), 4)


def check(model_dir: Path, dtype: str, *, on_gpu: bool, hessians: bool,
          free: FreeMemory | None = None) -> Footprint:
    """Raise a one-line UserError when the model cannot fit; `free` is
    measured when not given (tests inject it)."""
    need = footprint(model_dir, dtype, hessians)
    free = free or free_memory(gpu=on_gpu)
    # On the CPU the Hessians live in RAM beside the weights.
    ram_need = need.weight_bytes + CPU_HEADROOM + (0 if on_gpu else need.layer_hessian_bytes)
    if ram_need > free.ram_bytes:
        raise UserError(
            f"model {Path(model_dir).name} ({need.params / 1e9:.2f}B parameters, {gib(need.weight_bytes)} "
            f"in {dtype}) needs {gib(ram_need)} of memory and {gib(free.ram_bytes)} is free; use a machine "
            "with more memory or run fewer jobs at once (hydra.launcher.n_jobs); memory_check=false skips this check")
    if on_gpu and free.gpu_bytes is not None and need.gpu_need > free.gpu_bytes:
        hessian = f" + {gib(need.layer_hessian_bytes)} of Hessians" if need.layer_hessian_bytes else ""
        raise UserError(
            f"model {Path(model_dir).name}'s largest layer {need.layer} needs {gib(need.gpu_need)} of GPU "
            f"memory ({gib(need.layer_bytes)} in {dtype}{hessian}) and {free.gpu_name} has "
            f"{gib(free.gpu_bytes)} free; use a GPU with more memory or stop the other jobs on it; "
            "memory_check=false skips this check")
    return need


def free_memory(gpu: bool) -> FreeMemory:
    ram = _available_ram()
    if not gpu:
        return FreeMemory(ram)
    import torch
    device = torch.cuda.current_device()  # llm-compressor onloads to the main device (utils/dev.py)
    free, _ = torch.cuda.mem_get_info(device)
    return FreeMemory(ram, free, torch.cuda.get_device_name(device))


def _available_ram() -> int:
    """MemAvailable, or less where this process's cgroup caps it (containers,
    Slurm jobs with memory limits): the kernel kills at the lower of the two."""
    import psutil
    available = psutil.virtual_memory().available
    return min(available, _cgroup_room() or available)


# (limit, usage, the usage's reclaimable page cache in memory.stat) for cgroup v2, then v1.
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
                 "/sys/fs/cgroup/memory.stat", "inactive_file"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                 "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"))


def _cgroup_room() -> int | None:
    """Bytes left under this cgroup's memory limit; None: no limit."""
    for limit, usage, stat, cache_key in CGROUP_FILES:
        try:
            cap = Path(limit).read_text().strip()
            if cap == "max" or int(cap) >= 1 << 60:  # unlimited
                return None
            used = int(Path(usage).read_text()) - _stat(Path(stat), cache_key)
            return max(0, int(cap) - used)
        except (OSError, ValueError):
            continue
    return None


def _stat(path: Path, key: str) -> int:
    """One counter of a cgroup memory.stat file (0 if absent)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def on_gpu() -> bool:
    """Whether llm-compressor will calibrate on a CUDA GPU (its main device)."""
    import torch
    return torch.cuda.is_available()
