#!/usr/bin/env python
"""Time the quantize stage per recipe on the default model.

For each recipe, run `python -m quantize recipe=<r> artifacts_dir=<dir> force=true`
in a subprocess (so every run pays the same start-up and nothing is cached in
memory), then read the artifact's manifest and print one table row: wall time
of the whole command, the pipeline's own phase timings, artifact size,
quantization format and the 2:4 sparsity check.

    python scripts/bench_quantize.py                        # every shipped recipe
    python scripts/bench_quantize.py --recipes original w4a16_rtn
    python scripts/bench_quantize.py --num-samples 16 --max-seq-len 256 -- model=/path/to/ckpt
"""
import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Short column names for the pipeline's phases (manifest `timings_s` keys, the
# names of quantize/pipeline.py's `timer.phase(...)`), in the order it runs
# them. A key is a prefix of the phase name: the oneshot phase names the dtype
# it calibrates in ("oneshot (calibrate + quantize in float32)"), and recipes
# of both dtypes share one column. A phase no prefix matches gets its own name.
PHASE_LABELS = {
    "load tokenizer and calibration": "calib (s)",
    "load model": "load (s)",
    "oneshot": "oneshot (s)",
    "save": "save (s)",
    "verify": "verify (s)",
}


def phase_column(name: str) -> str:
    """The table column of a pipeline phase (see PHASE_LABELS)."""
    return next((p for p in PHASE_LABELS if name == p or name.startswith(p + " ")), name)


def shipped_recipes() -> list[str]:
    """Every `recipe=<name>` option, as the quantize CLI finds them."""
    from quantize.common.recipe_choices import available
    return [choice.name for choice in available()]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipes", nargs="+", default=None, metavar="RECIPE",
                        help="recipe names or recipe YAML paths (default: every shipped recipe)")
    parser.add_argument("--artifacts-dir", type=Path, default=Path("artifacts"),
                        help="where artifacts are (re)built (default: artifacts/)")
    parser.add_argument("--num-samples", type=int, default=None,
                        help="calibration windows (default: the calibration preset's, 64)")
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="tokens per calibration window (default: the preset's, 512)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="per-recipe quantize logs (default: logs/bench_quantize/<timestamp>/)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    parser.add_argument("overrides", nargs="*",
                        help="extra Hydra overrides passed to every run, e.g. model=<dir> (after --)")


def artifact_dir_for(overrides: list[str]) -> Path:
    """Where quantize will write, composed by Hydra exactly as the CLI does."""
    from hydra import compose, initialize_config_dir

    from quantize.common.config import expand_path_shorthands, register
    from quantize.common.paths import CONF_DIR, resolve
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="quantize", overrides=expand_path_shorthands(overrides))
    return resolve(cfg.artifact_dir)


def run_one(recipe: str, args, log_dir: Path) -> dict:
    overrides = [f"recipe={recipe}", f"artifacts_dir={args.artifacts_dir.resolve()}", "force=true"]
    if args.num_samples is not None:
        overrides.append(f"calibration.num_samples={args.num_samples}")
    if args.max_seq_len is not None:
        overrides.append(f"calibration.max_seq_len={args.max_seq_len}")
    overrides += args.overrides
    row = {"recipe": recipe, "ok": False}
    try:
        out_dir = artifact_dir_for(overrides)
    except Exception as e:  # bad recipe name etc.: report it in the table, go on
        row["error"] = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return row
    log_path = log_dir / f"{Path(recipe).stem}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    print(f"bench: quantizing {recipe} -> {out_dir} (log: {log_path})", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, "-m", "quantize", *overrides], env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    row["wall_s"] = round(time.perf_counter() - start, 2)
    row["log"] = str(log_path)
    from quantize.common import manifest
    m = manifest.read(out_dir) if proc.returncode == 0 else None
    if m is None:
        lines = [l for l in log_path.read_text().splitlines() if l.strip()]
        row["error"] = f"exit {proc.returncode}: {lines[-1][:200] if lines else ''}"
        return row
    timings: dict[str, float] = {}
    for name, seconds in m.timings_s.items():
        column = "total" if name == "total" else phase_column(name)
        timings[column] = timings.get(column, 0) + seconds
    row.update({
        "ok": True,
        "artifact_dir": str(out_dir),
        "artifact_id": m.artifact_id,
        "timings_s": timings,
        "size_mb": round(m.bytes_on_disk["total"] / 1e6, 1),
        "weights_mb": round(m.bytes_on_disk["weights"] / 1e6, 1),
        "format": m.quant_format,
        "calibration_dtype": m.calibration_dtype,
        "sparsity": m.sparsity,
        "calibration": m.calibration,
    })
    return row


