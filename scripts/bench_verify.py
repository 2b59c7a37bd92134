#!/usr/bin/env python
"""What the artifact check costs: `verify=tensors` (the default: the saved
safetensors read module by module, dequantized by compressed-tensors, compared
with the architecture built on the meta device) against `verify=reload` (the
whole checkpoint loaded in transformers, decompressed, one forward pass).

Each (artifact, mode) runs in a fresh subprocess, so every check starts with
nothing in memory; it prints the check's wall time and the process's peak
resident memory above what it held after its imports. Prints numbers, asserts
nothing.

    .venv/bin/python scripts/bench_verify.py                   # the default model's artifacts under artifacts/
    .venv/bin/python scripts/bench_verify.py --artifacts DIR ... --repeats 3
    .venv/bin/python scripts/bench_verify.py --build-llama 1.1  # also a random ~1.1B Llama, quantized W4A16 RTN
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quantize.common import machine  # noqa: E402

MODES = ("tensors", "reload")
CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from quantize import verify
import torch, transformers, compressed_tensors  # imports are not the check's cost

def status_mb(key):  # VmRSS / VmHWM of this process, kB -> MB
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) / 1024

open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts here
rss0 = status_mb("VmRSS")
start = time.perf_counter()
checks = verify.check({artifact!r}, {mode!r}, prunes={prunes!r})
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "peak_mb": status_mb("VmHWM") - rss0, "checks": sorted(checks)}}))
"""


def measure(artifact: Path, mode: str) -> dict:
    prunes = "sparse" in artifact.name  # as quantize decides it: the recipe prunes
    code = CHILD.format(root=str(ROOT), artifact=str(artifact), mode=mode, prunes=prunes)
    proc = subprocess.run([sys.executable, "-c", code],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build_llama(billions: float, out_root: Path) -> Path:
    artifact = out_root / "artifacts" / "random-llama" / "w4a16_rtn"
    if (artifact / "manifest.json").is_file():
        return artifact
    """A random Llama of about `billions` parameters (TinyLlama-1.1B's shape, layers
    scaled), with the default model's tokenizer, quantized W4A16 RTN without a check."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from quantize.common.assets import SMOLLM2_DIR, ensure_default_model
    ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_DIR, trust_remote_code=False)
    layers = max(1, round(22 * billions / 1.1))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=2048, intermediate_size=5632,
                         num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4,
                         max_position_embeddings=2048, tie_word_embeddings=False, dtype="bfloat16")
    model_dir = out_root / "random-llama"
    with torch.device("cpu"):
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    subprocess.run([sys.executable, "-m", "quantize", "recipe=w4a16_rtn", f"model={model_dir}", "verify=false",
                    f"artifacts_dir={out_root / 'artifacts'}", "calibration.num_samples=4"],
                   check=True, cwd=ROOT, capture_output=True)
    return out_root / "artifacts" / "random-llama" / "w4a16_rtn"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", nargs="*", type=Path, default=None,
                        help="artifact dirs (default: every artifact of the default model under artifacts/)")
    parser.add_argument("--repeats", type=int, default=3, help="subprocess runs per (artifact, mode)")
    parser.add_argument("--build-llama", type=float, default=0, metavar="BILLIONS",
                        help="also build and check a random Llama of about this many parameters")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keep the random Llama here, built once (default: a temp dir, removed)")
    args = parser.parse_args()
    artifacts = args.artifacts if args.artifacts is not None else sorted(
        p.parent for p in (ROOT / "artifacts" / "smollm2-135m-instruct").glob("*/manifest.json"))
    print(f"host: {machine.detect().describe()}; {os.cpu_count()} cores; 1-minute load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="qb-verify-") as tmp:
        if args.build_llama:
            artifacts = [*artifacts, build_llama(args.build_llama, args.work_dir or Path(tmp))]
        print("| artifact | weights (MB) | mode | check (s), median | peak memory above imports (MB) | checks |")
        print("|---|---|---|---|---|---|")
        for artifact in artifacts:
            size = sum(p.stat().st_size for p in artifact.glob("*.safetensors")) / 1e6
            for mode in MODES:
                runs = [measure(artifact, mode) for _ in range(args.repeats)]
                ok = [r for r in runs if "error" in r] or runs
                if "error" in ok[0]:
                    print(f"| {artifact.name} | {size:.0f} | {mode} | failed: {ok[0]['error'][:120]} | | |")
                    continue
                print(f"| {artifact.parent.name}/{artifact.name} | {size:.0f} | {mode} | "
                      f"{statistics.median(r['seconds'] for r in runs):.2f} | "
                      f"{statistics.median(r['peak_mb'] for r in runs):.0f} | {', '.join(runs[0]['checks'])} |")
    print(f"1-minute load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
