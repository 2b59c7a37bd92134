#!/usr/bin/env python
"""What evaluate's artifact check costs before any engine starts
(evaluate/target.py check_weights): the weights fingerprint it compares with
the manifest (verify=fingerprint, the default), the SHA-256 of every byte
(verify=full), and the completeness check of a checkpoint without a
fingerprint (the architecture on the meta device against the safetensors
tensor names).

Two checkpoints: the default model (SmolLM2-135M, .cache/models/) and an
8B-shaped Llama of random bf16 weights (14.5 GB in 8 shards, as
scripts/bench_weight_hash.py writes it: real bytes, not sparse files). The
big one is written to a temporary folder, only with at least 30 GB free, and
deleted right after. "cold": the files' pages are dropped from the page cache
first (fsync + POSIX_FADV_DONTNEED), the case of a checkpoint just copied.

    .venv/bin/python scripts/bench_artifact_check.py            # both checkpoints
    .venv/bin/python scripts/bench_artifact_check.py --no-big   # the default model only
"""
import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_weight_hash import build, drop_page_cache  # noqa: E402
from quantize.common import fingerprint  # noqa: E402
from quantize.common.assets import SMOLLM2_DIR, ensure_default_model  # noqa: E402
from quantize.common.checkpoint import weight_files  # noqa: E402
from quantize.common.provenance import cpu_model  # noqa: E402

MIN_FREE_BYTES = 30 * 10**9


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def cpu_features() -> str:
    """The AVX-512 and AMX flags of this CPU, as /proc/cpuinfo lists them."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    return " ".join(sorted(set(re.findall(r"\b(?:avx512|amx)[a-z_0-9]*", text)))) or "no avx512/amx"


def bench(name: str, model: Path, full: bool) -> None:
    files = weight_files(model)
    size = sum(p.stat().st_size for p in files)
    print(f"\n{name}: {model}, {len(files)} files, {size / 1e9:.2f} GB")
    drop_page_cache(files)
    cold, cold_s = timed(lambda: fingerprint.compute(files))
    warm, warm_s = timed(lambda: fingerprint.compute(files))
    assert cold == warm
    read = sum(min(f.stat().st_size, fingerprint.BLOCKS * fingerprint.BLOCK_BYTES) for f in files)
    print(f"  verify=fingerprint: {cold_s * 1e3:.1f} ms cold, {warm_s * 1e3:.1f} ms warm "
          f"(headers + {read / 2**20:.1f} MiB of sampled blocks)")
    if full:
        drop_page_cache(files)
        _, full_cold_s = timed(lambda: fingerprint.compute(files, full=True))
        _, full_warm_s = timed(lambda: fingerprint.compute(files, full=True))
        print(f"  verify=full: {full_cold_s:.2f} s cold ({size / 1e9 / full_cold_s:.2f} GB/s), "
              f"{full_warm_s:.2f} s warm ({size / 1e9 / full_warm_s:.2f} GB/s)")
    from evaluate import completeness
    missing, check_s = timed(lambda: completeness.missing_parameters(model))
    assert missing == [], missing
    print(f"  completeness (no fingerprint): {check_s:.2f} s (architecture on the meta device, "
          f"names from the headers)")


def big_checkpoint(args) -> None:
    parent = Path(args.tmp or tempfile.gettempdir())
    free = shutil.disk_usage(parent).free
    if free < MIN_FREE_BYTES:
        print(f"\n14 GB checkpoint skipped: {free / 1e9:.1f} GB free in {parent}, it needs "
              f"{MIN_FREE_BYTES / 1e9:.0f} GB")
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-artifact-check-", dir=parent))
    try:
        model, build_s = timed(lambda: build(folder / "random-llama-8b-shape"))
        print(f"\nwrote the 8B-shaped checkpoint in {build_s:.0f} s")
        bench("8B-shaped random Llama", model, full=args.full)
    finally:
        shutil.rmtree(folder)
        print(f"deleted {folder}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-big", dest="big", action="store_false", help="skip the 14 GB checkpoint")
    ap.add_argument("--no-full", dest="full", action="store_false", help="skip verify=full (reads every byte)")
    ap.add_argument("--tmp", help="where to write the 14 GB checkpoint (default: the system temp folder)")
    args = ap.parse_args()
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; {cpu_features()}")
    print(f"fingerprint: {fingerprint.BLOCKS} blocks of {fingerprint.BLOCK_BYTES >> 10} KiB per file")
    if not (SMOLLM2_DIR / "config.json").is_file():
        ensure_default_model()
    _, import_s = timed(lambda: (__import__("torch"), __import__("transformers").AutoConfig))
    print(f"importing torch + transformers (the completeness check's; an engine imports them anyway): "
          f"{import_s:.1f} s")
    bench("default model", SMOLLM2_DIR, full=args.full)
    if args.big:
        big_checkpoint(args)


if __name__ == "__main__":
    main()
