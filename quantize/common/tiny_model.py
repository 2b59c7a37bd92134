"""Tiny random models with the default model's tokenizer (vocab 49152 >= the
10000 token ids `vllm bench` style random prompts draw), for the tests and
the capability probe: a Llama and a Qwen3 mixture-of-experts. Their widths are
multiples of 128, so every shipped scheme's group size divides them."""
from pathlib import Path


def build_tiny_llama(out: Path, tokenizer_dir: Path, seed: int = 0, initializer_range: float = 0.02,
                     dtype: str = "bfloat16") -> Path:
    """A larger `initializer_range` gives peaked next-token distributions, so
    that weight changes show in KL and top-1 agreement."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=1024, tie_word_embeddings=True,
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
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
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
