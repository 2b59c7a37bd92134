"""The results store: one JSON object per line in `<results_dir>/results.jsonl`.

Every row is a `Row`: which artifact (id + manifest fields), engine and its
arguments, scenario, run index, metrics with units in their names, versions,
hardware and time. Rows are appended with a single O_APPEND write, so several
processes on one machine can share a file (a last line without its newline is
mended first: quantize.common.atomic.append_line); jobs on other nodes write
`results-<host>-<pid>.jsonl` beside it (see `shard_path`) and readers merge
every `results*.jsonl` in the directory. `Row.from_dict` reads every row ever
written (keys it does not know are kept in `extra` and written back); lines
that are not rows are left out, by file and line number (`read_store`).
`read_stores` reads several stores side by side (the report's `results_dir=a,b`).
"""
import dataclasses
import errno
import json
import logging
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from evaluate import store_lock
from evaluate.row_validity import why_rejected
from evaluate.serving.slo import judged_by as slo_judged_by
from quantize.common.atomic import TORN_MARK, append_line
from quantize.common.errors import UserError
from quantize.common.provenance import setup_versions, sha256_json

log = logging.getLogger("quantbench.results")

SCHEMA = 1
RESULTS_FILE = "results.jsonl"
Kind = Literal["speed", "accuracy", "lm_eval", "serving"]
Status = Literal["ok", "skipped", "failed", "unsupported"]
KINDS, STATUSES = get_args(Kind), get_args(Status)


@dataclass(frozen=True)
class Store:
    """The results store a row was read from, when a report reads several."""
    path: Path
    name: str   # the shortest tail of `path` that no other store read shares, e.g. `b` or `run1/results`