def sparsity_cell(report: dict | None) -> str:
    if not report:
        return "-"
    state = "ok" if report["all_layers_hold_pattern"] else f"BROKEN in {len(report['layers_breaking_pattern'])} layers"
    return f"{report['pattern']} {state}, {100 * report['measured_sparsity']:.1f}% zeros"


def table(rows: list[dict]) -> str:
    seen = {k for row in rows for k in row.get("timings_s", {}) if k != "total"}
    # Pipeline order for the known phases, then any others by name.
    phases = [p for p in PHASE_LABELS if p in seen] + sorted(seen - set(PHASE_LABELS))
    header = (["recipe", "wall (s)", "quantize (s)"] + [PHASE_LABELS.get(p, f"{p} (s)") for p in phases]
              + ["size (MB)", "weights (MB)", "calib dtype", "format", "2:4 check"])
    body = []
    for row in rows:
        if not row["ok"]:
            body.append([row["recipe"], f"{row['wall_s']:.1f}" if "wall_s" in row else "-", "FAILED",
                         *[""] * len(phases), "", "", "", "", row.get("error", "")])
            continue
        t = row["timings_s"]
        body.append([row["recipe"], f"{row['wall_s']:.1f}", f"{t['total']:.1f}",
                     *[f"{t[p]:.1f}" if p in t else "-" for p in phases],
                     f"{row['size_mb']:.1f}", f"{row['weights_mb']:.1f}", row["calibration_dtype"] or "-",
                     row["format"], sparsity_cell(row["sparsity"])])
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    numeric = set(range(1, len(header) - 3))

    def fmt(r):
        return "| " + " | ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                                 for i, (c, w) in enumerate(zip(r, widths))) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(header), rule, *map(fmt, body)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    args = parser.parse_args(argv)
    recipes = args.recipes or shipped_recipes()
    log_dir = args.log_dir or ROOT / "logs" / "bench_quantize" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    rows = [run_one(r, args, log_dir) for r in recipes]

    from quantize.common.provenance import hardware, versions
    hw, v = hardware(), versions()
    calib = next((r["calibration"] for r in rows if r.get("calibration")), None)
    print(f"\nquantize benchmark: {len(rows)} recipe(s), force=true, one subprocess each")
    print(f"machine: {hw['cpu']}, {hw['cpu_affinity']} usable cores, {hw['memory_gib']} GiB RAM, "
          f"accelerators: {', '.join(hw['accelerators']) or 'none'}")
    print(f"versions: llmcompressor {v.get('llmcompressor')}, compressed-tensors {v.get('compressed-tensors')}, "
          f"transformers {v.get('transformers')}, torch {v.get('torch')}")
    if calib:
        print(f"calibration: {calib['name']}, {calib['num_samples']} samples x {calib['max_seq_len']} tokens "
              f"= {calib['num_tokens']} tokens")
    print("wall = whole `python -m quantize` command (incl. Python start-up and imports); "
          "quantize = sum of the pipeline phases in the manifest; MB = 10^6 bytes\n")
    print(table(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    failed = [r["recipe"] for r in rows if not r["ok"]]
    if failed:
        print(f"\n{len(failed)} recipe(s) failed: {', '.join(failed)} (see logs in {log_dir})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
