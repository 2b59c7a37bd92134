"""runs=auto on this host: prints numbers, asserts nothing.

Runs `python -m evaluate runs=auto` (default: the `original` artifact of the
default model, scenario `interactive`, accuracy off) into a fresh results dir
and prints, per scenario, how many timed runs the rule took, the 95% interval
it achieved, why it stopped, the warm-up count when `--warmup auto`, and the
interval the same rows would have given after 3 runs (today's `runs=3`).

    .venv/bin/python scripts/bench_adaptive_runs.py [--recipe original] [--scenario interactive]
        [--target 5] [--min-runs 3] [--max-runs 10] [--warmup 1|auto] [--out DIR] [overrides ...]
"""
import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluate import results  # noqa: E402
from evaluate.precision import HEADLINE, ci_pct  # noqa: E402
from evaluate.analysis.groups import aggregate  # noqa: E402


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", default="original")
    parser.add_argument("--scenario", default="interactive", help="scenario or set")
    parser.add_argument("--target", type=float, default=None, help="target_ci_pct (default: conf/evaluate.yaml)")
    parser.add_argument("--min-runs", type=int, default=None)
    parser.add_argument("--max-runs", type=int, default=None)
    parser.add_argument("--warmup", default="1", help="warmup_runs: a count or auto")
    parser.add_argument("--out", default=None, help="results dir (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="more python -m evaluate key=value overrides")


def cpu_kind() -> str:
    text = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    avx512 = sorted(set(re.findall(r"\bavx512[a-z_0-9]*", text)))
    return f"{model}; {'AVX-512: ' + ' '.join(avx512) if avx512 else 'no AVX-512 (AVX2 at most)'}"


def main(args: argparse.Namespace) -> None:
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_adaptive_"))
    settings = {"target_ci_pct": args.target, "min_runs": args.min_runs, "max_runs": args.max_runs}
    cmd = [sys.executable, "-m", "evaluate", f"recipe={args.recipe}", f"scenario={args.scenario}", "accuracy=none",
           "runs=auto", f"warmup_runs={args.warmup}", f"results_dir={out}",
           *(f"{k}={v}" for k, v in settings.items() if v is not None), *args.overrides]
    print(f"host: {cpu_kind()}")
    print("command:", " ".join(cmd[1:]))
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    wall = time.perf_counter() - t0
    print(f"\n== runs=auto: {wall:.0f} s wall time, engine start-up included; results in {out} ==")
    for g in aggregate(results.read(out), "speed"):
        values = [r.metrics[HEADLINE] for r in g.runs]
        p = g.precision or {}
        at3 = ci_pct(values[:3])
        print(f"{g.scenario.heading()} [{g.recipe}]")
        print(f"  runs           : {len(values)} (min {p.get('min_runs')}, max {p.get('max_runs')}): {p.get('stopped')}")
        print(f"  achieved 95% CI: ±{p.get('achieved_ci_pct')} % of the mean (target ±{p.get('target_ci_pct')} %)")
        print(f"  after 3 runs   : ±{at3:.2f} % (what runs=3 gives)" if at3 is not None else "  after 3 runs   : —")
        print(f"  output tok/s   : {statistics.mean(values):.1f} mean; per run "
              + ", ".join(f"{v:.1f}" for v in values))
        if p.get("warmup_runs") is not None:
            print(f"  warm-up runs   : {p['warmup_runs']} (auto)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    main(parser.parse_args())
