"""The device check's summary, as Markdown: the step table (step, exit code,
wall seconds, peak GPU memory), the tests that failed, then what the steps
produced: each model built, each artifact's timings and size, each result
row's speed or accuracy.

    python scripts/device/summarize.py WORK_DIR > summary.md
    python scripts/device/summarize.py --tests-note WORK_DIR/steps/tests.log   # the tests step's note

WORK_DIR is scripts/device_check.sh's work folder: steps.tsv (one row per
step: name, rc, wall_s, peak_torch_mib, peak_gpu_mib, note), steps/tests.log,
models/, artifacts/, results/. Only the standard library: it must run whatever failed.
"""
import json
import re
import sys
from pathlib import Path


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
        cal = d.get("calibration") or {}
        timings = ", ".join(f"{k} {v:.1f} s" for k, v in (d.get("timings_s") or {}).items()
                            if isinstance(v, (int, float)))
        out.append(f"- artifact `{m.parent.parent.name}/{m.parent.name}`: {gib((d.get('bytes_on_disk') or {}).get('total'))}"
                   f" on disk, calibration {cal.get('num_samples')}x{cal.get('max_seq_len')} tokens in "
                   f"{d.get('calibration_dtype')}; {timings}")
    return out


def results(work: Path) -> list[str]:
    out = []
    for store in sorted((work / "results").glob("*.jsonl")):
        for line in store.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            met = r.get("metrics") or {}
            args = r.get("engine_args") or {}
            where = f"{r.get('engine')} on {args.get('device', '?')} in {args.get('dtype', '?')}"
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


def main(work: Path) -> None:
    print("## Steps\n")
    print("\n".join(steps_table(work)))
    for title, lines in (("Failed tests", failed_tests(work)), ("Models", models(work)),
                         ("Artifacts", artifacts(work)), ("Result rows", results(work))):
        if lines:
            print(f"\n## {title}\n")
            print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tests-note"]:   # device_check.sh: the tests step's note, from its log
        print(tests_note(Path(sys.argv[2]).read_text(errors="replace") if Path(sys.argv[2]).is_file() else ""))
    else:
        main(Path(sys.argv[1]))
