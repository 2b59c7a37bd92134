"""The device check's summary, as Markdown: the step table (step, exit code,
wall seconds, peak GPU memory), the tests that failed, vLLM's numbers (from the
report's summary.csv: output tok/s and speed-ups with 95 % intervals per
scenario, the batch-1 decode's share of the GPU's memory bandwidth, the seed
report's speed-ups beside them) and rule vs observed, then what the steps
produced: each model built, each artifact's timings and size, each result
row's speed or accuracy.

    python scripts/device/summarize.py WORK_DIR > summary.md
    python scripts/device/summarize.py --tests-note WORK_DIR/steps/tests.log   # the tests step's note

WORK_DIR is scripts/device_check.sh's work folder: steps.tsv (one row per
step: name, rc, wall_s, peak_torch_mib, peak_gpu_mib, note), steps/tests.log,
models/, artifacts/, results/, reports/summary.csv, rules.md. Only the
standard library: it must run whatever failed.
"""
import csv
import json
import re
import sys
from pathlib import Path

# Peak memory bandwidth by GPU name (NVIDIA's datasheets), the roofline of a
# batch-1 decode that reads every weight once per token. A datasheet figure,
# not a measurement; a GPU not listed gets no fraction.
HBM_PEAK_GB_S = {"H200": 4800, "H100 NVL": 3900, "H100 80GB HBM3": 3350, "H100 SXM": 3350, "H100 PCIe": 2000,
                 "A100-SXM4-80GB": 2039, "A100-SXM4-40GB": 1555, "L40S": 864}
# The seed report's speed-ups (vLLM on NVIDIA GPUs), as the GPU issue quotes them.
SEED = {("w8a8_smooth_gptq", 1): 1.45, ("w8a8_smooth_gptq", 64): 1.20}


def cell(value) -> str:
    return "-" if value in (None, "") else str(value).replace("|", "/")


def steps_table(work: Path) -> list[str]:
    lines = ["| step | rc | wall s | peak GPU MiB (torch, the step's processes) | peak GPU MiB (nvidia-smi, whole GPU) | note |",
             "|---|---|---|---|---|---|"]
    tsv = work / "steps.tsv"
    rows = [line.split("\t") for line in tsv.read_text().splitlines()[1:]] if tsv.is_file() else []
    for row in rows:
        row = (row + [""] * 6)[:6]
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return lines


def gib(n) -> str:
    return f"{n / 2**30:.2f} GiB" if isinstance(n, (int, float)) else "-"


def models(work: Path) -> list[str]:
    out = []
    for build in sorted((work / "models").glob("*.build.json")):
        d = json.loads(build.read_text())
        out.append(f"- model `{build.name.removesuffix('.build.json')}`: {d.get('shape')}-shaped, "
                   f"{d.get('params', 0) / 1e9:.2f} B params, {gib(d.get('bytes'))} bf16, drawn on {d.get('device')} "
                   f"in {d.get('init_s')} s, saved in {d.get('save_s')} s")
    return out


def artifacts(work: Path) -> list[str]:
    out = []
    for m in sorted((work / "artifacts").glob("*/*/manifest.json")):
        d = json.loads(m.read_text())
        cal = d.get("calibration")   # null: a recipe that reads no calibration data (fp8_dynamic, w4a16_rtn)
        calibrated = (f"calibration {cal.get('num_samples')}x{cal.get('max_seq_len')} tokens in "
                      f"{d.get('calibration_dtype')}" if cal else "no calibration data")
        timings = ", ".join(f"{k} {v:.1f} s" for k, v in (d.get("timings_s") or {}).items()
                            if isinstance(v, (int, float)))
        out.append(f"- artifact `{m.parent.parent.name}/{m.parent.name}`: {gib((d.get('bytes_on_disk') or {}).get('total'))}"
                   f" on disk, {calibrated}; {timings}")
    return out


def results(work: Path) -> list[str]:
    """A line per row; vLLM's ok speed rows only where the vLLM tables above do not hold them."""
    out = []
    tabled = bool(speed_groups(work))
    for store in sorted((work / "results").glob("*.jsonl")):
        for line in store.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if tabled and r.get("engine") == "vllm" and r.get("status") == "ok" and r.get("kind") == "speed":
                continue
            met = r.get("metrics") or {}
            args = r.get("engine_args") or {}
            device = args.get("device") or ((r.get("hardware") or {}).get("accelerators") or ["CPU"])[0]
            where = f"{r.get('engine')} on {device} in {args.get('dtype', '?')}"
            if r.get("status") != "ok":
                what = f"{r.get('status')}: {r.get('reason')}"
            elif r.get("kind") == "accuracy":
                what = ", ".join(f"{k} {met[k]:.4g}" for k in ("perplexity", "reference_perplexity", "kl_divergence",
                                                                "top1_agreement", "lastword_accuracy")
                                 if isinstance(met.get(k), (int, float)))
            else:
                what = ", ".join(f"{k} {met[k]:.4g}" for k in ("output_throughput", "latency_s", "ttft_ms_mean",
                                                                "peak_gpu_memory_bytes")
                                 if isinstance(met.get(k), (int, float)))
            out.append(f"- `{r.get('model_name')}/{r.get('recipe')}` {r.get('kind')} {r.get('scenario') or ''} "
                       f"run {r.get('run_index')} [{where}]: {what}"[:400])
    return out


