"""Edits of an llm-compressor recipe that keep it a normal recipe: keeping
modules dense (out of every quantization and pruning modifier); and what a
recipe quantizes, with which weight scheme (config_groups, group_of): the one
answer for the size estimates and for which sensitivity file fits a recipe.

llm-compressor (compressed-tensors' `match_name`) takes an `ignore` entry as an
exact module name or a `re:` pattern; a decoder layer's module is matched by its
full name, e.g. `model.layers.3.mlp.down_proj`, by quantization modifiers; the
pruning modifiers name it with a trailing dot, so they get a pattern (dense_ignore)."""
import re
from dataclasses import dataclass

import yaml

from quantize.common.errors import UserError

# vLLM serves these Linears of one decoder layer as one fused matrix (its
# models' packed_modules_mapping: qkv_proj, gate_up_proj, and DeepSeek-V2/V3's
# fused_qkv_a_proj of MLA when q_lora_rank is set), which must have a single
# scheme: a module kept dense takes its fused siblings along.
FUSED_SHARDS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa"))
# vLLM runs the routed experts of a MoE block as one FusedMoE layer with the
# scheme of expert 0's gate/up/down (all three must agree): an expert's Linear
# kept dense takes every expert Linear of its block along.
EXPERT_LINEAR = re.compile(r"^(?P<block>(?:.*\.)?experts)\.\d+\.[^.]+$")

# A modifier quantizes when its arguments give a scheme, prunes when they give a
# sparsity; smoothing modifiers (SmoothQuant, AWQ without a scheme) only rescale
# and leave a module's values equivalent, so they keep their own lists.
QUANTIZING_ARGS = ("config_groups", "scheme")
PRUNING_ARGS = ("sparsity", "init_sparsity", "final_sparsity")


def with_kept_dense(recipe_text: str, modules: list[str]) -> str:
    """The recipe with `modules` added to the `ignore` list of every quantization
    and pruning modifier (entries already there are kept, none is repeated).
    Comments are not kept: the caller writes its own header."""
    data = yaml.safe_load(recipe_text) or {}
    edited = dense_keeping_modifiers(data)
    if not edited:
        raise UserError("the recipe has no quantization or pruning modifier, so there is nothing to keep dense; "
                        "start from a recipe that quantizes (e.g. recipe=w4a16_gptq)")
    for args in edited.values():
        ignore = args.get("ignore") or []
        ignore = [ignore] if isinstance(ignore, str) else list(ignore)
        entries = dense_ignore(modules, prunes=not any(k in args for k in QUANTIZING_ARGS))
        args["ignore"] = ignore + [m for m in entries if m not in ignore]
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def dense_ignore(modules: list[str], prunes: bool) -> list[str]:
    """The `ignore` entries that keep `modules` out of one modifier: their
    names for a quantization modifier; for a pruning modifier, patterns, since
    pruning names a module with a trailing dot (`model.layers.3.mlp.down_proj.`)
    and a plain name would leave it pruned."""
    modules = list(dict.fromkeys(modules))
    return [f"re:{re.escape(m)}\\.?$" for m in modules] if prunes else modules


def fused_siblings(name: str) -> list[str]:
    """The other shards of the fused matrix `name` (a module name, full or
    within its layer) belongs to, named alike; none for an unfused module."""
    parent, _, leaf = name.rpartition(".")
    shards = next((s for s in FUSED_SHARDS if leaf in s), ())
    return [f"{parent}.{other}" if parent else other for other in shards if other != leaf]


def expert_siblings(name: str, names: list[str]) -> list[str]:
    """The other routed-expert Linears among `names` of the MoE block `name`
    belongs to (names alike: full or within their layer); none outside one."""
    block = EXPERT_LINEAR.match(name)
    if not block:
        return []
    return [other for other in names if other != name and (found := EXPERT_LINEAR.match(other))
            and found["block"] == block["block"]]


def dense_keeping_modifiers(data: dict) -> dict[str, dict]:
    """{path of the modifier: its (mutable) arguments} for each modifier that
    quantizes or prunes; a modifier written with no arguments gets a dict."""
    found = {}
    for path, parent, name in _modifiers(data):
        args = parent[name]
        if not isinstance(args, dict):
            continue
        if any(k in args for k in QUANTIZING_ARGS + PRUNING_ARGS):
            found[path] = args
    return found


