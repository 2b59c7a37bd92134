"""Artifact sizes, estimated from the model's safetensors headers (no weights
are loaded) or read from an artifact's manifest."""
from dataclasses import dataclass
from math import prod
from pathlib import Path

from quantize.common import manifest
from quantize.common.checkpoint import DTYPE_BYTES, read_header, weight_files
from quantize.common.errors import UserError
from quantize.common.provenance import sha256_bytes, sha256_files
from quantize.common.recipe_edit import ConfigGroup, WeightScheme, config_groups, group_of
from quantize.common.sensitivity_file import Cell

# What an artifact holds beside its weights, as the model's folder has them:
# quantize writes the config and the tokenizer's files anew, never a training
# leftover (optimizer.pt) or a second copy of the weights (pytorch_model.bin).
CARRIED_FILES = ("config.json", *manifest.MODEL_FILES)


@dataclass(frozen=True)
class ModelWeights:
    """What the model's weight files hold: each tensor's dtype and shape."""
    tensors: dict[str, tuple[str, list[int]]]
    other_files_bytes: int        # CARRIED_FILES: an artifact carries them too

    @classmethod
    def read(cls, model_dir: Path) -> "ModelWeights":
        tensors = {}
        for path in weight_files(model_dir):
            header, _ = read_header(path)
            tensors |= {name: (t["dtype"], t["shape"]) for name, t in header.items() if name != "__metadata__"}
        carried = [Path(model_dir) / name for name in CARRIED_FILES]
        return cls(tensors=tensors, other_files_bytes=sum(p.stat().st_size for p in carried if p.is_file()))

    def linear(self, module: str) -> tuple[int, int, int]:
        """(rows, cols, bytes per value) of a Linear module's weight."""
        if f"{module}.weight" not in self.tensors:
            raise UserError(f"the model has no weight {module}.weight, which the sensitivity file names; "
                            "use the sensitivity file of this model (sensitivity=auto)")
        dtype, shape = self.tensors[f"{module}.weight"]
        return shape[0], prod(shape[1:]), DTYPE_BYTES.get(dtype, 2)


def dense_cost(cell: Cell, weights: ModelWeights, groups: list[ConfigGroup]) -> float:
    """Bytes a cell's modules add kept dense instead of quantized, each with
    the scheme of the group that takes it (none: it was dense already)."""
    total = 0.0
    for module in cell.modules:
        rows, cols, width = weights.linear(module)
        scheme = _scheme_of(module, groups)
        if scheme:
            total += rows * cols * width - scheme.bytes_per_matrix(rows, cols, width)
    return total


def estimated_uniform_bytes(weights: ModelWeights, groups: list[ConfigGroup]) -> float:
    """The recipe's artifact: each Linear weight with the scheme of the config
    group that takes it (recipe_edit.group_of), every other tensor as it is,
    plus the model's other files."""
    total = float(weights.other_files_bytes)
    for name, (dtype, shape) in weights.tensors.items():
        width = DTYPE_BYTES.get(dtype, 2)
        scheme = _scheme_of(name.removesuffix(".weight"), groups) if _is_linear_weight(name, shape) else None
        total += scheme.bytes_per_matrix(shape[0], shape[1], width) if scheme else prod(shape) * width
    return total


def _is_linear_weight(name: str, shape: list[int]) -> bool:
    """From the headers alone: a 2-D weight but the embeddings'."""
    return name.endswith(".weight") and len(shape) == 2 and "embed" not in name


def _scheme_of(module: str, groups: list[ConfigGroup]) -> WeightScheme | None:
    group = group_of(module, groups)
    return group.scheme if group else None


def expected_bytes(model_dir: Path, recipe_path: Path, recipe_data: dict) -> float:
    """The artifact a recipe makes of the model (quantize checks the disk has
    room for it): estimated_uniform_bytes of its config groups, so the model as
    it is where it quantizes no weights (the baseline, a KV-cache-only or
    pruning-only recipe)."""
    return estimated_uniform_bytes(ModelWeights.read(model_dir), config_groups(recipe_data, str(recipe_path)))


@dataclass(frozen=True)
class UniformSize:
    bytes: float
    source: str         # where the number comes from, in words


def uniform_size(artifact_dir: Path, recipe_text: str, model_dir: Path, weights: ModelWeights,
                 groups: list[ConfigGroup]) -> UniformSize:
    """The base recipe's artifact size: measured, from its manifest, when an
    artifact of this very recipe text and these very weights exists; else estimated."""
    found = manifest.read(artifact_dir)
    same_recipe = found and found.recipe.sha256 == sha256_bytes(recipe_text.encode())
    if same_recipe and found.bytes_on_disk.get("total") and _of_weights(found, model_dir):
        return UniformSize(float(found.bytes_on_disk["total"]),
                           f"measured: bytes_on_disk of {artifact_dir / manifest.FILE}")
    if not found:
        why = "no artifact of the base recipe"
    elif not same_recipe:
        why = "the artifact there was built from another recipe text"
    elif not found.bytes_on_disk.get("total"):
        why = "the artifact there records no bytes_on_disk"
    else:
        why = "the artifact there was built from other weights of that model name"
    return UniformSize(estimated_uniform_bytes(weights, groups),
                       f"estimated from the model's parameter count ({why} at {artifact_dir})")


def _of_weights(found: manifest.Manifest, model_dir: Path) -> bool:
    """The artifact was built from the model's weights (an artifact folder is
    named by the model's name, which another checkpoint may share). Hashes
    every byte, as the manifest does, only when an artifact of the recipe exists."""
    recorded = found.model.weights_sha256
    return bool(recorded) and recorded == sha256_files(weight_files(model_dir))
