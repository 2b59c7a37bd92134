"""llm-compressor recipes: load, validate against llm-compressor and the model,
and describe (which modifiers, whether it prunes) for the manifest."""
from dataclasses import dataclass
from pathlib import Path

import yaml

from quantize.common.errors import UserError
from quantize.common.recipe_choices import BASELINE, RecipeChoice
from quantize.common.paths import resolve
from quantize.common.provenance import sha256_bytes

PRUNING_MODIFIERS = ("SparseGPTModifier", "WandaPruningModifier", "MagnitudePruningModifier")


@dataclass
class RecipeFile:
    name: str
    path: Path
    text: str
    data: dict

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.text.encode())

    @property
    def is_baseline(self) -> bool:
        return not self.data

    @property
    def modifiers(self) -> list[str]:
        return [name for _, name, _ in _walk_modifiers(self.data)]

    @property
    def prunes(self) -> bool:
        return any(m in PRUNING_MODIFIERS for m in self.modifiers)

    def group_sizes(self) -> set[int]:
        return {int(v) for v in _find_key(self.data, "group_size") if v is not None}


def load(choice: RecipeChoice) -> RecipeFile:
    """The recipe file of a `recipe=` choice, read and parsed; bad YAML is a one-line error."""
    path = resolve(choice.path)
    if not path.is_file():
        raise UserError(f"recipe file {path} does not exist; pass recipe=<name> or recipe=<path to yaml>")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"recipe {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                        "save it as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"recipe {path} is not valid YAML ({str(e).splitlines()[0]}); fix the file") from None
    if data is None or data == {}:
        data = {}
    elif not isinstance(data, dict):
        raise UserError(f"recipe {path} must be a YAML mapping of stages/modifiers")
    if not data and choice.name != BASELINE:  # the "matched no module" guard never runs on it
        raise UserError(f"recipe {path} holds no modifiers: saved as {choice.name!r} it would be an unquantized copy "
                        f"passing for a quantized recipe; add its modifiers, or pass recipe={BASELINE} for the baseline")
    if data and choice.name == BASELINE:
        raise UserError(f"recipe {path} changes the model, but its name {BASELINE!r} is the unquantized baseline's, "
                        "which the report compares every recipe with; rename the file or pass recipe.name=<another name>")
    return RecipeFile(name=choice.name, path=path, text=text, data=data)


def check_with_llmcompressor(recipe: RecipeFile) -> bool:
    """Parse with llm-compressor itself, so typos in modifier names or
    arguments fail before the model is loaded (importing it takes ~5 s).
    Returns whether the recipe needs calibration data: whether a modifier
    says so (`requires_calibration_data`, the flag by which oneshot runs a
    modifier without data). Dynamic activations and weight-only
    round-to-nearest need none; SmoothQuant, GPTQ, AWQ, SparseGPT, static
    activation or KV-cache scales do."""
    from llmcompressor.recipe import Recipe
    try:
        parsed = Recipe.create_instance(recipe.text)   # the text read once: the one hashed, recorded and applied
    except Exception as e:  # pydantic / registry errors: all mean "recipe rejected"
        first = " ".join(str(e).split())[:300]
        raise UserError(f"llm-compressor rejected recipe {recipe.path}: {first}") from None
    return any(m.requires_calibration_data for m in parsed.modifiers)


def check_group_sizes(recipe: RecipeFile, model) -> None:
    """Every quantized Linear's input width must be a multiple of each group size."""
    import torch
    sizes = recipe.group_sizes()
    if not sizes:
        return
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.split(".")[-1] == "lm_head":
            continue
        for g in sorted(sizes):
            if module.in_features % g:
                divisors = [d for d in (32, 64, 128) if module.in_features % d == 0] or ["channel-wise"]
                raise UserError(
                    f"group_size {g} does not divide in_features {module.in_features} of {name}; "
                    f"use group_size {divisors[-1]} or strategy: channel in {recipe.path.name}")


def _walk_modifiers(node, depth=0):
    """Yield (stage, modifier name, args) from a recipe's nested stage/group layout."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if isinstance(key, str) and key.endswith("Modifier"):
            yield depth, key, value
        elif isinstance(value, dict):
            yield from _walk_modifiers(value, depth + 1)


def _find_key(node, key):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            else:
                yield from _find_key(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _find_key(v, key)
