"""What a checkpoint directory holds, read without loading a model: its
safetensors weight files (whole or not, from their headers alone), what
its config.json says about quantization, and what a recipe will make it say."""
import json
import math
import struct
from contextlib import contextmanager
from pathlib import Path

from quantize.common.errors import UserError
from quantize.common.manifest import Quantization, Scheme


INDEX = "model.safetensors.index.json"


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files a loader reads: those the index names where
    there is one (a hub repo may ship a second, consolidated copy of the
    weights beside its shards), else every *.safetensors in the folder."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX
    if not index.is_file():
        return sorted(model_dir.glob("*.safetensors"))
    try:
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise UserError(f"{index} is not a safetensors index (a JSON object with a weight_map); "
                        "re-copy or re-download the checkpoint") from None
    missing = [name for name in names if not (model_dir / name).is_file()]
    if missing:
        raise UserError(f"{model_dir} lacks {len(missing)} weight file(s) its {INDEX} names "
                        f"({', '.join(missing[:3])}); re-copy or re-download the checkpoint")
    return [model_dir / name for name in names]


# Bytes per element of each safetensors dtype (bit-packed types never appear here).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def check_weight_files(paths) -> None:
    """Every safetensors file has a readable header whose tensors fill the file
    exactly. Reads only the headers, so a truncated or corrupt download fails
    in milliseconds instead of deep inside a model loader or engine start-up."""
    for path in paths:
        problem = _safetensors_problem(Path(path))
        if problem:
            raise UserError(f"{path} is not a complete safetensors file ({problem}); "
                            "re-copy or re-create the checkpoint")


class HeaderError(ValueError):
    """A safetensors file whose header cannot be read; the message says why."""


