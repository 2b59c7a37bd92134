"""Mixture-of-experts checkpoints.

transformers keeps each layer's experts as fused 3D parameters
(`mlp.experts.gate_up_proj`), while checkpoints, llm-compressor's modifiers and
vLLM work on one 2D Linear per expert and projection
(`mlp.experts.0.gate_proj.weight`). llm-compressor's `linearize_moe` turns the
fused experts into such Linears; quantbench applies it right after loading,
so that the dtype oneshot computes in reaches the experts too (linearizing
later, inside oneshot, leaves them in the checkpoint's dtype), and again when
the saved checkpoint is reloaded for the checks."""
from pathlib import Path

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


def linearize(model) -> None:
    """Fused experts -> one Linear per expert and projection (in place)."""
    from llmcompressor.modeling.moe.linearize import linearize_moe
    linearize_moe(model)


def reload_dense(artifact_dir: Path):
    """The compressed checkpoint of an MoE model as a dense, linearized model.

    transformers' own loader cannot map per-expert quantized tensors onto fused
    experts, so: build the model from its config, linearize it, attach the
    quantization scheme, load every tensor of the checkpoint (each must find
    its parameter, and each parameter its tensor, tied ones aside), then
    decompress."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(artifact_dir)
    q = getattr(config, "quantization_config", None)
    if q:
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(config, "dtype", None) or torch.bfloat16)
    linearize(model)
    scheme = QuantizationConfig.model_validate(q) if q else None
    compressor = ModelCompressor(quantization_config=scheme) if scheme else None
    if scheme:  # as transformers' loader does: the compressed layout (packed int4 ...) receives the tensors
        apply_quantization_config(model, scheme, run_compressed=False)
        compressor.compress_model(model)
    state = {}
    for path in sorted(Path(artifact_dir).glob("*.safetensors")):
        state.update(load_file(path))
    loaded = model.load_state_dict(state, strict=False)
    tied = {k for k in loaded.missing_keys if k.endswith("lm_head.weight") and config.tie_word_embeddings}
    missing = sorted(set(loaded.missing_keys) - tied)
    if missing or loaded.unexpected_keys:
        raise RuntimeError(f"checkpoint in {artifact_dir} does not match its model: missing {missing[:5]}, "
                           f"unexpected {loaded.unexpected_keys[:5]}")
    if compressor:
        compressor.decompress_model(model)
    model.tie_weights()
    return model.eval()
