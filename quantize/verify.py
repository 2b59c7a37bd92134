"""Checks on a freshly quantized artifact: the *saved* checkpoint reloads and
pruned layers really are 2:4 (weight-file checks: quantize.common.checkpoint)."""
import json
from pathlib import Path

from quantize.common.checkpoint import quantization_summary

def reload_dense(artifact_dir: Path):
    """Load the checkpoint with transformers, decompressed to dense weights."""
    from transformers import AutoModelForCausalLM

    from quantize.common import moe
    config = json.loads((Path(artifact_dir) / "config.json").read_text())
    if moe.is_moe(config) and config.get("quantization_config"):
        return moe.reload_dense(artifact_dir)  # per-expert quantized tensors: see quantize/common/moe.py
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