# pytest -v's line per test: "[gw3] [ 93%] FAILED <id>" under xdist, "<id> FAILED   [ 93%]" without it.
RESULT_LINE = re.compile(r"^\[gw\d+\] \[ *\d+%\] (FAILED|ERROR) (.+?)\s*$|^(\S.*?) (FAILED|ERROR)\s+\[ *\d+%\]\s*$")


def test_failures(log_text: str) -> dict[str, str]:
    """{test id: "FAILED" or "ERROR" line} for every failure and error in a
    pytest -v log, as the run printed them: a run stopped before its short
    summary still names them; the summary's line (-ra: with its message) wins."""
    out = {}
    for line in log_text.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            kind, _, rest = line.partition(" ")
            out[rest.split(" - ", 1)[0].strip()] = line
            continue
        m = RESULT_LINE.match(line)
        if m:
            kind, test = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
            out.setdefault(test, f"{kind} {test}")
    return out


def tests_note(log_text: str) -> str:
    """The tests step's note: pytest's last line, or for a run stopped before
    it, how far it got and how many failed or errored so far."""
    last = [line for line in log_text.splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped)\b.* in [\d.]+s\b", line)]
    if last:
        return last[-1].replace("=", "").strip()
    progress = re.findall(r"\[ *(\d+)%\]", log_text)
    kinds = [line.split(" ", 1)[0] for line in test_failures(log_text).values()]
    return (f"stopped at {progress[-1] if progress else 0}% of the tests; {kinds.count('FAILED')} failed "
            f"and {kinds.count('ERROR')} errors so far")


def failed_tests(work: Path) -> list[str]:
    """Each failed or errored test of steps/tests.log, also from a stopped run."""
    log = work / "steps" / "tests.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [f"- {line[:300]}" for line in test_failures(text).values()][:60]


def speed_groups(work: Path) -> list[dict]:
    """The report's summary.csv rows served by vLLM (one per artifact x scenario)."""
    path = work / "reports" / "summary.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("engine") == "vllm"]


def result_rows(work: Path):
    """The stored result rows, a line that does not parse left out."""
    for store in sorted((work / "results").glob("*.jsonl")):
        for line in store.read_text().splitlines():
            try:
                yield json.loads(line)
            except ValueError:
                continue


def gpu_name(work: Path) -> str | None:
    return next((names[0] for row in result_rows(work)
                 if (names := (row.get("hardware") or {}).get("accelerators"))), None)


def vllm_mode(row: dict) -> str | None:
    """How vLLM ran a result row: eager, or compiled (with CUDA graphs on a GPU);
    None for a row that records no `enforce_eager` (not vLLM's)."""
    eager = (row.get("engine_args") or {}).get("enforce_eager")
    if eager is None:
        return None
    return "eager" if eager else "CUDA graphs" if (row.get("hardware") or {}).get("accelerators") else "compiled"


def vllm_modes(work: Path) -> dict[str, str]:
    """Per setup id, how vLLM ran its rows (vllm_mode)."""
    modes = {}
    for row in result_rows(work):
        if row.get("setup_id") and (mode := vllm_mode(row)):
            modes.setdefault(row["setup_id"], mode)
    return modes


def hbm_peak(name: str | None) -> float | None:
    return next((v for k, v in HBM_PEAK_GB_S.items() if name and k in name), None)


def num(value, fmt=".1f") -> str:
    try:
        return format(float(value), fmt)
    except (TypeError, ValueError):
        return "-"


def interval(r: dict, key: str, fmt: str = ".1f") -> str:
    low, high = r.get(f"{key}_ci95_low"), r.get(f"{key}_ci95_high")
    return f" [{num(low, fmt)}, {num(high, fmt)}]" if low not in (None, "") else ""


def speedup(r: dict) -> str:
    if r.get("recipe") == "original":
        return "baseline"
    if not r.get("speedup_vs_original"):
        return "-"
    return f"{num(r['speedup_vs_original'], '.2f')}x" + interval(r, "speedup", ".2f")


