"""Harness overhead inside one engine instance: prints numbers, asserts nothing.

quantbench times every token as vLLM streams it. Does that cost throughput?
In one vLLM engine, this alternates, run by run, quantbench's streamed path
with vLLM's plain final-only generation of the same prompts (prefix caching
off, so the second of a pair is not served from cache; who goes first
alternates). It prints the paired ratio of output throughput, streamed ÷
plain: its mean with the t interval, and its median with the
distribution-free interval of order statistics, which one pair disturbed by
the host (a hiccup of another process) cannot widen. Pairing inside one engine removes the
engine-instance noise (10–25% between instances on a small VM) that leaves
the cross-check against `vllm bench latency` (bench_evaluate.py) undecided.
Target: the interval lies within [0.98, 1.02].

On a shared machine the wall-clock ratio can stay wide. What streaming costs
is front-end work: this process's CPU time (time.process_time: the asyncio
loop, vLLM's output handling and detokenizer, quantbench's timestamping),
which other processes' load does not inflate. Per pair it is printed per
output token for both paths, with the paired difference and what that
difference is as a share of the streamed run's time per output token.

    .venv/bin/python scripts/bench_harness_overhead.py [--model DIR] [--scenarios interactive medium_batch] [--pairs 20]
        [--json pairs.json]
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluate import engines, scenarios  # noqa: E402
from evaluate.target import Target, from_path  # noqa: E402
from evaluate.metrics import mean_interval, median_interval, summarize  # noqa: E402
from evaluate.batch import prompts  # noqa: E402
from quantize.common.assets import SMOLLM2_DIR  # noqa: E402


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=str(SMOLLM2_DIR), help="artifact or checkpoint dir")
    parser.add_argument("--scenarios", nargs="+", default=["interactive", "medium_batch"])
    parser.add_argument("--pairs", type=int, default=20, help="(streamed, plain) pairs per scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write every pair's ratio and tok/s here")


def engine_for(model: Path, wanted) -> tuple[Target, engines.Engine]:
    """The vLLM engine as `python -m evaluate` configures it by default (conf/engine/vllm.yaml)
    for the `wanted` scenarios, prefix caching off."""
    conf = engines.config("vllm")
    cls = engines.get(conf)
    target = from_path(model)
    args = {**conf["args"], "enable_prefix_caching": False}
    args["dtype"] = cls.choose_dtype(target.format, cls.machine(), args)
    env = cls.sized_env(conf["env"], target, args, max(s.kv_tokens for s in wanted))
    return target, cls(target, args, env, max_model_len=max(s.max_len for s in wanted))


def main(args: argparse.Namespace) -> None:
    wanted = [scenarios.load(n) for n in args.scenarios]
    target, engine = engine_for(Path(args.model), wanted)
    vocab = int(target.config.get("vocab_size") or 10000)
    setup = engine.describe()
    print(f"model {target.path}; engine args {setup['engine_args']}; env {setup['engine_env']}")
    print(f"host: {engine.machine().describe()}; 1-minute load average {os.getloadavg()[0]:.2f}")
    dump = {}
    try:
        for s in wanted:
            engine.run(prompts(s, args.seed, -1, vocab), s.output_len)  # warm-up
            ratios, tok_s = [], {True: [], False: []}
            cpu_us, extra_share = {True: [], False: []}, []  # front-end CPU µs per output token
            tokens = s.batch_size * s.output_len
            for i in range(args.pairs):
                batch = prompts(s, args.seed, i, vocab)
                pair, wall = {}, {}
                for stream in ((True, False) if i % 2 == 0 else (False, True)):
                    cpu0 = time.process_time()
                    start, timings = engine.run(batch, s.output_len, stream=stream)
                    cpu_us[stream].append((time.process_time() - cpu0) / tokens * 1e6)
                    m = summarize(timings, start, target.model_bytes)
                    pair[stream], wall[stream] = m["output_throughput"], m["latency_s"]
                    tok_s[stream].append(pair[stream])
                ratios.append(pair[True] / pair[False])
                extra_share.append((cpu_us[True][-1] - cpu_us[False][-1]) / 1e6 * tokens / wall[True])
            mean, lo, hi = mean_interval(ratios)
            print(f"{s.name} (bs {s.batch_size}, {s.input_len} in / {s.output_len} out), {args.pairs} pairs: "
                  f"streamed {mean_interval(tok_s[True])[0]:.1f} tok/s, plain {mean_interval(tok_s[False])[0]:.1f} "
                  f"tok/s; paired ratio (streamed / plain): mean {mean:.4f}, 95% interval [{lo:.4f}, {hi:.4f}]: "
                  f"{verdict(lo, hi)}")
            median = median_interval(ratios)
            if median:
                print(f"  median {median[0]:.4f}, distribution-free 95% interval [{median[1]:.4f}, {median[2]:.4f}]: "
                      f"{verdict(*median[1:])}; per-pair spread (SD) {100 * statistics.stdev(ratios):.1f}%")
            dump[s.name] = {"ratios": ratios, "tok_s_streamed": tok_s[True], "tok_s_plain": tok_s[False]}
            diff = [a - b for a, b in zip(cpu_us[True], cpu_us[False])]
            d_mean, d_lo, d_hi = mean_interval(diff)
            share, s_lo, s_hi = mean_interval(extra_share)
            print(f"  front-end CPU per output token: streamed {mean_interval(cpu_us[True])[0]:.0f} µs, plain "
                  f"{mean_interval(cpu_us[False])[0]:.0f} µs; streaming adds {d_mean:.0f} µs [{d_lo:.0f}, {d_hi:.0f}], "
                  f"{100 * share:.2f}% [{100 * s_lo:.2f}, {100 * s_hi:.2f}] of the streamed run's wall time")
    finally:
        engine.close()
        print(f"1-minute load average after: {os.getloadavg()[0]:.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps(dump, indent=1))


def verdict(lo: float, hi: float) -> str:
    if lo >= 0.98 and hi <= 1.02:
        return "within ±2%: no overhead this machine can resolve"
    if hi < 0.98 or lo > 1.02:
        return "streaming is slower" if hi < 0.98 else "streaming is faster"
    return "interval wider than ±2%: more pairs needed"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    main(parser.parse_args())
