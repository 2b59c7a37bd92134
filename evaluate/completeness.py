"""Does a checkpoint hold every parameter its config.json implies? The
architecture is built on the meta device by transformers (no weights, no
memory), and its parameter names are compared with the tensor names of the
safetensors headers, read as transformers reads them when it loads:

- quantized names map back to the parameter they store: compressed-tensors'
  `weight_packed` and GPTQ/AWQ's `qweight` stand for `weight` (scales and
  zero points stand for nothing on their own);
- transformers' own checkpoint conversions apply (renamed keys, per-expert
  MoE weights that load into one fused parameter, the base-model prefix);
- tied parameters (lm_head with tie_word_embeddings) need one stored copy.

Without this, transformers initialises a missing weight at random and vLLM
loads the checkpoint without a word. Per-expert tensors merged into one
parameter count as present when any of them is."""
import logging
import re
from pathlib import Path

from quantize.common import hf_load
from quantize.common.checkpoint import load_renames, read_header, weight_files

log = logging.getLogger(__name__)

# The stored tensor that carries a quantized parameter -> that parameter.
PRIMARY = {"weight_packed": "weight", "qweight": "weight"}


def missing_parameters(checkpoint: Path) -> list[str] | None:
    """The model parameters no tensor of the checkpoint provides, in model
    order; None when transformers cannot build the architecture here (an
    architecture only an engine or remote code knows): nothing to compare."""
    model = _meta_model(Path(checkpoint))
    if model is None:
        return None
    stored = _as_parameter_names(model, stored_tensor_names(checkpoint))
    groups: dict[int, list[str]] = {}  # a tied parameter is one object under several names
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    optional = getattr(model, "_keys_to_ignore_on_load_missing", None) or []
    return [names[0] for names in groups.values()
            if not stored.intersection(names) and not any(re.search(p, n) for p in optional for n in names)]


def stored_tensor_names(checkpoint: Path) -> set[str]:
    names = set()
    for path in weight_files(checkpoint):
        names |= {k for k in read_header(path)[0] if k != "__metadata__"}
    return names


def _meta_model(checkpoint: Path):
    """The config's architecture, built on the meta device; None when
    transformers has no such class or cannot build it from this config."""
    try:
        import torch
        import transformers
        config = hf_load.config(checkpoint)
        arch = (getattr(config, "architectures", None) or [None])[0]
        cls = getattr(transformers, arch, None) if arch else None
        if cls is None:
            log.info("completeness check skipped: transformers has no class %s", arch)
            return None
        if getattr(config, "quantization_config", None) is not None:
            del config.quantization_config  # the skeleton's parameter names are the dense model's
        with torch.device("meta"):
            return cls._from_config(config)
    except Exception as e:  # an engine may still serve what transformers cannot build
        log.info("completeness check skipped: transformers cannot build %s (%s)", checkpoint, e)
        return None


def _as_parameter_names(model, tensor_names: set[str]) -> set[str]:
    """The model parameters these checkpoint tensors load into."""
    candidates = {_parameter_of(n) for n in tensor_names}
    try:
        from transformers.core_model_loading import rename_source_key
        renamings, converters = load_renames(model)
        meta = model.state_dict()
        return {rename_source_key(n, renamings, converters, model.base_model_prefix, meta)[0]
                for n in candidates}
    except (ImportError, AttributeError, TypeError):  # a transformers without these: names as stored
        return _with_prefix_variants(candidates, model.base_model_prefix)


def _parameter_of(tensor: str) -> str:
    head, _, last = tensor.rpartition(".")
    return f"{head}.{PRIMARY[last]}" if last in PRIMARY and head else tensor


def _with_prefix_variants(names: set[str], prefix: str) -> set[str]:
    out = set(names)
    for n in names:
        out.add(n.removeprefix(f"{prefix}.") if n.startswith(f"{prefix}.") else f"{prefix}.{n}")
    return out