@dataclass
class Row:
    """One measurement (or why there is none). Flat fields are what reports
    group and sort by; metrics carry their unit in their name."""
    kind: Kind
    status: Status | None = None       # set when recorded; + `reason` when not "ok"
    reason: str | None = None
    timestamp: str | None = None       # ISO 8601, UTC
    schema: int = SCHEMA
    # the artifact (evaluate.target.Target.as_row)
    artifact_id: str | None = None     # manifest artifact id, or a plain checkpoint's (weights and config.json)
    artifact_path: str | None = None
    model_name: str | None = None
    recipe: str | None = None          # "original" for the baseline, "external" for a foreign checkpoint
    quant_format: str | None = None    # compressed-tensors format, e.g. "int-quantized", "dense"
    model_bytes: int | None = None     # bytes of weight files on disk
    manifest: dict | None = None       # the manifest fields a row repeats (Manifest.row_fields)
    # the setup: engine, its args/env as run (dtype resolved), libraries, machine
    engine: str | None = None
    engine_args: dict = field(default_factory=dict)
    engine_env: dict = field(default_factory=dict)
    engine_version: str | None = None
    engine_startup_s: float | None = None
    # where start-up went, in seconds per phase, where the engine says (e.g.
    # {"load_s", "compile_s", "kv_cache_s", "warmup_s"}); engine_startup_s is the total
    engine_startup: dict | None = None
    # torch's compile-cache lookups during that start-up, where the engine says
    # ({"fx_graph_hits", "fx_graph_misses", "aot_autograd_hits", ...}): a miss compiled a graph
    engine_compile_cache: dict | None = None
    # memory the engine reserved, in bytes, where it says: {"weights_bytes",
    # "kv_cache_bytes"} (a key is absent when the engine does not report it)
    engine_memory: dict | None = None
    machine: dict | None = None        # capability facts the engine decided from (quantize.common.machine)
    kv_quant: str | None = None        # KV-cache quantization that ran: "none", "fp8", ... (Engine.kv_quant)
    # the engine's caveat on how it served this format (Engine.supports' note), which its numbers
    # depend on: e.g. hf runs quantized weights decompressed to dense, so its speed is not the format's
    serving_note: str | None = None
    setup_id: str | None = None        # see setup_id()
    # setup_id of the setup as configured, before the engine resolved `auto`
    # values (dtype, tensor_parallel_size): rows of one comparison_id may be
    # compared even where `dtype: auto` chose another dtype per artifact (the
    # int4 kernel's bf16 beside the original's float32 on a CPU without native bf16)
    comparison_id: str | None = None
    versions: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)
    # the defaults profile the job was composed with (conf/hardware/: "cpu" | "cuda"); not
    # part of setup_id: a default changes what is measured, which the other fields say
    hardware_defaults: str | None = None
    # what was measured
    scenario: str | None = None        # scenario, eval set or lm-eval task label
    dataset: str | None = None         # accuracy / lm_eval rows
    batch_size: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    run_index: int | None = None       # 0-based timed run (warm-up is not recorded)
    seed: int | None = None            # `seed=`: the prompts' token ids, the last-word passages, lm-eval's --seed
    # serving rows: the load level as run ({"profile", "mode": synchronous |
    # concurrency | rate, "level", "burstiness", "max_requests", "max_seconds",
    # "drain_seconds", and for rate levels "arrivals", the schedule; rows
    # written before 2026-11-29 lack the drain and the schedule})
    # and the SLO it was judged against (conf/slo/)
    load: dict | None = None
    slo: dict | None = None
    # speed and serving rows: how the prompts' token ids were drawn (scenarios.PromptDraw):
    # {"per": "scenario"}, + "salt" where the server outlives the job (engine=openai). Rows without it
    # drew the same prompts for every scenario of one batch size and input length (serving: of one
    # level and input length), so the later of two such scenarios in one job may have been served
    # from the prefix cache. Not part of the key: it says how, not what, was measured
    prompts: dict | None = None
    metrics: dict = field(default_factory=dict)
    # How the run count was decided (runs=auto or warmup_runs=auto; None: fixed
    # counts), as it stood after this run, so an interrupted scenario still says
    # how far it got: {"rule", "runs", "min_runs", "max_runs", "target_ci_pct",
    # "achieved_ci_pct", "stopped": "target met" | "max_runs reached" | None
    # (more runs followed), "warmup_runs"}. The report reads the last run's.
    precision: dict | None = None
    # How busy the host was during the run (evaluate.host_load.HostLoad):
    # {"load_avg_1m_start", "load_avg_1m_end", "other_cpu_s", "wall_s", "cores"}
    host_load: dict | None = None
    # The shell command that measures this row again: the artifact's build
    # command from its manifest (skipped while complete), then this evaluate job.
    repro: str | None = None
    accuracy_config: dict | None = None
    # accuracy rows: the per-window and per-item values the metrics sum
    # (evaluate.accuracy.Scores); the report's intervals resample them
    accuracy_samples: dict | None = None
    lm_eval: dict | None = None        # lm-eval's own result for the task (higher_is_better, n-samples ...)
    lm_eval_config: dict | None = None
    lm_eval_versions: dict | None = None
    extra: dict = field(default_factory=dict)  # keys this version does not know
    # set by read_stores when several stores are read; never written
    store: Store | None = field(default=None, compare=False, repr=False)

    def measurement_key(self) -> tuple:
        """Identity of what the runs measure (artifact, setup, scenario, load):
        the runs of one scenario share it, whatever their index. The recipe
        too: it tells apart rows of recipes not quantized (no artifact id)."""
        load = json.dumps(self.load, sort_keys=True) if self.load else None
        return (self.kind, self.artifact_id, self.recipe, self.engine, self.setup_id, self.scenario,
                self.batch_size, self.input_len, self.output_len, load, self.measured_with())

    def measured_with(self) -> str | None:
        """What configures an accuracy, lm-eval or serving measurement beyond
        its setup and scenario, hashed: changing it measures anew, where a rerun
        took the rows of another config as complete. None for speed rows: their
        shape is in the key, and the seed only draws other random token ids."""
        if self.kind == "accuracy":
            part = {"config": _without(self.accuracy_config, ACCURACY_LABELS), "seed": self.seed}
        elif self.kind == "lm_eval":
            part = {"config": _without(self.lm_eval_config, LM_EVAL_LABELS), "seed": self.seed,
                    "versions": self.lm_eval_versions}
        elif self.kind == "serving":   # goodput, attainment and the SLO's pNN are computed as a level runs
            part = {"slo": slo_judged_by(self.slo)}
        else:
            return None
        return sha256_json(part)[:12]

    def run_key(self) -> tuple:
        """Identity of one measured run: rerunning a sweep skips keys already ok."""
        return (*self.measurement_key(), self.run_index)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in NOT_WRITTEN}
        return {k: v for k, v in out.items() if v is not None or k in ALWAYS_WRITTEN} | self.extra

    @classmethod
    def from_dict(cls, data: dict) -> "Row":
        known = {k: v for k, v in data.items() if k in FIELDS}
        for k in ("engine_args", "engine_env", "versions", "hardware", "metrics"):
            if known.get(k) is None:
                known.pop(k, None)  # older rows wrote null where a dict now defaults to {}
        return cls(**known, extra={k: v for k, v in data.items() if k not in FIELDS})

    def but(self, **changes) -> "Row":
        """A copy with `changes` (rows of one job share everything else)."""
        return dataclasses.replace(self, **changes)


