"""A random-weight Llama of a given shape, with the default model's tokenizer
and config (vocab, special tokens, RoPE), saved as a bf16 safetensors
checkpoint: what scripts/device_check.sh quantizes and evaluates.

    python scripts/device/build_model.py OUT_DIR BASE_DIR --shape 1b|8b|tiny|small

Shapes: `1b` is Llama-3.2-1B's (hidden 2048, 16 layers), `8b` Llama-3.1-8B's
(hidden 4096, 32 layers); `tiny` and `small` stand in for them in a dry run on
a CPU. Every width is a multiple of 128, so the shipped recipes' group size 64
divides it. The weights are drawn on the GPU when there is one (seconds for
8B), else on the CPU. One JSON line on stdout says what was built.
"""
import argparse
import json
import sys
import time
from pathlib import Path

SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "small": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}


def build(out: Path, base: Path, shape: str, seed: int = 0) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(base, trust_remote_code=False)  # never code from a model folder
    if config.model_type != "llama":
        raise SystemExit(f"build_model: {base} is a {config.model_type} model, not a Llama")
    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    for key, value in SHAPES[shape].items():
        setattr(config, key, value)
    config.vocab_size = len(tokenizer)
    config.tie_word_embeddings = True
    # Llama-3's 131072 positions for the GPU shapes, so the reference scenarios'
    # long_context (16384 + 32 tokens) fits; the dry run's shapes keep the base's.
    config.max_position_embeddings = 131072 if shape in ("1b", "8b") else \
        max(int(config.max_position_embeddings or 0), 2048)
    config.dtype = "bfloat16"
    device = "cuda" if torch.cuda.is_available() else "cpu"

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, trust_remote_code=False)
    if device == "cuda":
        torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    save_s = time.perf_counter() - t1
    return {
        "shape": shape, "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "params": sum(p.numel() for p in model.parameters()),
        "bytes": sum(f.stat().st_size for f in out.glob("*.safetensors")),
        "init_s": round(init_s, 2), "save_s": round(save_s, 2),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("base", type=Path, help="the default model's dir (its config.json and tokenizer)")
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not (args.base / "config.json").is_file():
        print(f"build_model: no config.json in {args.base}", file=sys.stderr)
        return 2
    info = build(args.out, args.base, args.shape, args.seed)
    print("build_model:", json.dumps(info))
    (args.out.parent / f"{args.out.name}.build.json").write_text(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
