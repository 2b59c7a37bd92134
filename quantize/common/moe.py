"""Mixture-of-experts checkpoints.

transformers keeps each layer's experts as fused 3D parameters
(`mlp.experts.gate_up_proj`), while checkpoints, llm-compressor's modifiers and
vLLM work on one 2D Linear per expert and projection
(`mlp.experts.0.gate_proj.weight`). llm-compressor's `linearize_moe` turns the
fused experts into such Linears; quantbench applies it right after loading,
so that the dtype oneshot computes in reaches the experts too (linearizing
later, inside oneshot, leaves them in the checkpoint's dtype), and again when
the saved checkpoint is reloaded for the checks.

Names: transformers' checkpoint conversion mapping (per model type) turns the
stored names into the model's on load and back on save, and merges stored
per-expert tensors into the fused ones with WeightConverters. A linearized
model has no fused experts, so its save and its reload use that mapping less
the transforms that build fused experts, plus a renaming per expert where the
stored projection names differ from the Linears' (Mixtral's w1/w3/w2): the
checkpoint carries per-expert tensors under the names the original class's
converters and vLLM read (`block_sparse_moe.experts.0.w1.*`), and the model's
own parameter names elsewhere (GraniteMoE's `router.weight`, not its legacy
`router.layer.weight`)."""
import re
from pathlib import Path

from quantize.common import hf_load

# config.json keys that hold the number of routed experts, across families.
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def num_experts(config: dict) -> int:
    return max((int(config.get(k) or 0) for k in EXPERT_KEYS), default=0)


def is_moe(config: dict) -> bool:
    return num_experts(config) > 0


def describe(config: dict, ignored: list[str]) -> dict | None:
    """For the manifest: the expert layout, and which layers were left dense."""
    if not is_moe(config):
        return None
    return {"num_experts": num_experts(config),
            "experts_per_token": config.get("num_experts_per_tok") or config.get("moe_top_k"),
            "dense_routers": [name for name in ignored if name.rsplit(".", 1)[-1] in ("gate", "router")]}


# Parameters of a fused experts module (transformers' `use_experts_implementation` layout).
FUSED_EXPERT_PARAMS = ("gate_up_proj", "up_proj", "down_proj")
# A fused parameter -> the Linears of a linearized expert it holds, in the order stored.
LINEARS_OF = {"gate_up_proj": ("gate_proj", "up_proj"), "up_proj": ("up_proj",), "down_proj": ("down_proj",)}


def linearize(model) -> None:
    """Fused experts -> one Linear per expert and projection (in place); the
    model then saves its experts one tensor set per expert (see the module doc)."""
    from llmcompressor.modeling.moe.linearize import linearize_moe
    linearize_moe(model)
    model._weight_conversions = save_conversions(model)  # what save_pretrained reverts


def _fused_target(transform) -> str | None:
    """The fused experts parameter a transform builds, or None."""
    for target in transform.target_patterns:
        *_, parent, param = target.split(".")
        if parent == "experts" and param in FUSED_EXPERT_PARAMS:
            return param
    return None


def _per_expert_renamings(converter, fused: str) -> list:
    """WeightRenamings stored per-expert name -> linearized Linear, for a
    converter that merges per-expert tensors (`.experts.*.w1.weight`) into
    `fused`; none where the stored names are the Linears' own."""
    from transformers.core_model_loading import WeightConverter, WeightRenaming
    if not isinstance(converter, WeightConverter):
        return []
    renamings = []
    for source, linear in zip(converter.source_patterns, LINEARS_OF[fused]):
        match = re.search(r"experts\.\*\.(\w+)\.weight$", source)
        if match and match.group(1) != linear:
            renamings.append(WeightRenaming(rf"\.experts\.(\d+)\.{match.group(1)}\.", rf".experts.\1.{linear}."))
    return renamings


def linearized_conversions(transforms: list) -> list:
    """transformers' conversion mapping of a model as it applies once its
    experts are linearized: the transforms that build fused experts become
    per-expert renamings (or nothing), the others stay."""
    out = []
    for transform in transforms:
        fused = _fused_target(transform)
        out += [transform] if fused is None else _per_expert_renamings(transform, fused)
    return out


def save_conversions(model) -> list:
    """The mapping a linearized model saves with: its linearized conversions
    less the renamings of single parameters (legacy names such as GraniteMoE's
    `router.layer.weight`, which transformers and vLLM both read under the
    model's own name); module renamings (Mixtral's `block_sparse_moe`, which
    vLLM's Mixtral reads) and per-expert ones stay."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    transforms = getattr(model, "_weight_conversions", None) or get_model_conversion_mapping(model, add_legacy=False)
    return [t for t in linearized_conversions(transforms)
            if not any(re.search(r"\.(weight|bias)\$?$", target) for target in t.target_patterns)]


def load_conversions(model) -> tuple[list, list]:
    """(renamings, converters) a loader applies to the stored names of a
    linearized model's checkpoint: transformers' mapping, legacy names
    included, as `linearized_conversions` leaves it."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming
    transforms = linearized_conversions(get_model_conversion_mapping(model))
    return ([t for t in transforms if isinstance(t, WeightRenaming)],
            [t for t in transforms if not isinstance(t, WeightRenaming)])


