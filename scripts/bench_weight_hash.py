#!/usr/bin/env python
"""How long the base model's weight hash (part of every artifact id) takes on
a big checkpoint: an 8B-shaped Llama with random bf16 weights (hidden 4096,
32 layers, MLP 14336, 8 KV heads, vocab 32000, untied: 7.24B parameters,
14.5 GB), written shard by shard so that building it needs one tensor's
memory, not the model's.

The checkpoint is built once and reused. Before hashing, its pages are
dropped from the page cache (fsync + POSIX_FADV_DONTNEED), so the number is
a cold read from disk, the case of a model just copied or downloaded. Also
prints SHA-256's speed on bytes already in memory (is the disk or the hash
the limit?) and the model's memory footprint as quantize's memory check reads
it from the headers.

    .venv/bin/python scripts/bench_weight_hash.py               # build or reuse .cache/bench/random-llama-8b-shape
    .venv/bin/python scripts/bench_weight_hash.py --dir D --delete   # D: a new folder; removed after
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quantize.common import memory_check  # noqa: E402
from quantize.common.atomic import staging_dir  # noqa: E402
from quantize.common.checkpoint import weight_files  # noqa: E402
from quantize.common.paths import CACHE_DIR  # noqa: E402
from quantize.common.provenance import cpu_model, sha256_files  # noqa: E402

HIDDEN, LAYERS, MLP, HEADS, KV_HEADS, VOCAB = 4096, 32, 14336, 32, 8, 32000
SHARD_BYTES = 2 * 10**9  # about what transformers' sharding writes
# In a checkpoint this script built: only such a folder is --delete's to remove.
MARKER = "BUILT_BY_BENCH_WEIGHT_HASH"


def tensors() -> list[tuple[str, tuple[int, ...]]]:
    """Name and shape of every tensor of the Llama, in file order."""
    kv = HIDDEN // HEADS * KV_HEADS
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (HIDDEN,)), (p + "post_attention_layernorm.weight", (HIDDEN,)),
                (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)), (p + "self_attn.k_proj.weight", (kv, HIDDEN)),
                (p + "self_attn.v_proj.weight", (kv, HIDDEN)), (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
                (p + "mlp.gate_proj.weight", (MLP, HIDDEN)), (p + "mlp.up_proj.weight", (MLP, HIDDEN)),
                (p + "mlp.down_proj.weight", (HIDDEN, MLP))]
    return out + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def shards() -> list[list[tuple[str, tuple[int, ...]]]]:
    groups, size = [[]], 0
    for name, shape in tensors():
        nbytes = math.prod(shape) * 2
        if size + nbytes > SHARD_BYTES and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += nbytes
    return groups


def random_bf16(rng, n: int) -> bytes:
    """n finite bf16 values of magnitude 2^-7 .. 2^-6 with random sign and
    mantissa: random bits with the exponent pinned (no NaN or inf)."""
    import numpy as np
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    bits &= 0x807F
    bits |= 0x3C00
    return bits.tobytes()


def write_shard(path: Path, group, rng) -> None:
    """A safetensors file written tensor by tensor: header, then each tensor's bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in group:
        nbytes = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, shape in group:
            f.write(random_bf16(rng, math.prod(shape)))
        f.flush()
        os.fsync(f.fileno())


def build(out: Path) -> Path:
    """The checkpoint at `out`: built there, or the one found there (this
    script's from an earlier run, or a model of the user's, which is hashed
    as it is). A folder with other files is refused: the build would replace it."""
    if (out / "model.safetensors.index.json").is_file():
        return out
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        print(f"error: --dir {out} is a file, not a folder; building there would replace it: "
              "pass --dir <a new or empty folder>", file=sys.stderr)
        raise SystemExit(2)
    if out.is_dir() and any(out.iterdir()):
        print(f"error: --dir {out} holds files but no checkpoint (model.safetensors.index.json); "
              "building there would replace them: pass --dir <a new or empty folder>", file=sys.stderr)
        raise SystemExit(2)
    import numpy as np
    rng = np.random.default_rng(0)
    groups = shards()
    with staging_dir(out) as tmp:
        weight_map = {}
        for i, group in enumerate(groups, 1):
            name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
            start = time.perf_counter()
            write_shard(tmp / name, group, rng)
            print(f"  wrote {name} ({(tmp / name).stat().st_size / 1e9:.2f} GB) in "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
            weight_map |= {tensor: name for tensor, _ in group}
        total = sum(math.prod(s) * 2 for _, s in tensors())
        (tmp / "config.json").write_text(json.dumps(config(), indent=2))
        (tmp / MARKER).write_text("random weights built by scripts/bench_weight_hash.py; --delete removes them\n")
        # the index last: its presence marks a complete build for the next run
        (tmp / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return out


def config() -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
            "intermediate_size": MLP, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "dtype": "bfloat16"}


def drop_page_cache(paths) -> None:
    """Evict the files' pages, so the hash reads from disk (no root needed)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def hash_in_memory_gbps(nbytes: int = 1 << 30) -> float:
    """SHA-256 over bytes already in memory, in 16 MiB updates as sha256_files does."""
    block = os.urandom(16 << 20)
    h, start = hashlib.sha256(), time.perf_counter()
    for _ in range(nbytes // len(block)):
        h.update(block)
    return nbytes / (time.perf_counter() - start) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=CACHE_DIR / "bench" / "random-llama-8b-shape")
    ap.add_argument("--delete", action="store_true",
                    help="remove the checkpoint afterwards (one this script built; a model of yours stays)")
    args = ap.parse_args()
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; sha256 in memory: {hash_in_memory_gbps():.2f} GB/s")
    start = time.perf_counter()
    model = build(args.dir)
    print(f"checkpoint {model} ready in {time.perf_counter() - start:.0f} s")
    files = weight_files(model)
    size = sum(p.stat().st_size for p in files)
    need = memory_check.footprint(model, "bfloat16", hessians=True)
    print(f"footprint: {need.params / 1e9:.2f}B parameters, {memory_check.gib(need.weight_bytes)} in bf16; "
          f"largest layer {need.layer} {memory_check.gib(need.layer_bytes)} + "
          f"{memory_check.gib(need.layer_hessian_bytes)} of GPTQ Hessians")
    drop_page_cache(files)
    start = time.perf_counter()
    digest = sha256_files(files)
    seconds = time.perf_counter() - start
    print(f"weight hash (cold): {len(files)} files, {size / 1e9:.2f} GB in {seconds:.1f} s = "
          f"{size / 1e9 / seconds:.2f} GB/s  sha256 {digest[:16]}")
    if args.delete:
        delete(model)


def delete(model: Path) -> None:
    """Remove the checkpoint if this script built it; never a model of the user's."""
    if not (model / MARKER).is_file():
        print(f"kept {model}: it has no {MARKER} marker (built by an older run of this script, or not by it), "
              "so --delete leaves it")
        return
    shutil.rmtree(model)
    print(f"deleted {model}")


if __name__ == "__main__":
    main()
