"""Accuracy benchmark: prints numbers, asserts nothing.

Measures accuracy (no speed scenarios) of every recipe's artifact of one model
through `python -m evaluate` (rows already in the results store are reused:
they are keyed by artifact id), then prints perplexity, KL, top-1 agreement
and last-word accuracy of `original` vs every recipe (one line per artifact
and setup, grouped as the report groups them), and checks the int4
target: at W4 group 64, GPTQ and AWQ should beat round-to-nearest on
perplexity and KL.

    .venv/bin/python scripts/bench_accuracy.py --recipes original w4a16_rtn w4a16_gptq w4a16_awq
    .venv/bin/python scripts/bench_accuracy.py --lm-eval austen_lastword   # lm-eval rows too
"""
import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluate import results  # noqa: E402
from evaluate.analysis.groups import Group, aggregate, same_setup  # noqa: E402
from evaluate.report.labels import labels  # noqa: E402
from evaluate.report.formatting import MISSING, fmt_number, short  # noqa: E402

W4_BASELINE, W4_CALIBRATED = "w4a16_rtn", ("w4a16_gptq", "w4a16_awq")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipes", nargs="+",
                        default=["original", "w8a8_smooth_ptq", W4_BASELINE, *W4_CALIBRATED])
    parser.add_argument("--model", default="smollm2_135m", help="model preset (conf/model/)")
    parser.add_argument("--results-dir", default=str(ROOT / "results"))
    parser.add_argument("--lm-eval", default=None, help="also run this lm_eval preset, e.g. austen_lastword")


def measure(args) -> None:
    cmd = [sys.executable, "-m", "evaluate", "-m", f"recipe={','.join(args.recipes)}", f"model={args.model}",
           "scenario=none", f"results_dir={args.results_dir}"]
    if args.lm_eval:
        cmd.append(f"lm_eval={args.lm_eval}")
    # A missing artifact is a failed job, reported below; the others still run.
    subprocess.run(cmd, cwd=ROOT)


def print_accuracy(groups: list[Group], recipes: list[str]) -> None:
    """One line per artifact and setup (the report's groups), labelled as in the report."""
    names = labels(groups)
    print(f"\n{'recipe':26} {'artifact':9} {'ppl':>8} {'recovery %':>11} {'KL (nats)':>10} {'top-1':>7} "
          f"{'last-word':>10} {'tokens':>7}")
    for recipe in recipes:
        mine = [g for g in groups if g.recipe == recipe]
        if not mine:
            print(f"{recipe:26} (no accuracy row: quantize it first, `python -m quantize recipe={recipe}`)")
        for g in mine:
            print(f"{names[g.identity]:26} {short(g.artifact_id):9} {cell(g, 'perplexity', '8.3f')} "
                  f"{cell(g, 'recovery_pct', '11.2f')} {cell(g, 'kl_divergence', '10.4f')} "
                  f"{cell(g, 'top1_agreement', '7.3f')} {cell(g, 'lastword_accuracy', '10.3f')} "
                  f"{cell(g, 'scored_tokens', '7.0f')}")
    if groups:
        print(f"reference (transformers, unquantized): perplexity {cell(groups[0], 'reference_perplexity', '.3f')}, "
              f"last-word {cell(groups[0], 'reference_lastword_accuracy', '.3f')}")


def cell(g: Group, metric: str, spec: str) -> str:
    """g's mean of `metric` in `spec`, or MISSING padded to the same width."""
    mean = g.mean(metric)
    return format(mean, spec) if mean is not None else format(MISSING, f">{spec.split('.')[0]}")


def print_w4_target(groups: list[Group]) -> None:
    """Each calibrated W4 artifact against RTN of its model, eval set and setup."""
    print(f"\n== W4 group 64: calibrated methods vs {W4_BASELINE} (lower perplexity and KL is better) ==")
    for recipe in W4_CALIBRATED:
        mine = [g for g in groups if g.recipe == recipe]
        if not mine:
            print(f"{recipe:12} no row")
        for g in mine:
            rtn = same_setup([r for r in groups if r.recipe == W4_BASELINE and r.model_name == g.model_name
                              and r.scenario == g.scenario], g)
            print(f"{recipe:12} " + (w4_verdict(g, rtn) if rtn else f"no {W4_BASELINE} row in its setup"))


def w4_verdict(g: Group, rtn: Group) -> str:
    means = [x.mean(k) for k in ("perplexity", "kl_divergence") for x in (g, rtn)]
    beats = None not in means and means[0] < means[1] and means[2] < means[3]
    return (f"perplexity {cell(g, 'perplexity', '.3f')} vs {cell(rtn, 'perplexity', '.3f')}, "
            f"KL {cell(g, 'kl_divergence', '.4f')} vs {cell(rtn, 'kl_divergence', '.4f')}: "
            f"{'beats' if beats else 'does NOT beat'} RTN")


def print_lm_eval(groups: list[Group], recipes: list[str]) -> None:
    if not groups:
        return
    print("\n== lm-eval ==")
    names = labels(groups)
    order = {r: i for i, r in enumerate(recipes)}
    for g in sorted(groups, key=lambda g: (g.scenario.name, order.get(g.recipe, len(order)))):
        metrics = ", ".join(f"{k} {fmt_number(g.mean(k))}" for k in g.stats if "stderr" not in k)
        print(f"{g.scenario.name:32} {names[g.identity]:26} {metrics}")


def main(args: argparse.Namespace) -> None:
    measure(args)
    rows = [r for r in results.read(Path(args.results_dir)) if r.recipe in args.recipes]
    accuracy = aggregate(rows, "accuracy")
    print_accuracy(accuracy, args.recipes)
    print_w4_target(accuracy)
    print_lm_eval(aggregate(rows, "lm_eval"), args.recipes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    main(parser.parse_args())