# Config keys that name or select rather than measure: the rows' label, the
# switch, the task list (adding a task leaves the others complete), where the
# lm-eval environment is (its versions are in the key) and lm-eval's batch size.
ACCURACY_LABELS = ("name", "enabled")
LM_EVAL_LABELS = ("name", "enabled", "tasks", "venv", "batch_size")


def _without(config: dict | None, keys: tuple[str, ...]) -> dict | None:
    return None if config is None else {k: v for k, v in config.items() if k not in keys}


NOT_WRITTEN = ("extra", "store")  # extra is written flat; store is where the row was read from
FIELDS = {f.name for f in dataclasses.fields(Row)} - set(NOT_WRITTEN)
# Written even when None: what every reader of a row may index.
ALWAYS_WRITTEN = ("kind", "status", "artifact_id", "engine", "setup_id", "scenario", "batch_size", "input_len",
                  "output_len", "run_index")


def setup_id(engine_cfg: dict, versions: dict, hardware: dict) -> str:
    """Identity of the measurement setup. Rows of another setup are never
    reused or averaged together: sweeping `engine.args.*` or `engine.env.*`,
    upgrading vLLM or moving to other hardware measures anew. The hostname is
    left out, so a resumed cluster job on a twin node reuses its rows."""
    return sha256_json({
        "engine": engine_cfg,
        "versions": setup_versions(versions),
        "hardware": machine_of(hardware),
    })[:12]


def machine_of(hardware: dict | None) -> dict:
    """The hardware that identifies a machine: all but the hostname, so the
    twin nodes of a cluster are one machine."""
    return {k: v for k, v in (hardware or {}).items() if k != "hostname"}


def machine_id(hardware: dict | None) -> str:
    """A short id of the machine (machine_of) a row was measured on."""
    return sha256_json(machine_of(hardware))[:12]


def shard_path(results_dir: Path, shard: bool = False) -> Path:
    """The file this process appends to; `shard=True` gives a per-process file
    for filesystems where O_APPEND is not atomic across hosts (NFS)."""
    name = f"results-{socket.gethostname()}-{os.getpid()}.jsonl" if shard else RESULTS_FILE
    return Path(results_dir) / name


def append(path: Path, row: Row) -> None:
    append_line(path, json.dumps(row.to_dict(), sort_keys=True, default=_plain))


def _plain(value):
    """A numpy or torch scalar is written as the number it holds, anything
    else unknown to json as its text."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "ndim", None) == 0 else str(value)


def check_writable(path: Path) -> None:
    """Fail now, not after the engine ran, when rows cannot be appended to
    `path`. Nothing is made: the store's folder comes with its first row, so
    a job refused before it measures leaves no empty store behind."""
    path = Path(path)
    try:
        if path.exists():
            open(path, "a").close()  # opening for append changes nothing
        else:
            tempfile.TemporaryFile(dir=_nearest_folder(path.parent)).close()
    except OSError as e:
        raise UserError(f"cannot write results to {path} ({e.strerror or e}); pass results_dir=<a writable "
                        "directory>") from None
    store_lock.check_writable(path.parent)  # a measurement's lock file goes there


def _nearest_folder(folder: Path) -> Path:
    """`folder`, or the closest of its parents that exists (where mkdir would
    start); NotADirectoryError where that is a file."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(folder))
    return folder


def is_row(obj) -> bool:
    """A result row, as opposed to other JSON a store may hold (a copied
    config, a list): a dict that says what kind of measurement it is and how
    it ended."""
    return isinstance(obj, dict) and isinstance(obj.get("kind"), str) and isinstance(obj.get("status"), str)


@dataclass(frozen=True)
class Refused:
    """A line of a store that every reader leaves out, and why: a row that
    cannot be true (row_validity), or one that is not a row (`row` None:
    torn, not JSON, other JSON)."""
    path: Path
    line: int                # 1-based
    why: str
    row: Row | None = None


@dataclass
class StoreRead:
    """What a store holds: the rows, the lines left out, and the torn tails
    that appends moved aside (quantize.common.atomic.mend_tail)."""
    rows: list[Row] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    set_aside: list[Path] = field(default_factory=list)

    @property
    def unreadable(self) -> list[Refused]:
        return [r for r in self.refused if r.row is None]