def reload_dense(artifact_dir: Path):
    """A compressed checkpoint transformers' own loader cannot take
    (`needs_own_loader`) as a dense model, linearized if it is an MoE.

    transformers' own loader cannot map per-expert quantized tensors onto fused
    experts, so: build the model from its config, linearize it, attach the
    quantization scheme, rename the stored tensors as transformers' loader
    would for a linearized model (`load_conversions`), load them (each must
    find its parameter at its shape, and each parameter its tensor, tied ones
    aside), then decompress. A mismatch raises RuntimeError naming it."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

    from quantize.common.checkpoint import linear_subclasses_as_linear
    config = hf_load.config(artifact_dir)
    q = getattr(config, "quantization_config", None)
    if q:
        del config.quantization_config
    model = hf_load.causal_lm_from_config(config, dtype=getattr(config, "dtype", None) or torch.bfloat16)
    linearize(model)
    scheme = QuantizationConfig.model_validate(q) if q else None
    compressor = ModelCompressor(quantization_config=scheme) if scheme else None
    if scheme:  # as transformers' loader does: the compressed layout (packed int4 ...) receives the tensors
        apply_quantization_config(model, scheme, run_compressed=False)
        with linear_subclasses_as_linear(model):  # compressed as saved (quantize/pipeline.py)
            compressor.compress_model(model)
    state = stored_as_loaded(artifact_dir, *load_conversions(model))
    _check_matches(artifact_dir, model, state)
    model.load_state_dict(state, strict=False)
    if compressor:
        with linear_subclasses_as_linear(model):
            compressor.decompress_model(model)
        _drop_quantization(model)
    _drop_offload(model)
    model.tie_weights()
    return model.eval()


def _drop_offload(model) -> None:
    """llm-compressor's linearized experts come offloaded (compressed-tensors'
    OffloadCache, onloaded to the CPU on each call): a model moved to the GPU
    would then compute its experts with CPU tensors. Plain modules instead."""
    from compressed_tensors.offload import remove_dispatch
    remove_dispatch(model, onload_tensors=True)


def _drop_quantization(model) -> None:
    """After decompression: plain dense modules, as transformers' dequantizing
    loader leaves them. The schemes' wrapped forwards and leftover scales would
    fake-quantize the dense weights again on every call, and create tensors
    on the CPU beside a model moved to the GPU."""
    from compressed_tensors.quantization.quant_metadata import QuantizationMetadata
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:
            QuantizationMetadata.clear_quantization(module)
            for leftover in ("weight_shape",):  # serialized, so not among the qparams cleared
                if hasattr(module, leftover):
                    delattr(module, leftover)


def needs_own_loader(artifact_dir: Path) -> bool:
    """Whether transformers' from_pretrained cannot load this checkpoint and
    reload_dense must: a quantized MoE (per-expert tensors), or a compressed
    checkpoint of a model with nn.Linear subclasses (Falcon's FalconLinear:
    its _init_weights reaches for the `weight` the compressed layout replaced)."""
    import json

    import torch
    config = json.loads((Path(artifact_dir) / "config.json").read_text())
    if (config.get("quantization_config") or {}).get("quant_method") != "compressed-tensors":
        return False
    if is_moe(config):
        return True
    with torch.device("meta"):
        model = hf_load.causal_lm_from_config(hf_load.config(artifact_dir))
    return any(isinstance(m, torch.nn.Linear) and type(m) is not torch.nn.Linear for m in model.modules())


def stored_as_loaded(artifact_dir: Path, renamings: list, converters: list) -> dict:
    """Every stored tensor, keyed by the name transformers' loader gives it;
    one a converter would merge into a fused parameter keeps its stored name
    (a linearized model has no such parameter: it shows as unexpected)."""
    from safetensors.torch import load_file
    from transformers.core_model_loading import rename_source_key
    state = {}
    for path in sorted(Path(artifact_dir).glob("*.safetensors")):
        for stored, tensor in load_file(path).items():
            name, merged_by = rename_source_key(stored, renamings, converters)
            state[stored if merged_by else name] = tensor
    return state


def _check_matches(artifact_dir: Path, model, state: dict) -> None:
    """The loading report transformers would give: missing (tied parameters
    aside, as the config ties them), unexpected and mismatched tensors."""
    expected = model.state_dict()
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    problems = [f"missing tensor {n}" for n in sorted(set(expected) - set(state) - tied)]
    problems += [f"unexpected tensor {n}" for n in sorted(set(state) - set(expected))]
    problems += [f"{n} is {tuple(state[n].shape)}, the model needs {tuple(expected[n].shape)}"
                 for n in sorted(set(state) & set(expected)) if state[n].shape != expected[n].shape]
    from quantize.common.checkpoint import raise_if_mismatched
    raise_if_mismatched(artifact_dir, problems)
