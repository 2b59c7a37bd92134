"""SmoothQuant's layer mappings checked against the model before calibration.

llm-compressor's SmoothQuantModifier smooths an activation (a norm layer) into
the Linear layers it feeds, named by regex `mappings`. A recipe that gives none
gets llm-compressor's mappings for the model's architecture, or its default
(Llama-style q_proj/k_proj/v_proj, gate_proj/up_proj) for an architecture it
does not know, such as GPT-NeoX (fused query_key_value). Mappings that name
layers the model lacks fail inside oneshot, after the model is loaded and the
calibration set tokenized. Here the model is built on the meta device (no
weights read) and the same mappings are resolved with llm-compressor's and
compressed-tensors' own functions, so such a recipe is one line naming the fix.
A mixture-of-experts model is left to oneshot: the pipeline linearizes its
experts first, which needs real tensors, so the meta model's names would differ."""
import logging
from pathlib import Path

from quantize.common.errors import UserError
from quantize.recipe import RecipeFile

log = logging.getLogger("quantbench.quantize")

SMOOTHQUANT = "SmoothQuantModifier"
MAX_NAMED = 8  # module names a message lists


def check(recipe: RecipeFile, model_dir: Path, trust_remote_code: bool) -> None:
    """UserError if a SmoothQuantModifier of `recipe` has a mapping that
    matches no module of the model at `model_dir`, or matches several smooth
    layers in one group (llm-compressor resolves exactly one)."""
    if SMOOTHQUANT not in recipe.modifiers:
        return
    from llmcompressor.recipe import Recipe
    model = _meta_model(model_dir, trust_remote_code)
    if model is None:
        log.info("SmoothQuant mappings of a mixture-of-experts model are resolved by oneshot itself")
        return
    for modifier in Recipe.create_instance(str(recipe.path)).modifiers:
        if type(modifier).__name__ == SMOOTHQUANT:
            _check_mappings(recipe, model, modifier.mappings)


def _meta_model(model_dir: Path, trust_remote_code: bool):
    """The model's module tree as oneshot sees it, without its weights; None for an MoE model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from quantize.common import moe
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if moe.is_moe(config.to_dict()):
        return None
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def _check_mappings(recipe: RecipeFile, model, explicit) -> None:
    from torch.utils._pytree import tree_leaves
    mappings, source = _mappings(recipe, model, explicit)
    unmatched = [p for m in mappings for p in tree_leaves(m) if not _matches(model, p)]
    if unmatched:
        raise UserError(
            f"recipe {recipe.path.name}: SmoothQuant {source} name layers {type(model).__name__} lacks "
            f"({', '.join(dict.fromkeys(unmatched))}); copy the recipe, give its {SMOOTHQUANT} explicit "
            "`mappings:` [[<balance Linear layers>], <smooth norm layer>] naming this model's layers "
            f"(a decoder layer holds {_layer_contents(model)}) and pass recipe=<that file> (see docs/quantize.md)")
    for mapping in mappings:
        _check_one_smooth_layer(recipe, model, mapping)


def _mappings(recipe: RecipeFile, model, explicit) -> tuple[list, str]:
    """The mappings oneshot will use, and where they come from (for the message)."""
    from llmcompressor.modifiers.transform.smoothquant.dynamic_mappings import (
        SMOOTHQUANT_DYNAMIC_MAPPING_REGISTRY, get_layer_mappings_from_model)
    from llmcompressor.modifiers.transform.smoothquant.utils import MAPPINGS_REGISTRY
    if explicit is not None:
        return list(explicit), "mappings in the recipe"
    architecture = type(model).__name__
    try:
        mappings = get_layer_mappings_from_model(model)
    except ValueError as e:  # a model-aware builder refusing this config
        raise UserError(f"recipe {recipe.path.name}: llm-compressor cannot build SmoothQuant mappings for "
                        f"{architecture}: {e}; give the {SMOOTHQUANT} explicit `mappings:`") from None
    known = architecture in MAPPINGS_REGISTRY or architecture in SMOOTHQUANT_DYNAMIC_MAPPING_REGISTRY
    source = ("mappings llm-compressor has for this architecture" if known else
              f"mappings: llm-compressor has none for {architecture}, and its defaults")
    return list(mappings), source


def _matches(model, pattern: str) -> bool:
    from compressed_tensors.utils import match_named_modules
    return next(iter(match_named_modules(model, [pattern])), None) is not None


def _check_one_smooth_layer(recipe: RecipeFile, model, mapping) -> None:
    """As llm-compressor groups them: per parent module, the balance layers and exactly one smooth layer."""
    from compressed_tensors.utils import match_modules_set
    from torch.utils._pytree import tree_leaves
    names = {module: name for name, module in model.named_modules()}
    patterns = list(tree_leaves(mapping))
    try:
        groups = list(match_modules_set(model, patterns))
    except ValueError as e:  # compressed-tensors: a module matched twice, or a group left incomplete
        raise UserError(f"recipe {recipe.path.name}: the SmoothQuant mapping {patterns} does not group into "
                        f"decoder layers: {' '.join(str(e).split())[:200]}; fix `mappings:`") from None
    for *_, smooth_layers in groups:
        if len(smooth_layers) > 1:
            several = ", ".join(names[m] for m in smooth_layers[:MAX_NAMED])
            raise UserError(f"recipe {recipe.path.name}: the SmoothQuant mapping {patterns} "
                            f"matches several smooth layers in one block ({several}); make its last entry "
                            "match one norm layer per decoder layer")


def _layer_contents(model) -> str:
    """The weighted modules of the model's first decoder layer, relative to it."""
    import torch
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module):
            first = module[0]
            inner = [n for n, m in first.named_modules() if n and getattr(m, "weight", None) is not None]
            more = f" (+{len(inner) - MAX_NAMED} more)" if len(inner) > MAX_NAMED else ""
            return ", ".join(inner[:MAX_NAMED]) + more + f" under {name}.0"
    return "no repeated decoder block found"
