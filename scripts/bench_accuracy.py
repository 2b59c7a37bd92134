"""Accuracy benchmark: prints numbers, asserts nothing.

Measures accuracy (no speed scenarios) of every recipe's artifact of one model
through `python -m evaluate` (rows already in the results store are reused:
they are keyed by artifact id), then prints perplexity, KL, top-1 agreement
and last-word accuracy of `original` vs every recipe, and checks the int4
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


def latest_ok(rows: list[dict], kind: str) -> dict[tuple, dict]:
    out = {}
    for r in sorted(rows, key=lambda r: r.get("timestamp", "")):
        if r.get("kind") == kind and r.get("status") == "ok":
            out[(r["recipe"], r["scenario"])] = r
    return out


def print_accuracy(acc: dict, recipes: list[str]) -> None:
    print(f"\n{'recipe':26} {'artifact':9} {'ppl':>8} {'recovery %':>11} {'KL (nats)':>10} {'top-1':>7} "
          f"{'last-word':>10} {'tokens':>7}")
    for recipe in recipes:
        row = next((r for (rec, _), r in acc.items() if rec == recipe), None)
        if row is None:
            print(f"{recipe:26} (no accuracy row: quantize it first, `python -m quantize recipe={recipe}`)")
            continue
        m = row["metrics"]
        print(f"{recipe:26} {row['artifact_id'][:8]:9} {m['perplexity']:8.3f} {m['recovery_pct']:11.2f} "
              f"{m['kl_divergence']:10.4f} {m['top1_agreement']:7.3f} {m['lastword_accuracy']:10.3f} "
              f"{m['scored_tokens']:7d}")
    ref = next(iter(acc.values()), None)
    if ref:
        print(f"reference (transformers, unquantized): perplexity {ref['metrics']['reference_perplexity']:.3f}, "
              f"last-word {ref['metrics']['reference_lastword_accuracy']:.3f}")


def print_w4_target(acc: dict) -> None:
    by_recipe = {rec: r["metrics"] for (rec, _), r in acc.items()}
    rtn = by_recipe.get(W4_BASELINE)
    print(f"\n== W4 group 64: calibrated methods vs {W4_BASELINE} (lower perplexity and KL is better) ==")
    if not rtn:
        print(f"no {W4_BASELINE} row")
        return
    for recipe in W4_CALIBRATED:
        m = by_recipe.get(recipe)
        if not m:
            print(f"{recipe:12} no row")
            continue
        beats = m["perplexity"] < rtn["perplexity"] and m["kl_divergence"] < rtn["kl_divergence"]
        print(f"{recipe:12} perplexity {m['perplexity']:.3f} vs {rtn['perplexity']:.3f}, KL {m['kl_divergence']:.4f} "
              f"vs {rtn['kl_divergence']:.4f}: {'beats' if beats else 'does NOT beat'} RTN")


def print_lm_eval(lm: dict, recipes: list[str]) -> None:
    if not lm:
        return
    print("\n== lm-eval ==")
    for (recipe, scenario), row in sorted(lm.items(), key=lambda kv: (kv[0][1], recipes.index(kv[0][0])
                                                                       if kv[0][0] in recipes else 99)):
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in row["metrics"].items() if "stderr" not in k)
        print(f"{scenario:32} {recipe:26} {metrics}")


def main(args: argparse.Namespace) -> None:
    measure(args)
    rows = [r for r in results.read(Path(args.results_dir)) if r.get("recipe") in args.recipes]
    print_accuracy(latest_ok(rows, "accuracy"), args.recipes)
    print_w4_target(latest_ok(rows, "accuracy"))
    print_lm_eval(latest_ok(rows, "lm_eval"), args.recipes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    main(parser.parse_args())