def read(results_dir: Path) -> list[Row]:
    """All rows from every results*.jsonl in the directory (see read_store)."""
    return read_store(results_dir).rows


def read_store(results_dir: Path) -> StoreRead:
    """Every results*.jsonl in the directory, file by file, line by line. A
    torn line (writer killed mid-write) is left out, never half-parsed, as is
    any line that is not a result row and any row that cannot be true
    (row_validity): one warning per file counts them and names their line
    numbers."""
    store = StoreRead(set_aside=sorted(Path(results_dir).glob(f"results*.jsonl{TORN_MARK}*")))
    for path in sorted(Path(results_dir).glob("results*.jsonl")):
        refused = _read_file(path, store.rows)
        store.refused += refused
        if refused:
            log.warning("%s: left out %d line(s) that are not result rows or cannot be true (line %s; the "
                        "report's Rejected rows says why)", path, len(refused),
                        ", ".join(str(r.line) for r in refused))
    return store


def _read_file(path: Path, rows: list[Row]) -> list[Refused]:
    """Append the rows of one file to `rows`; return the lines left out."""
    refused = []
    for number, line in enumerate(path.read_text(errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            refused.append(Refused(path, number, "not JSON (a torn or hand-edited line)"))
            continue
        if not is_row(obj):
            refused.append(Refused(path, number, "JSON, but not a result row (no kind and status)"))
        elif why := why_rejected(obj):
            refused.append(Refused(path, number, why, Row.from_dict(obj)))
        else:
            rows.append(Row.from_dict(obj))
    return refused


def read_stores(results_dirs: list[Path]) -> StoreRead:
    """The rows of every store, store after store. Each must hold rows: one
    that does not is one line naming it. With several, each row carries its
    Store, and its setup ids end in `@<store name>`: the hostname is not part
    of a setup id, so twin machines' rows would otherwise be averaged
    together, and a speed-up could divide one store's rows by the other's."""
    dirs = list(dict.fromkeys(Path(d) for d in results_dirs))
    for d in dirs:
        if d.exists() and not d.is_dir():   # read as an empty store, it said "run python -m evaluate first"
            raise UserError(f"results_dir={d} is a file, not a folder; pass results_dir=<the folder "
                            "python -m evaluate wrote its rows to>")
    found = {d: read_store(d) if d.is_dir() else StoreRead() for d in dirs}
    if not found:
        raise UserError("results_dir= names no folder; pass results_dir=<folder>, or results_dir=a,b for several")
    several = len(found) > 1
    for d, read in found.items():
        if not read.rows and not read.refused:
            raise UserError(f"no results in {d}; run python -m evaluate first" + (
                f", or leave it out of results_dir= (one of its {len(found)} folders)" if several else ""))
    merged = StoreRead(refused=[r for read in found.values() for r in read.refused],
                       set_aside=[p for read in found.values() for p in read.set_aside])
    if not several:
        merged.rows = next(iter(found.values())).rows
    else:
        merged.rows = [in_store(row, store) for store in stores(list(found)) for row in found[store.path].rows]
    return merged


def stores(dirs: list[Path]) -> list[Store]:
    """The stores (distinct folders), each named by the fewest trailing path
    parts that no other store ends in: `a` and `b`; `run1/results` and `run2/results`."""
    return [Store(d, next(tail(d, n) for n in range(1, len(d.parts) + 1)
                          if all(tail(o, n) != tail(d, n) for o in dirs if o != d)))
            for d in dirs]


def tail(path: Path, parts: int) -> str:
    return str(Path(*path.parts[-parts:]))


def in_store(row: Row, store: Store) -> Row:
    """The row as read from one of several stores: tagged, its setup ids kept apart per store."""
    return row.but(store=store, setup_id=f"{row.setup_id or '?'}@{store.name}",
                   comparison_id=row.comparison_id and f"{row.comparison_id}@{store.name}")


def standing(rows: list[Row]) -> dict[tuple, Row]:
    """Per run (Row.run_key), the row that stands for it: its ok row wherever
    that lies (a rerun completed a failed run; replayed shard by shard, a
    retry's ok row may come before the failed row it fixed), else its latest."""
    out: dict[tuple, Row] = {}
    for row in sorted(rows, key=lambda r: r.timestamp or ""):   # stable: file order among equal times
        key = row.run_key()
        if key not in out or not out[key].ok:
            out[key] = row
    return out


def completed_keys(results_dir: Path, statuses: tuple = ("ok",)) -> set[tuple]:
    return {r.run_key() for r in read(results_dir) if r.status in statuses}