def vllm_tables(work: Path) -> list[str]:
    """Output tok/s and speed-ups per scenario x recipe, the roofline share of
    each batch-1 scenario, and the seed report's speed-ups beside this run's;
    one set of tables per model shape and vLLM mode (eager, CUDA graphs) where
    the run served several: a continuing call with DEVICE_CHECK_EAGER=false
    measures the same recipes and scenarios again, as another setup."""
    groups = speed_groups(work)
    if not groups:
        return []
    gpu, modes = gpu_name(work), vllm_modes(work)
    out = [f"On {gpu or 'this machine'}; mean of the timed runs, 95 % interval of the mean in brackets "
           "(the report's summary.csv)."]

    def table(r: dict) -> str:
        return ", ".join(part for part in (r.get("model_name"), modes.get(r.get("setup_id") or "")) if part)

    tables = list(dict.fromkeys(map(table, groups)))
    for name in tables:
        if len(tables) > 1:
            out += ["", f"### {name}"]
        out += model_tables([r for r in groups if table(r) == name], gpu)
    return out


def model_tables(groups: list[dict], gpu: str | None) -> list[str]:
    """vllm_tables' tables for the summary rows of one model."""
    recipes = list(dict.fromkeys(r["recipe"] for r in groups))
    scenarios = list(dict.fromkeys(r["scenario"] for r in groups))
    cell = {(r["scenario"], r["recipe"]): r for r in groups}
    shape = {r["scenario"]: f"{r['batch_size']} x {r['input_len']} -> {r['output_len']}" for r in groups}
    peak = hbm_peak(gpu)
    out = ["", "Output throughput (tok/s):", "",
           "| scenario (batch x in -> out) | " + " | ".join(recipes) + " |", "|---|" + "---|" * len(recipes)]
    for sc in scenarios:
        vals = [cell.get((sc, rc)) for rc in recipes]
        out.append(f"| {sc} ({shape[sc]}) | " + " | ".join(
            num(v["output_throughput_mean"]) + interval(v, "output_throughput") if v else "-" for v in vals) + " |")
    out += ["", "Speed-up of output throughput vs the original:", "",
            "| scenario | " + " | ".join(recipes) + " |", "|---|" + "---|" * len(recipes)]
    for sc in scenarios:
        out.append(f"| {sc} | " + " | ".join(speedup(cell[(sc, rc)]) if (sc, rc) in cell else "-"
                                             for rc in recipes) + " |")
    over = (f"the datasheet peak of {peak} GB/s" if peak else
            f"no datasheet peak known for {gpu}" if gpu else "no GPU here, so no peak")
    out += ["", f"Batch-1 decode against the memory-bandwidth roofline (weight bytes / mean time per output "
            f"token, over {over}):",
            "", "| scenario | recipe | weights (MB) | weight bandwidth (GB/s) | share of peak |", "|---|---|---|---|---|"]
    for r in groups:
        if r["batch_size"] == "1" and r.get("weight_bandwidth_gb_s_mean"):
            share = f"{100 * float(r['weight_bandwidth_gb_s_mean']) / peak:.0f} %" if peak else "-"
            out.append(f"| {r['scenario']} | {r['recipe']} | {num(r.get('model_size_mb'))} | "
                       f"{num(r['weight_bandwidth_gb_s_mean'])} | {share} |")
    out += ["", "Beside the seed report (vLLM on NVIDIA GPUs):", "",
            "| recipe | batch | seed report | this run (scenario: speed-up) |", "|---|---|---|---|"]
    for (recipe, batch), seed in SEED.items():
        here = "; ".join(f"{r['scenario']}: {speedup(r)}" for r in groups
                         if r["recipe"] == recipe and r["batch_size"] == str(batch)) or "not measured"
        out.append(f"| {recipe} | {batch} | {seed:.2f}x | {here} |")
    return out


def rules(work: Path) -> list[str]:
    path = work / "rules.md"
    return path.read_text().splitlines() if path.is_file() else []


def main(work: Path) -> None:
    print("## Steps\n")
    print("\n".join(steps_table(work)))
    for title, lines in (("Failed tests", failed_tests(work)), ("vLLM", vllm_tables(work)),
                         ("Rule vs observed", rules(work)), ("Models", models(work)),
                         ("Artifacts", artifacts(work)), ("Result rows", results(work))):
        if lines:
            print(f"\n## {title}\n")
            print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tests-note"]:   # device_check.sh: the tests step's note, from its log
        print(tests_note(Path(sys.argv[2]).read_text(errors="replace") if Path(sys.argv[2]).is_file() else ""))
    else:
        main(Path(sys.argv[1]))
