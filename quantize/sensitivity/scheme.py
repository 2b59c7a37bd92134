"""The weight scheme a recipe applies, and round-to-nearest fake quantization
of one weight on that scheme's grid (compressed-tensors' own qparams and
fake_quantize: the grid llm-compressor saves).

Weights only: a scheme's activation quantization (W8A8, FP8_DYNAMIC) is
recorded but not applied, so a cell's KL is the error of its weights alone."""
from dataclasses import dataclass

from quantize import recipe as recipes
from quantize.common.errors import UserError
from quantize.common.provenance import sha256_json
from quantize.common.recipe_edit import config_groups
from quantize.common.sensitivity_file import USUAL_MODULES, modules_of

APPLIED = ("weights only: round-to-nearest fake quantization with min-max scales on the scheme's grid; "
           "activation quantization is not applied")
SUPPORTED_STRATEGIES = ("tensor", "channel", "group")


@dataclass(frozen=True)
class WeightScheme:
    """The recipe's quantization modifier: what it quantizes and how."""
    weights: object                 # compressed_tensors QuantizationArgs
    input_activations: object       # QuantizationArgs or None (16-bit activations)
    targets: list[str]
    ignore: list[str]

    @property
    def key(self) -> str:
        """e.g. w4a16-g64-asym, w8a16-channel-sym, w8a8-fp8-channel-sym; a
        recipe that quantizes other modules (its own targets or ignore list,
        e.g. a proposed mixed-precision recipe) adds -m<hash of them>."""
        w, a = self.weights, self.input_activations
        parts = [f"w{w.num_bits}a{a.num_bits if a is not None else 16}"]
        if str(w.type) != "int":
            parts.append(f"fp{w.num_bits}")
        parts.append(f"g{w.group_size}" if str(w.strategy) == "group" else str(w.strategy))
        parts.append("sym" if w.symmetric else "asym")
        modules = modules_of(self.targets, self.ignore)
        if modules != USUAL_MODULES:
            parts.append("m" + sha256_json(modules)[:6])
        return "-".join(parts)

    def as_dict(self) -> dict:
        """The scheme as the sensitivity file records it."""
        acts = self.input_activations
        return {"weights": self.weights.model_dump(mode="json"),
                "input_activations": acts.model_dump(mode="json") if acts is not None else None,
                "targets": list(self.targets), "ignore": list(self.ignore), "applied": APPLIED}


def from_recipe(recipe: recipes.RecipeFile) -> WeightScheme:
    """The one weight scheme of the recipe's config groups (recipe_edit, as
    propose sizes them), over the modules they take: their targets but one
    ignore list. A recipe that quantizes no weights (the baseline, pruning only,
    KV cache only), or more than that says, is a one-line error."""
    if recipe.is_baseline:
        raise UserError(f"recipe {recipe.name} quantizes nothing (the baseline); pass a quantizing recipe, "
                        "e.g. recipe=w4a16_gptq")
    groups = config_groups(recipe.data, recipe.name)
    with_weights = [g for g in groups if g.weights is not None]
    if not with_weights:
        raise UserError(f"recipe {recipe.name} ({recipe.path}) has no weight quantization scheme "
                        "(config_groups with weights, or scheme: <preset>); pass a recipe that quantizes weights")
    distinct = {g.weights.model_dump_json() for g in with_weights}
    if len(distinct) > 1:
        raise UserError(f"recipe {recipe.name} quantizes weights with {len(distinct)} different schemes; "
                        "sensitivity measures one scheme: pass a recipe with a single weight scheme")
    if len(with_weights) < len(groups):
        raise UserError(f"recipe {recipe.name} has a config group that quantizes no weights; sensitivity measures "
                        "recipes whose config groups all quantize weights: pass one")
    if len({g.ignore for g in groups}) > 1:
        raise UserError(f"recipe {recipe.name}'s quantization modifiers have different ignore lists; sensitivity "
                        "measures one set of modules (targets but one ignore list): pass a recipe with one")
    first = with_weights[0]
    if str(first.weights.strategy) not in SUPPORTED_STRATEGIES:
        raise UserError(f"recipe {recipe.name}: weight strategy {first.weights.strategy} is not measured "
                        f"(sensitivity fake-quantizes {', '.join(SUPPORTED_STRATEGIES)}); pass another recipe")
    targets = list(dict.fromkeys(t for g in with_weights for t in g.targets))
    return WeightScheme(first.weights, first.input_activations, targets, list(first.ignore))


def fake_quantize(weight, args):
    """`weight` [out, in] rounded to the scheme's grid and back, in its own
    dtype: min-max scales per tensor, per output channel or per group of
    `group_size` input columns (computed in float32)."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize as ct_fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams
    w = weight.float()
    low, high = _min_max(w, args)
    scale, zero_point = calculate_qparams(low, high, args)
    return ct_fake_quantize(w, scale, zero_point, args).to(weight.dtype)


def _min_max(w, args):
    strategy = str(args.strategy)
    if strategy == "tensor":
        return w.amin(), w.amax()
    if strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    rows, cols = w.shape
    if cols % args.group_size:
        raise UserError(f"group_size {args.group_size} does not divide a weight of {cols} input columns; "
                        "use a recipe whose group size divides the model's widths")
    grouped = w.reshape(rows, cols // args.group_size, args.group_size)
    return grouped.amin(dim=-1), grouped.amax(dim=-1)
