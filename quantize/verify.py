"""Checks on checkpoints: weight files are whole before anything loads them,
the *saved* checkpoint reloads, and pruned layers really are 2:4."""
import json
import math
import struct
from pathlib import Path

from quantize.errors import UserError

# Bytes per element of each safetensors dtype (bit-packed types never appear here).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def check_weight_files(paths) -> None:
    """Every safetensors file has a readable header whose tensors fill the file
    exactly. Reads only the headers, so a truncated or corrupt download fails
    in milliseconds instead of deep inside a model loader or engine start-up."""
    for path in paths:
        problem = _safetensors_problem(Path(path))
        if problem:
            raise UserError(f"{path} is not a complete safetensors file ({problem}); "
                            "re-copy or re-create the checkpoint")


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than its 8-byte header length"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"header claims {n} bytes, the file holds {size - 8}"
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "header is not valid JSON"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    data, end = size - 8 - n, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = info["data_offsets"]
            width = DTYPE_BYTES.get(info["dtype"])  # an unknown dtype: trust its offsets
            want = math.prod(info["shape"]) * width if width else stop - start
        except (KeyError, TypeError, ValueError):
            return f"tensor {name} has a malformed header entry"
        if stop - start != want:
            return f"tensor {name} has {stop - start} bytes for shape {info['shape']} {info['dtype']}"
        end = max(end, stop)
    if end != data:
        return f"tensors need {end} data bytes, the file holds {data}"
    return None


def quantization_summary(artifact_dir: Path) -> dict:
    """What config.json says about the checkpoint's quantization."""
    config = json.loads((Path(artifact_dir) / "config.json").read_text())
    q = config.get("quantization_config")
    if not q:
        return {"method": None, "format": "dense", "schemes": []}
    schemes = []
    for group in (q.get("config_groups") or {}).values():
        w, a = group.get("weights") or {}, group.get("input_activations") or {}
        schemes.append({
            "weights": _describe_args(w), "activations": _describe_args(a) if a else None,
        })
    return {"method": q.get("quant_method"), "format": q.get("format"), "schemes": schemes,
            "ignore": q.get("ignore", [])}


def _describe_args(args: dict) -> dict:
    keys = ("num_bits", "type", "symmetric", "strategy", "group_size", "dynamic")
    return {k: args.get(k) for k in keys if k in args}


def reload_dense(artifact_dir: Path):
    """Load the checkpoint with transformers, decompressed to dense weights."""
    from transformers import AutoModelForCausalLM

    from quantize import moe
    config = json.loads((Path(artifact_dir) / "config.json").read_text())
    if moe.is_moe(config) and config.get("quantization_config"):
        return moe.reload_dense(artifact_dir)  # per-expert quantized tensors: see quantize/moe.py
    kwargs = {}
    if quantization_summary(artifact_dir)["method"] == "compressed-tensors":
        from transformers import CompressedTensorsConfig
        kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    return AutoModelForCausalLM.from_pretrained(artifact_dir, dtype="auto", **kwargs)


def sparsity_report(model, n: int = 2, m: int = 4) -> dict:
    """Measured sparsity of pruned Linear layers and whether each holds n:m.

    A layer counts as pruned when at least a third of its weights are exactly
    zero (dense trained weights have almost none); every group of m consecutive
    input weights in a pruned layer must hold at least n zeros."""
    import torch
    zeros = total = 0
    pruned, broken = [], []
    worst = 1.0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.endswith("lm_head"):
            continue
        w = module.weight.detach()
        is_zero = w == 0
        if is_zero.float().mean().item() < 1 / 3 or w.shape[1] % m:
            continue
        pruned.append(name)
        zeros += int(is_zero.sum())
        total += w.numel()
        groups_ok = (is_zero.reshape(w.shape[0], -1, m).sum(-1) >= n).float().mean().item()
        worst = min(worst, groups_ok)
        if groups_ok < 1.0:
            broken.append(name)
    return {
        "pattern": f"{n}:{m}",
        "pruned_layers": len(pruned),
        "measured_sparsity": round(zeros / total, 6) if total else 0.0,
        "all_layers_hold_pattern": bool(pruned) and not broken,
        "layers_breaking_pattern": broken,
        "worst_layer_groups_ok": round(worst, 6) if pruned else None,
    }
