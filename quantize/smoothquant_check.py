"""SmoothQuant's layer mappings checked, not assumed, before calibration.

llm-compressor's SmoothQuantModifier divides an activation (a norm layer's
output) by per-channel scales and multiplies the Linear layers it feeds by
them, named by regex `mappings` [[<balance layers>], <smooth layer>]. A recipe
that gives none gets llm-compressor's mappings for the model's architecture
or, for an architecture it does not know, its Llama-style defaults, logged
only at INFO. Those defaults matched layers of Phi (a parallel block) and
OLMoE (a router the defaults leave out) and the artifacts came out as
garbage (top-1 agreement with the base 0.017 and 0.288, against 0.946 and
0.852 without SmoothQuant). So:
- an architecture llm-compressor has no mappings for, with no `mappings:` in
  the recipe, is refused in one line (decided from config.json alone);
- registered or explicit mappings are resolved on the model built on the
  meta device (no weights read) with llm-compressor's and compressed-tensors'
  own functions: every pattern must match, each group must hold one smooth
  layer, and the smooth layer's output width must equal the input width of
  every Linear it is balanced against.
A mixture-of-experts model is checked in the layout oneshot sees: its fused
experts replaced by llm-compressor's per-expert Linears (the pipeline
linearizes right after loading)."""
import json
import logging
from pathlib import Path

from quantize.common.errors import UserError
from quantize.recipe import RecipeFile

log = logging.getLogger("quantbench.quantize")

SMOOTHQUANT = "SmoothQuantModifier"
MAX_NAMED = 8  # module names a message lists
MAX_LAYER_CONTENTS = 16  # modules of a decoder layer a message lists
MAPPINGS_KEY = "`mappings: [[<balance Linear layers>], <smooth norm layer>]`"


def check(recipe: RecipeFile, model_dir: Path) -> None:
    """UserError if a SmoothQuantModifier of `recipe` would run on mappings
    llm-compressor does not have for this architecture, or on mappings that
    do not fit the model at `model_dir`."""
    if SMOOTHQUANT not in recipe.modifiers:
        return
    modifiers, model, architecture = modifiers_on(recipe, model_dir, SMOOTHQUANT)
    if any(m.mappings is None for m in modifiers) and not is_registered(architecture):
        raise UserError(
            f"recipe {recipe.path.name}: llm-compressor has no SmoothQuant mappings for {architecture} and would "
            "fall back to its Llama-style defaults (q_proj/k_proj/v_proj <- input_layernorm, gate_proj/up_proj "
            "<- post_attention_layernorm), which need not fit this model; copy the recipe, set "
            f"{MAPPINGS_KEY} under its {SMOOTHQUANT}, each norm with every Linear its output feeds "
            f"(a decoder layer holds {_layer_contents(model)}), and pass recipe=<that file> (see docs/quantize.md)")
    for modifier in modifiers:
        check_mappings(recipe.path.name, model, modifier.mappings)


def modifiers_on(recipe: RecipeFile, model_dir: Path, name: str) -> tuple[list, object, str]:
    """The modifiers of class `name` in `recipe`, the model at `model_dir` on
    the meta device, and its architecture (config.json's, else the class's)."""
    from llmcompressor.recipe import Recipe
    modifiers = [m for m in Recipe.create_instance(recipe.text).modifiers if type(m).__name__ == name]
    model = _meta_model(model_dir)
    return modifiers, model, _architecture(model_dir) or type(model).__name__


def is_registered(architecture: str) -> bool:
    """Whether llm-compressor has SmoothQuant mappings of its own for `architecture`."""
    from llmcompressor.modifiers.transform.smoothquant.dynamic_mappings import SMOOTHQUANT_DYNAMIC_MAPPING_REGISTRY
    from llmcompressor.modifiers.transform.smoothquant.utils import MAPPINGS_REGISTRY
    return architecture in MAPPINGS_REGISTRY or architecture in SMOOTHQUANT_DYNAMIC_MAPPING_REGISTRY


def _architecture(model_dir: Path) -> str | None:
    """config.json's `architectures[0]`, the name llm-compressor's registries are keyed by."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return (config.get("architectures") or [None])[0]


def _meta_model(model_dir: Path):
    """The model's module tree as oneshot sees it, without its weights."""
    import torch

    from quantize.common import hf_load, moe
    config = hf_load.config(model_dir)
    with torch.device("meta"):
        model = hf_load.causal_lm_from_config(config)
        if moe.is_moe(config.to_dict()):
            linearize_on_meta(model)
    return model


def linearize_on_meta(model) -> None:
    """Fused experts -> llm-compressor's per-expert Linears, as linearize_moe
    (quantize.common.moe.linearize) builds them, but empty: linearize_moe
    copies each expert's weights out of the fused tensors (a meta tensor has
    none: "Cannot copy out of meta tensor") and re-applies the fused module's
    offloading (compressed-tensors has none for meta), so its module
    replacement is repeated here without either. Call under torch.device("meta")."""
    from llmcompressor.modeling.moe.linear_experts import LinearExperts2D
    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes
    for name, experts in get_non_linearized_moes(model):
        linear_experts = LinearExperts2D.get_linear_experts_cls(type(experts))
        model.set_submodule(name, linear_experts(getattr(experts, "config", model.config)))


