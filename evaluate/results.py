"""The results store: one JSON object per line in `<results_dir>/results.jsonl`.

Every row is self-describing: which artifact (id + manifest fields), engine and
its arguments, scenario, run index, metrics with units in their names,
versions, hardware and time. Rows are appended with a single O_APPEND write,
so several processes on one machine can share a file; jobs on other nodes
write `results-<host>-<pid>.jsonl` beside it (see `shard_path`) and readers
merge every `results*.jsonl` in the directory.

Row layout (flat keys are what reports group and sort by):

    schema            1
    kind              "speed" | "accuracy"
    status            "ok" | "skipped" | "failed"   (+ "reason" when not ok)
    timestamp         ISO 8601, UTC
    artifact_id       manifest artifact id, or a hash of the files for plain checkpoints
    artifact_path     absolute path that was served
    model_name        base model name
    recipe            recipe name ("original" for the baseline; "external" when unknown)
    quant_format      compressed-tensors format, e.g. "int-quantized", "dense"
    model_bytes       bytes of weight files on disk
    engine            "vllm" | "hf"
    engine_args       dict passed to the engine
    engine_env        thread/kv-cache environment that changes speed
    scenario          scenario name, plus batch_size / input_len / output_len
    run_index         0-based timed run index (warm-up is not recorded)
    metrics           dict: latency_s, output_throughput (tok/s), total_token_throughput
                      (tok/s), input_throughput (tok/s), ttft_ms_{mean,p50,p90,p99},
                      tpot_ms_{...}, itl_ms_{...}, peak_memory_bytes,
                      weight_bandwidth_gb_s  (speed rows); accuracy rows hold their own
    versions, hardware   as in the artifact manifest
"""
import json
import os
import socket
from pathlib import Path

from quantize.atomic import append_line

SCHEMA = 1
RESULTS_FILE = "results.jsonl"


def shard_path(results_dir: Path, shard: bool = False) -> Path:
    """The file this process appends to; `shard=True` gives a per-process file
    for filesystems where O_APPEND is not atomic across hosts (NFS)."""
    name = f"results-{socket.gethostname()}-{os.getpid()}.jsonl" if shard else RESULTS_FILE
    return Path(results_dir) / name


def append(path: Path, row: dict) -> None:
    row = {"schema": SCHEMA, **row}
    append_line(path, json.dumps(row, sort_keys=True, default=str))


def read(results_dir: Path) -> list[dict]:
    """All rows from every results*.jsonl in the directory; a torn last line
    (writer killed mid-write) is skipped, never half-parsed."""
    rows = []
    for path in sorted(Path(results_dir).glob("results*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def run_key(row: dict) -> tuple:
    """Identity of one measured run: rerunning a sweep skips keys already ok."""
    return (row.get("kind"), row.get("artifact_id"), row.get("engine"), row.get("scenario"),
            row.get("batch_size"), row.get("input_len"), row.get("output_len"), row.get("run_index"))


def completed_keys(results_dir: Path) -> set[tuple]:
    return {run_key(r) for r in read(results_dir) if r.get("status") == "ok"}
