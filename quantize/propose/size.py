"""Artifact sizes, estimated from the model's safetensors headers (no weights
are loaded) or read from an artifact's manifest."""
from dataclasses import dataclass
from math import prod
from pathlib import Path

from quantize.common import manifest
from quantize.common.checkpoint import DTYPE_BYTES, read_header, weight_files
from quantize.common.errors import UserError
from quantize.common.provenance import sha256_bytes, sha256_files
from quantize.common.recipe_edit import WeightScheme, quantization_ignore, quantizes, weight_scheme
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


def dense_cost(cell: Cell, weights: ModelWeights, scheme: WeightScheme) -> float:
    """Bytes a cell's modules add kept dense instead of quantized."""
    total = 0.0
    for module in cell.modules:
        rows, cols, width = weights.linear(module)
        total += rows * cols * width - scheme.bytes_per_matrix(rows, cols, width)
    return total


def estimated_uniform_bytes(weights: ModelWeights, scheme: WeightScheme, ignore: list[str]) -> float:
    """The base recipe's artifact: each Linear weight its targets match and its
    `ignore` lists do not quantized, every other tensor as it is, plus the
    model's other files."""
    total = float(weights.other_files_bytes)
    for name, (dtype, shape) in weights.tensors.items():
        width = DTYPE_BYTES.get(dtype, 2)
        quantized = _is_linear_weight(name, shape) and _targeted(name.removesuffix(".weight"), scheme.targets, ignore)
        total += scheme.bytes_per_matrix(shape[0], shape[1], width) if quantized else prod(shape) * width
    return total


def _is_linear_weight(name: str, shape: list[int]) -> bool:
    """From the headers alone: a 2-D weight but the embeddings'."""
    return name.endswith(".weight") and len(shape) == 2 and "embed" not in name


def _targeted(module: str, targets: tuple[str, ...], ignore: list[str]) -> bool:
    """As compressed-tensors matches a Linear: a target or ignore entry is a
    module name, a `re:` pattern or a class (Linear: every Linear; another
    class is no Linear's)."""
    from compressed_tensors.utils.match import match_name
    if any(match_name(module, entry) for entry in ignore):
        return False
    return any(target == "Linear" or match_name(module, target) for target in targets)


def dense_bytes(weights: ModelWeights) -> float:
    """The model as it is: every tensor at its stored width, and its other files."""
    return weights.other_files_bytes + sum(prod(shape) * DTYPE_BYTES.get(dtype, 2)
                                           for dtype, shape in weights.tensors.values())


def expected_bytes(model_dir: Path, recipe_path: Path, recipe_data: dict) -> float:
    """The artifact a recipe makes of the model (quantize checks the disk has
    room for it): its weights quantized with the recipe's weight scheme, but
    those it ignores; as they are where it quantizes none (the baseline, a
    KV-cache-only or pruning-only recipe)."""
    weights = ModelWeights.read(model_dir)
    scheme = weight_scheme(recipe_path) if quantizes(recipe_data) else None
    if scheme is None:
        return dense_bytes(weights)
    return estimated_uniform_bytes(weights, scheme, quantization_ignore(recipe_data))


@dataclass(frozen=True)
class UniformSize:
    bytes: float
    source: str         # where the number comes from, in words


def uniform_size(artifact_dir: Path, recipe_text: str, model_dir: Path, weights: ModelWeights, scheme: WeightScheme,
                 ignore: list[str]) -> UniformSize:
    """The base recipe's artifact size: measured, from its manifest, when an
    artifact of this very recipe text and these very weights exists; else estimated."""
    found = manifest.read(artifact_dir, fix="delete it or pass artifacts_dir=<another folder>")
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
    return UniformSize(estimated_uniform_bytes(weights, scheme, ignore),
                       f"estimated from the model's parameter count ({why} at {artifact_dir})")


def _of_weights(found: manifest.Manifest, model_dir: Path) -> bool:
    """The artifact was built from the model's weights (an artifact folder is
    named by the model's name, which another checkpoint may share). Hashes
    every byte, as the manifest does, only when an artifact of the recipe exists."""
    recorded = found.model.weights_sha256
    return bool(recorded) and recorded == sha256_files(weight_files(model_dir))