def check_mappings(recipe_name: str, model, explicit) -> None:
    """UserError unless every mapping resolves on `model` and its widths fit;
    `explicit` is the recipe's `mappings:` (None: llm-compressor's own)."""
    from torch.utils._pytree import tree_leaves
    mappings, source = _mappings(recipe_name, model, explicit)
    unmatched = [p for m in mappings for p in tree_leaves(m) if not _matches(model, p)]
    if unmatched:
        raise UserError(
            f"recipe {recipe_name}: SmoothQuant {source} name layers {type(model).__name__} lacks "
            f"({', '.join(dict.fromkeys(unmatched))}); set {MAPPINGS_KEY} under the recipe's {SMOOTHQUANT} "
            f"naming this model's layers (a decoder layer holds {_layer_contents(model)}) and pass "
            "recipe=<that file> (see docs/quantize.md)")
    for mapping in mappings:
        _check_groups(recipe_name, model, mapping)


def _mappings(recipe_name: str, model, explicit) -> tuple[list, str]:
    """The mappings oneshot will use, and where they come from (for the message)."""
    from llmcompressor.modifiers.transform.smoothquant.dynamic_mappings import get_layer_mappings_from_model
    if explicit is not None:
        return list(explicit), "mappings in the recipe"
    try:
        mappings = get_layer_mappings_from_model(model)
    except ValueError as e:  # a model-aware builder refusing this config
        raise UserError(f"recipe {recipe_name}: llm-compressor cannot build SmoothQuant mappings for "
                        f"{type(model).__name__}: {e}; set {MAPPINGS_KEY} under the recipe's {SMOOTHQUANT}") from None
    return list(mappings), "mappings llm-compressor has for this architecture"


def _matches(model, pattern: str) -> bool:
    from compressed_tensors.utils import match_named_modules
    return next(iter(match_named_modules(model, [pattern])), None) is not None


def _check_groups(recipe_name: str, model, mapping) -> None:
    """As llm-compressor groups them: per parent module, the balance layers
    and exactly one smooth layer, whose output width each balance layer takes in."""
    from compressed_tensors.utils import match_modules_set
    from torch.utils._pytree import tree_leaves
    names = {module: name for name, module in model.named_modules()}
    patterns = list(tree_leaves(mapping))
    try:
        groups = list(match_modules_set(model, patterns))
    except ValueError as e:  # compressed-tensors: a module matched twice, or a group left incomplete
        raise UserError(f"recipe {recipe_name}: the SmoothQuant mapping {patterns} does not group into "
                        f"decoder layers: {' '.join(str(e).split())[:200]}; fix `mappings:`") from None
    for *balance, smooth_layers in groups:
        if len(smooth_layers) > 1:
            several = ", ".join(names[m] for m in smooth_layers[:MAX_NAMED])
            raise UserError(f"recipe {recipe_name}: the SmoothQuant mapping {patterns} "
                            f"matches several smooth layers in one block ({several}); make its last entry "
                            "match one norm layer per decoder layer")
        _check_widths(recipe_name, names, smooth_layers[0], tree_leaves(balance))


def _check_widths(recipe_name: str, names: dict, smooth, balance: list) -> None:
    """SmoothQuant divides the smooth layer's weight by one scale per output
    channel (dim 0) and multiplies each balance weight by them along its
    input (last dim): the two widths must agree."""
    width = _weight_dim(smooth, 0)
    if width is None:
        raise UserError(f"recipe {recipe_name}: SmoothQuant smooth layer {names[smooth]} "
                        f"({type(smooth).__name__}) has no weight to scale; map a norm layer with a weight")
    for layer in balance:
        taken = _weight_dim(layer, -1)
        if taken != width:
            raise UserError(
                f"recipe {recipe_name}: SmoothQuant balance layer {names[layer]} takes {taken} input features "
                f"but its smooth layer {names[smooth]} puts out {width}; map each norm with the Linear "
                "layers its output feeds")


def _weight_dim(module, dim: int) -> int | None:
    weight = getattr(module, "weight", None)
    return None if weight is None or weight.dim() == 0 else int(weight.shape[dim])


def _layer_contents(model) -> str:
    """The weighted modules of the model's first decoder layer, relative to
    it, experts folded into one `experts.*` entry per projection."""
    import re

    import torch
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module):
            inner = [re.sub(r"\.\d+\.", ".*.", n) for n, m in module[0].named_modules()
                     if n and getattr(m, "weight", None) is not None]
            inner = list(dict.fromkeys(inner))
            more = f" (+{len(inner) - MAX_LAYER_CONTENTS} more)" if len(inner) > MAX_LAYER_CONTENTS else ""
            return ", ".join(inner[:MAX_LAYER_CONTENTS]) + more + f" under {name}.0"
    return "no repeated decoder block found"
