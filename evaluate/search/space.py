"""The recipe search space: what a trial's values (`trial.*`) mean as an
llm-compressor recipe.

    # conf/search/default.yaml
    _target_: evaluate.search.space.RecipeSpace
    name: default
    objectives: [{name: recovery_pct, direction: maximize, unit: "%"}, ...]
    params:                       # the Optuna sweeper's override syntax, over the job's trial.* keys
      trial.scheme: choice(w4a16, w8a16, w8a8)
      trial.group_size: choice(32, 64, 128)
      ...

Every trial is GPTQ (so `dampening` always applies), optionally after
SmoothQuant and inside a SparseGPT 2:4 stage. Values that cannot apply are
normalised, so two trials that mean the same recipe share one name and one
artifact (NORMALISATION below); the recipe's name is the hash of its text.
"""
import dataclasses
import hashlib
from dataclasses import dataclass, field

import yaml

from quantize.common.errors import UserError
from quantize.common.extensions import Configurable
from quantize.common.recipe_edit import dense_ignore
from quantize.common.settings import is_integer, is_number, shown

NAME_PREFIX = "search-"
GROUP_SIZES = (128, 64, 32)   # a group size that does not divide the model falls to the next that does

# scheme family -> (weight bits, weights symmetric, quantized activations, group-quantized weights)
SCHEMES = {
    "w4a16": dict(weight_bits=4, symmetric=False, activations=False, grouped=True),
    "w8a16": dict(weight_bits=8, symmetric=True, activations=False, grouped=True),
    "w8a8": dict(weight_bits=8, symmetric=True, activations=True, grouped=False),
}

NORMALISATION = """\
- group_size applies to group-quantized schemes (w4a16, w8a16) only: w8a8 is per-channel, its group_size becomes none;
- a group_size that does not divide every Linear input width of the model becomes the largest of 128, 64, 32 below it
  that does (SmolLM2: 128 -> 64), or per-channel when none does;
- smoothquant (SmoothQuant strength, 0 = off) applies to activation-quantized schemes (w8a8) only: weight-only
  schemes get 0;
- keep_dense k: the k most sensitive module groups of the sensitivity file stay unquantized (and unpruned).
"""


@dataclass(frozen=True)
class TrialValues:
    """One point of the space: the job's `trial.*` keys."""
    scheme: str = "w4a16"
    group_size: int | None = 64
    smoothquant: float = 0.0        # SmoothQuant strength; 0 = no SmoothQuant
    dampening: float = 0.01         # GPTQ dampening_frac
    keep_dense: int = 0             # k most sensitive module groups left unquantized
    sparse_2_4: bool = False        # SparseGPT 2:4 before quantization

    @classmethod
    def from_values(cls, values: dict) -> "TrialValues":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise UserError(f"trial.{unknown[0]} is not a search value; the space sets {', '.join(sorted(names))}")
        typed = dict(values)
        if "group_size" in typed:
            size = typed["group_size"]
            typed["group_size"] = None if size in (None, "none", "null", "channel") else _read("group_size", size, int)
        for key in ("smoothquant", "dampening"):
            if key in typed:
                typed[key] = _read(key, typed[key], float)
        if "keep_dense" in typed:
            typed["keep_dense"] = _read("keep_dense", typed["keep_dense"], int)
        if "sparse_2_4" in typed:
            typed["sparse_2_4"] = _read("sparse_2_4", typed["sparse_2_4"], _boolean)
        return cls(**typed).in_range()

    def in_range(self) -> "TrialValues":
        """These values, if each is in its range: a value fixed on the command line
        (trial.dampening=-1) is refused before the sweep, a drawn one fails its trial."""
        if (self.keep_dense < 0 or self.dampening <= 0 or not 0 <= self.smoothquant < 1
                or (self.group_size is not None and self.group_size < 1)):
            raise UserError(f"trial values out of range ({self.describe()}): keep_dense >= 0, dampening > 0, "
                            "0 <= smoothquant < 1, group_size >= 1 (or none: per channel)")
        return self

    def describe(self) -> str:
        return " ".join(f"{k}={'none' if v is None else v}" for k, v in dataclasses.asdict(self).items())


def _read(key: str, value, kind):
    """A trial value as `kind` (int, float or _boolean). Hydra and Optuna give
    numbers, a space's YAML may give their text; int(2.5) is 2, int(True) 1 and
    float("nan") no value, so those are refused."""
    text = isinstance(value, str)
    try:
        if kind is int and (is_integer(value) or (text and value.strip().lstrip("-").isdigit())):
            return int(value)
        if kind is float and (is_number(value) or (text and is_number(float(value)))):
            return float(value)
        if kind is _boolean:
            return _boolean(value)
    except ValueError:
        pass
    wanted = {int: "an integer", float: "a number"}.get(kind, "true or false")
    raise UserError(f"trial.{key}={shown(value)} is not {wanted}; fix it on the command line or in the search space's params")