def _modifiers(node, path: str = ""):
    """(dotted path, the mapping holding it, modifier name) of each modifier in a
    recipe's stage/group nesting."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        here = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and key.endswith("Modifier"):
            yield here, node, key
        elif isinstance(value, dict):
            yield from _modifiers(value, here)


@dataclass(frozen=True)
class WeightScheme:
    """How a recipe stores a quantized Linear's weights."""
    num_bits: int
    strategy: str                  # tensor, channel, group, block
    group_size: int | None = None
    block_structure: tuple[int, int] | None = None
    symmetric: bool = True
    type: str = "int"
    activation_bits: int = 16      # 16: activations are not quantized

    @property
    def key(self) -> str:
        """Short label as the sensitivity folders are named, e.g. w4a16-g64-asym, w8a8-fp8-channel-sym."""
        parts = [f"w{self.num_bits}a{self.activation_bits}"] + ([f"fp{self.num_bits}"] if self.type != "int" else [])
        parts.append(f"g{self.group_size}" if self.strategy == "group" else self.strategy)
        return "-".join(parts + ["sym" if self.symmetric else "asym"])

    def bytes_per_matrix(self, rows: int, cols: int, scale_bytes: int) -> float:
        """Bytes a (rows x cols) weight takes quantized: packed values, one
        scale (the model's dtype) per group and, asymmetric, one zero point of
        num_bits per group."""
        groups = {"tensor": 1, "channel": rows, "group": rows * -(-cols // (self.group_size or cols))}
        if self.strategy == "block" and self.block_structure:
            br, bc = self.block_structure
            groups["block"] = -(-rows // br) * -(-cols // bc)
        n = groups.get(self.strategy, rows)
        per_group = scale_bytes + (0 if self.symmetric else self.num_bits / 8)
        return rows * cols * self.num_bits / 8 + n * per_group


@dataclass(frozen=True)
class ConfigGroup:
    """One config group of a quantization modifier: the modules it takes (its
    targets, but its modifier's ignore list) and how (compressed-tensors
    QuantizationArgs as the recipe gives them; weights None: it leaves them)."""
    modifier: str                  # the modifier's dotted path in the recipe
    weights: object
    input_activations: object      # None: 16-bit activations
    targets: tuple[str, ...]
    ignore: tuple[str, ...]

    @property
    def scheme(self) -> WeightScheme | None:
        """How the group stores its weights; None where it leaves them."""
        if self.weights is None:
            return None
        w = self.weights.model_dump(mode="json")
        acts = self.input_activations.model_dump(mode="json") if self.input_activations is not None else {}
        block = w.get("block_structure")
        return WeightScheme(num_bits=int(w["num_bits"]), strategy=str(w.get("strategy") or "tensor"),
                            group_size=w.get("group_size"), block_structure=tuple(block) if block else None,
                            symmetric=bool(w.get("symmetric", True)), type=str(w.get("type") or "int"),
                            activation_bits=int(acts.get("num_bits") or 16))


def config_groups(data: dict, recipe: str) -> list[ConfigGroup]:
    """Every config group of the recipe's quantization modifiers, in recipe
    order, as llm-compressor resolves a modifier's arguments (its config_groups,
    or a preset `scheme` over its targets); one compressed-tensors does not know
    is a one-line error naming `recipe`."""
    found = []
    for path, parent, name in _modifiers(data):
        args = parent[name]
        if not (isinstance(args, dict) and any(k in args for k in QUANTIZING_ARGS)):
            continue
        try:
            built = _schemes(args)
        except (KeyError, TypeError, ValueError) as e:
            first = " ".join(str(e).split())[:200]
            raise UserError(f"recipe {recipe}: {name}'s scheme is not one compressed-tensors knows ({first}); "
                            "fix the recipe") from None
        ignore = tuple(_as_list(args.get("ignore")))
        found += [ConfigGroup(path, s.weights, s.input_activations, tuple(s.targets), ignore) for s in built]
    return found


def _schemes(args: dict) -> list:
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
    if args.get("config_groups") is not None:
        return [QuantizationScheme(**group) for group in args["config_groups"].values()]
    scheme = args.get("scheme")
    targets = _as_list(args.get("targets") or ["Linear"])
    if scheme is None:   # e.g. a KV-cache-only modifier: llm-compressor's one group, quantizing no weights
        return [QuantizationScheme(targets=targets)]
    if isinstance(scheme, str):
        return [preset_name_to_scheme(scheme, targets)]
    if not isinstance(scheme, dict):
        raise TypeError(f"scheme: {scheme!r} is neither a preset name nor {{PRESET: targets}}")
    return [preset_name_to_scheme(preset, _as_list(t)) for preset, t in scheme.items()]  # {PRESET: targets}


def _as_list(entries) -> list:
    return [entries] if isinstance(entries, str) else list(entries or [])


def weight_scheme(groups: list[ConfigGroup]) -> WeightScheme | None:
    """The scheme of the first group that quantizes weights (the one a
    sensitivity file of the recipe is measured with); None when none does."""
    return next((g.scheme for g in groups if g.weights is not None), None)


def group_of(module: str, groups: list[ConfigGroup]) -> ConfigGroup | None:
    """The group that takes the Linear named `module` (its full name), as
    compressed-tensors picks one: in a modifier whose ignore list misses it, the
    group of its most specific target (an exact name, then a pattern in sorted
    order, then the class Linear; of two groups with one target, the later);
    a later modifier's over an earlier one's, which it is applied over. None
    when no group takes it."""
    if not groups:
        return None
    from compressed_tensors.utils.match import match_name

    def matches(entry: str) -> bool:
        return entry == "Linear" or match_name(module, entry)

    taken = None
    for modifier in dict.fromkeys(g.modifier for g in groups):
        own = [g for g in groups if g.modifier == modifier]
        if any(matches(entry) for entry in own[0].ignore):
            continue
        by_target = {target: g for g in own for target in g.targets}
        named = sorted((t for t in by_target if t != "Linear" and matches(t)), key=lambda t: ("re:" in t, t))
        hits = named + [t for t in by_target if t == "Linear"]
        taken = by_target[hits[0]] if hits else taken
    return taken
