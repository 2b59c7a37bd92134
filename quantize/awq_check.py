"""AWQ's layer mappings checked, not assumed, before calibration.

llm-compressor's AWQModifier, like SmoothQuant, divides a layer's output by
per-channel scales and multiplies the Linear layers it feeds by them, named
by `mappings` of {smooth_layer, balance_layers}. A recipe that gives none gets
llm-compressor's mappings for the model's architecture or, for one it does not
know, its Llama-style defaults, logged only at INFO. On a mixture-of-experts
model (Mixtral, OLMoE, GraniteMoE) those divide the norm by the scales and
leave the router, which reads the same output, uncompensated: a wrong
checkpoint with exit 0. On Phi, Olmo2, GPT-NeoX or Falcon they failed only
after loading and calibrating ("Found a final incomplete set"). So, as
smoothquant_check does for SmoothQuant:
- an architecture llm-compressor has no AWQ mappings for, with no
  `mappings:` in the recipe, is refused in one line (from config.json);
- registered or explicit mappings are resolved on the meta model: each must
  group into decoder layers with one smooth layer each, a norm smooth layer's
  width must be the input width of the Linears it is balanced against, and
  every pattern of explicit mappings must match. Linear smooth layers
  (v_proj -> o_proj) are left to AWQ, which skips the pairs that do not fit."""
from pathlib import Path

from quantize.common.errors import UserError
from quantize.recipe import RecipeFile
from quantize.smoothquant_check import MAX_NAMED, _layer_contents, _matches, _weight_dim, modifiers_on

AWQ = "AWQModifier"
MAPPINGS_KEY = "`mappings: [{smooth_layer: <norm layer>, balance_layers: [<Linear layers its output feeds>]}]`"


def check(recipe: RecipeFile, model_dir: Path) -> None:
    """UserError if an AWQModifier of `recipe` would run on mappings
    llm-compressor does not have for this architecture, or on mappings that
    do not fit the model at `model_dir`."""
    if AWQ not in recipe.modifiers:
        return
    modifiers, model, architecture = modifiers_on(recipe, model_dir, AWQ)
    if any(m.mappings is None for m in modifiers) and not is_registered(architecture):
        raise UserError(
            f"recipe {recipe.path.name}: llm-compressor has no AWQ mappings for {architecture} and would fall "
            "back to its Llama-style defaults (input_layernorm -> q_proj/k_proj/v_proj, post_attention_layernorm "
            "-> gate_proj/up_proj, ...), which need not fit this model (a router reading a scaled norm is left "
            f"uncompensated); copy the recipe, set {MAPPINGS_KEY} under its {AWQ}, each norm with every Linear its "
            f"output feeds (a decoder layer holds {_layer_contents(model)}), and pass recipe=<that file> "
            "(see docs/quantize.md)")
    for modifier in modifiers:
        check_mappings(recipe.path.name, model, modifier.mappings)


def is_registered(architecture: str) -> bool:
    """Whether llm-compressor has AWQ mappings of its own for `architecture`."""
    from llmcompressor.modifiers.transform.awq.dynamic_mappings import AWQ_DYNAMIC_MAPPING_REGISTRY
    from llmcompressor.modifiers.transform.awq.mappings import AWQ_MAPPING_REGISTRY
    return architecture in AWQ_MAPPING_REGISTRY or architecture in AWQ_DYNAMIC_MAPPING_REGISTRY


def check_mappings(recipe_name: str, model, explicit) -> None:
    """UserError unless the mappings group on `model` and their widths fit;
    `explicit` is the recipe's `mappings:` (None: llm-compressor's own, some
    of whose patterns name layers other models of the family have)."""
    from llmcompressor.modifiers.transform.awq.dynamic_mappings import get_layer_mappings_from_model
    mappings = list(explicit) if explicit is not None else get_layer_mappings_from_model(model)
    for mapping in mappings:
        patterns = [mapping.smooth_layer, *mapping.balance_layers]
        unmatched = [p for p in patterns if explicit is not None and not _matches(model, p)]
        if unmatched:
            raise UserError(
                f"recipe {recipe_name}: AWQ mappings in the recipe name layers {type(model).__name__} lacks "
                f"({', '.join(unmatched)}); set {MAPPINGS_KEY} under the recipe's {AWQ} naming this model's "
                f"layers (a decoder layer holds {_layer_contents(model)}) and pass recipe=<that file>")
        _check_groups(recipe_name, model, patterns)


def _check_groups(recipe_name: str, model, patterns: list[str]) -> None:
    """As AWQ groups them: per parent module one smooth layer and its balance layers."""
    import torch
    from compressed_tensors.utils import match_modules_set
    from torch.utils._pytree import tree_leaves
    names = {module: name for name, module in model.named_modules()}
    try:
        groups = list(match_modules_set(model, patterns))
    except ValueError as e:  # compressed-tensors: a module matched twice, or a group left incomplete
        raise UserError(f"recipe {recipe_name}: the AWQ mapping {patterns} does not group into decoder layers: "
                        f"{' '.join(str(e).split())[:200]}; set {MAPPINGS_KEY} under the recipe's {AWQ}") from None
    for smooth_layers, *balance in groups:
        if len(smooth_layers) > 1:
            several = ", ".join(names[m] for m in smooth_layers[:MAX_NAMED])
            raise UserError(f"recipe {recipe_name}: the AWQ mapping {patterns} matches several smooth layers in "
                            f"one block ({several}); set {MAPPINGS_KEY} under the recipe's {AWQ}, each "
                            "smooth_layer matching one layer per decoder layer")
        smooth = smooth_layers[0]
        width = None if isinstance(smooth, torch.nn.Linear) else _weight_dim(smooth, 0)
        for layer in tree_leaves(balance) if width is not None else ():
            if _weight_dim(layer, -1) != width:
                raise UserError(
                    f"recipe {recipe_name}: AWQ balance layer {names[layer]} takes {_weight_dim(layer, -1)} input "
                    f"features but its smooth layer {names[smooth]} puts out {width}; map each norm with the "
                    "Linear layers its output feeds")
