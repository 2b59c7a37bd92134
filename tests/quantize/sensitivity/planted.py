"""A tiny model with one planted sensitive cell: layer 1's mlp.down_proj.

One input column per group of 64 of that module is dead (the matching rows
of gate_proj and up_proj are zero, so its input there is always 0) and holds
an outlier 100x the module's largest weight. The model computes exactly what
it did without the outliers, but any int4 group (or int8 channel) grid sized
to the outlier rounds the module's other weights to 0: quantizing this cell
alone removes its whole output, scaled up 4x so that it matters."""
import shutil
from pathlib import Path

PLANTED_LAYER, PLANTED_GROUP = 1, "mlp.down_proj"


def build_planted(source: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(source, use_safetensors=True)
    mlp = model.model.layers[PLANTED_LAYER].mlp
    dead = torch.arange(0, mlp.down_proj.in_features, 64)
    with torch.no_grad():
        mlp.gate_proj.weight[dead] = 0
        mlp.up_proj.weight[dead] = 0
        down = mlp.down_proj.weight
        down *= 4
        down[:, dead] = 100 * down.abs().max()
    model.save_pretrained(out, safe_serialization=True)
    for path in Path(source).glob("*token*"):
        shutil.copy(path, out / path.name)
    return out