def read_header(path: Path) -> tuple[dict, int]:
    """The safetensors header of `path` (tensor name -> dtype, shape, data
    offsets; `__metadata__`) and the number of data bytes after it."""
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise HeaderError(f"{size} bytes, shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise HeaderError(f"header claims {n} bytes, the file holds {size - 8}")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise HeaderError("header is not valid JSON") from None
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object")
    return header, size - 8 - n


def _safetensors_problem(path: Path) -> str | None:
    try:
        header, data = read_header(path)
    except HeaderError as e:
        return str(e)
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = info["data_offsets"]
            width = DTYPE_BYTES.get(info["dtype"])  # an unknown dtype: trust its offsets
            want = math.prod(info["shape"]) * width if width else stop - start
        except (KeyError, TypeError, ValueError):
            return f"tensor {name} has a malformed header entry"
        if stop - start != want:
            return f"tensor {name} has {stop - start} bytes for shape {info['shape']} {info['dtype']}"
        end = max(end, stop)
    if end != data:
        return f"tensors need {end} data bytes, the file holds {data}"
    return None


def quantization_summary(artifact_dir: Path) -> Quantization:
    """What config.json says about the checkpoint's quantization: method,
    format, the weight/activation schemes, what is left unquantized, and the
    KV-cache scheme (only when the recipe quantizes it)."""
    config = json.loads((Path(artifact_dir) / "config.json").read_text())
    q = config.get("quantization_config")
    if not q:
        return Quantization(method=None, format="dense")
    schemes = []
    for group in (q.get("config_groups") or {}).values():
        w, a = group.get("weights") or {}, group.get("input_activations") or {}
        schemes.append(Scheme(weights=_describe_args(w), activations=_describe_args(a) if a else None))
    kv_cache = q.get("kv_cache_scheme")
    return Quantization(method=q.get("quant_method"), format=q.get("format"), schemes=tuple(schemes),
                        ignore=q.get("ignore", []), kv_cache=_describe_args(kv_cache) if kv_cache else None)


def _describe_args(args: dict) -> dict:
    keys = ("num_bits", "type", "symmetric", "strategy", "group_size", "dynamic")
    return {k: args.get(k) for k in keys if k in args}


def planned_quantization_config(recipe_path: Path) -> dict | None:
    """The `quantization_config` a checkpoint made with this llm-compressor
    recipe will carry, as llm-compressor resolves the recipe's quantization
    modifiers (presets, config groups, KV-cache scheme), known before any model
    is loaded. None for a recipe that does not quantize (the baseline, pruning)."""
    import yaml
    if not yaml.safe_load(Path(recipe_path).read_text()):
        return None  # the baseline's empty recipe
    from llmcompressor.recipe import Recipe
    configs = [m.resolve_quantization_config().model_dump(mode="json", exclude_none=True)
               for m in Recipe.create_instance(str(recipe_path)).modifiers
               if hasattr(m, "resolve_quantization_config")]
    if not configs:
        return None
    merged = configs[0] | {"config_groups": {}}
    groups = merged["config_groups"]
    for config in configs:
        for group in config.get("config_groups", {}).values():
            groups[f"group_{len(groups)}"] = group   # renamed: every modifier numbers its own from group_0
        merged["kv_cache_scheme"] = merged.get("kv_cache_scheme") or config.get("kv_cache_scheme")
    return merged


def load_renames(model) -> tuple[list, list]:
    """How transformers' loader maps stored tensor names to `model`'s, as
    transformers.core_model_loading.rename_source_key takes it: (its
    WeightRenamings, its WeightConverters, which merge several stored tensors
    into one parameter, e.g. per-expert MoE weights)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming
    transforms = get_model_conversion_mapping(model)
    return ([t for t in transforms if isinstance(t, WeightRenaming)],
            [t for t in transforms if isinstance(t, WeightConverter)])


def check_complete(model_dir: Path, missing: list[str], config: dict) -> None:
    """Refuse a checkpoint whose weight files lack parameters its architecture
    has (`missing`: transformers' missing keys, parameters only): loading
    initialises them at random, and every number measured on the artifact
    built from it would be meaningless."""
    if not missing:
        return
    missing = sorted(missing)
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    architecture = (config.get("architectures") or [config.get("model_type") or "configured"])[0]
    hint = ""
    if any("lm_head" in name.split(".") for name in missing) and not config.get("tie_word_embeddings", True):
        hint = (" (tie_word_embeddings is false, so lm_head is a tensor of its own; set it true in "
                "config.json if the model shares it with the embeddings)")
    raise UserError(f"model {model_dir} lacks {len(missing)} parameter tensor(s) of the {architecture} "
                    f"architecture, which loading would initialise at random: {shown}{hint}; "
                    "re-copy or re-download the checkpoint")


def raise_if_mismatched(artifact_dir: Path, problems: list[str], what: str = "checkpoint") -> None:
    """The checks' one failure message: the first five problems of a checkpoint
    that does not match its model, and how many more."""
    if problems:
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise RuntimeError(f"{what} in {artifact_dir} does not match its model: " + "; ".join(problems[:5]) + more)


def ignore_unquantized(artifact_dir: Path, model) -> list[str]:
    """Add to the saved compressed-tensors `quantization_config.ignore` every
    module its config groups target that the calibrated `model` left
    unquantized; returns those added. compressed-tensors lists a skipped
    module only where its exact class was quantized elsewhere, so Falcon's
    `lm_head` (a Linear beside FalconLinear layers) was left off: a loader
    then quantizes it and finds no scales (a tied head initialised at random)."""
    from compressed_tensors.quantization.quant_config import _map_to_checkpoint_names
    from compressed_tensors.utils import match_named_modules

    from quantize.common.atomic import write_text
    path = Path(artifact_dir) / "config.json"
    config = json.loads(path.read_text())
    q = config.get("quantization_config") or {}
    if q.get("quant_method") != "compressed-tensors":
        return []
    targets = {t for group in (q.get("config_groups") or {}).values() for t in group.get("targets") or ()}
    ignore = list(q.get("ignore") or [])
    skipped = [name for name, module in match_named_modules(model, targets, ignore)
               if getattr(module, "quantization_scheme", None) is None]
    added = [n for n in _map_to_checkpoint_names(model, skipped) if n not in ignore]
    if added:
        q["ignore"] = ignore + added
        write_text(path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return added


@contextmanager
def linear_subclasses_as_linear(model):
    """While saving: every quantized module of a strict nn.Linear subclass
    (Falcon's FalconLinear: x @ W.T + b) counts as nn.Linear. compressed-tensors
    compresses only the exact classes it knows, so such layers were saved in
    `dense` format (fake-quantized bf16 weights, full size) that vLLM has no
    scheme for. Their tensors are a Linear's; the class is restored after."""
    import torch
    swapped = [(m, type(m)) for m in model.modules()
               if isinstance(m, torch.nn.Linear) and type(m) is not torch.nn.Linear
               and getattr(m, "quantization_scheme", None) is not None]
    for module, _ in swapped:
        module.__class__ = torch.nn.Linear
    try:
        yield len(swapped)
    finally:
        for module, cls in swapped:
            module.__class__ = cls
