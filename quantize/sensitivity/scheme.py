"""The weight scheme a recipe applies, and round-to-nearest fake quantization
of one weight on that scheme's grid (compressed-tensors' own qparams and
fake_quantize: the grid llm-compressor saves).

Weights only: a scheme's activation quantization (W8A8, FP8_DYNAMIC) is
recorded but not applied, so a cell's KL is the error of its weights alone."""
from dataclasses import dataclass

from quantize import recipe as recipes
from quantize.common.errors import UserError
from quantize.common.provenance import sha256_json
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
    """The one weight scheme of the recipe's quantization modifier; a recipe
    without one (the baseline, pruning only, KV cache only) is a one-line error."""
    if recipe.is_baseline:
        raise UserError(f"recipe {recipe.name} quantizes nothing (the baseline); pass a quantizing recipe, "
                        "e.g. recipe=w4a16_gptq")
    found = [(name, args) for name, args in _quantization_modifiers(recipe.data)]
    schemes = [scheme for name, args in found for scheme in _schemes(name, args, recipe)]
    with_weights = [s for s in schemes if s.weights is not None]
    if not with_weights:
        raise UserError(f"recipe {recipe.name} ({recipe.path}) has no weight quantization scheme "
                        "(config_groups with weights, or scheme: <preset>); pass a recipe that quantizes weights")
    if len({s.weights.model_dump_json() for s in with_weights}) > 1:
        raise UserError(f"recipe {recipe.name} quantizes weights with {len(with_weights)} different schemes; "
                        "sensitivity measures one scheme: pass a recipe with a single weight scheme")
    scheme = with_weights[0]
    if str(scheme.weights.strategy) not in SUPPORTED_STRATEGIES:
        raise UserError(f"recipe {recipe.name}: weight strategy {scheme.weights.strategy} is not measured "
                        f"(sensitivity fake-quantizes {', '.join(SUPPORTED_STRATEGIES)}); pass another recipe")
    return scheme


def _quantization_modifiers(data: dict):
    """(name, args) of each modifier that declares a quantization scheme."""
    for _, name, args in recipes._walk_modifiers(data):
        if isinstance(args, dict) and ("config_groups" in args or "scheme" in args):
            yield name, args


def _schemes(name: str, args: dict, recipe: recipes.RecipeFile) -> list[WeightScheme]:
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
    ignore = list(args.get("ignore") or [])
    targets = args.get("targets") or ["Linear"]
    targets = [targets] if isinstance(targets, str) else list(targets)
    try:
        if "config_groups" in args:
            built = [QuantizationScheme(**group) for group in (args["config_groups"] or {}).values()]
        elif isinstance(args["scheme"], str):
            built = [preset_name_to_scheme(args["scheme"], targets)]
        else:  # {PRESET: [targets]}
            built = [preset_name_to_scheme(preset, list(t)) for preset, t in args["scheme"].items()]
    except (KeyError, TypeError, ValueError) as e:
        first = " ".join(str(e).split())[:200]
        raise UserError(f"recipe {recipe.name}: {name}'s scheme is not one compressed-tensors knows ({first}); "
                        "fix the recipe") from None
    return [WeightScheme(s.weights, s.input_activations, list(s.targets), ignore) for s in built]


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