def _boolean(value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("true", "1", "on", "yes"):
        return True
    if text in ("false", "0", "off", "no"):
        return False
    raise ValueError(f"sparse_2_4={value!r} is not true/false")


@dataclass(frozen=True)
class KeptDense:
    """The modules a recipe leaves unquantized, and where their order came from."""
    modules: list[str]
    source: str          # the sensitivity file, relative to the results store


@dataclass
class RecipeSpace(Configurable):
    """The search space YAML (conf/search/<name>.yaml): its objectives and the
    Optuna sweeper's params; turns a trial's values into a recipe."""
    name: str
    objectives: list[dict]
    params: dict[str, str] = field(default_factory=dict)
    description: str = ""

    def normalise(self, values: TrialValues, widths: set[int] = frozenset()) -> TrialValues:
        """The values the recipe is built from (NORMALISATION); `widths`: the
        model's Linear input widths, empty when unknown."""
        family = SCHEMES.get(values.scheme)
        if family is None:
            raise UserError(f"unknown scheme family {values.scheme!r} in the search space; "
                            f"choose from {', '.join(SCHEMES)}")
        values.in_range()
        group = values.group_size if family["grouped"] else None
        if group is not None:
            group = _dividing_group_size(group, widths)
        strength = values.smoothquant if family["activations"] else 0.0
        return dataclasses.replace(values, group_size=group, smoothquant=strength)

    def recipe(self, values: TrialValues, kept: KeptDense | None = None,
               widths: set[int] = frozenset()) -> tuple[str, str]:
        """(name, YAML text) of the recipe of `values`: the name is `search-`
        and 8 hex digits of the text's hash, so equal recipes share a name and
        an artifact. The text holds no study name for the same reason."""
        values = self.normalise(values, widths)
        modules = list(kept.modules) if kept and values.keep_dense else []
        header = [f"# Recipe search point: {values.describe()}"]
        if modules:
            header.append(f"# Kept dense: the {values.keep_dense} most sensitive module groups of {kept.source}")
        body = yaml.safe_dump(_stages(values, modules), sort_keys=False, default_flow_style=None, width=120)
        text = "\n".join(header) + "\n" + body
        return NAME_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:8], text


def _dividing_group_size(group: int, widths: set[int]) -> int | None:
    for size in [group] + [g for g in GROUP_SIZES if g < group]:
        if all(w % size == 0 for w in widths):
            return size
    return None   # per-channel


def _weights(values: TrialValues) -> dict:
    family = SCHEMES[values.scheme]
    weights = {"num_bits": family["weight_bits"], "type": "int", "symmetric": family["symmetric"]}
    if values.group_size:
        return weights | {"strategy": "group", "group_size": values.group_size}
    return weights | {"strategy": "channel"}


def _quant_modifiers(values: TrialValues, kept: list[str]) -> dict:
    group = {"targets": ["Linear"], "weights": _weights(values)}
    if SCHEMES[values.scheme]["activations"]:
        group["input_activations"] = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                      "dynamic": True}
    modifiers = {}
    if values.smoothquant:
        modifiers["SmoothQuantModifier"] = {"smoothing_strength": values.smoothquant}
    modifiers["GPTQModifier"] = {"ignore": ["lm_head", *dense_ignore(kept, prunes=False)],
                                 "dampening_frac": values.dampening,
                                 "config_groups": {"group_0": group}}
    return modifiers


def _pruning(modifier: str, kept: list[str]) -> dict:
    ignore = ["re:.*lm_head"] + dense_ignore(kept, prunes=True)
    return {modifier: {"sparsity": 0.5, "mask_structure": "2:4", "targets": ["Linear"], "ignore": ignore}}


def _stages(values: TrialValues, kept: list[str]) -> dict:
    """llm-compressor's stage layout, as recipes/w8a8_sparse_smooth_gptq.yaml:
    with 2:4, SparseGPT first, and a final Wanda 2:4 pass that puts the
    pattern back where GPTQ's error feedback filled pruned slots."""
    stages = {}
    if values.sparse_2_4:
        stages["sparsity_stage"] = {"sparsity_modifiers": _pruning("SparseGPTModifier", kept)}
    stages["quant_stage"] = {"quant_modifiers": _quant_modifiers(values, kept)}
    if values.sparse_2_4:
        stages["mask_stage"] = {"mask_modifiers": _pruning("WandaPruningModifier", kept)}
    return stages
