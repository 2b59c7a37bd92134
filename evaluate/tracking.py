"""Result rows and reports as tracker runs (quantize.common.tracking).

A measurement (artifact x setup x scenario, and a serving level: a row's
measurement_key) is one run, nested under its artifact's run; its timed runs
are the steps of its metrics (run_index). Params: engine, its args and env,
dtype, hardware, versions and the scenario's shape (the first row's; a tag
`seen.<param>` lists the values of one its rows differ in: a twin host);
tags: artifact_id, setup_id, comparison_id and the row's status. A report is one run per set of
stores, holding the files it wrote.

Each run's key is looked up under the results store's lock for that key
(evaluate.store_lock), so jobs logging side by side, a requeued job and a
back-fill never create a run twice or log a step twice."""
import functools
from datetime import datetime
from pathlib import Path

from evaluate import store_lock
from evaluate.results import Row, standing
from quantize.common import manifest
from quantize.common.tracking import (RunRecord, Tracker, artifact_key, artifact_record, clean_params, clean_tags,
                                      cleared, flat, numeric, run_key)


def bind(tracker: Tracker | None, results_dir: Path) -> Tracker | None:
    """The tracker with its runs' locks in the store at `results_dir`."""
    if tracker is not None:
        tracker.locks = lambda key: store_lock.measurement(results_dir, ("tracking", key), "the tracker's run")
    return tracker


def log_rows(tracker: Tracker | None, rows: list[Row], earlier: list[Row] = ()) -> bool:
    """Each row into its measurement's run; rows already logged add nothing.
    `earlier`: rows logged before of the same measurements (a job's own, as it
    logs one row at a time), whose status counts as in a back-fill."""
    if tracker is None or not rows:
        return True
    return tracker.safely(lambda: tracker.log(*measurement_records(rows, earlier)))


def measurement_records(rows: list[Row], earlier: list[Row] = ()) -> list[RunRecord]:
    """Each row's record, its run's status from all the rows given of its
    measurement (`earlier` ones too): replayed in store order (shard by
    shard), a failed row of a first attempt may come after the ok row of the
    retry that fixed it; logged live, a failed run 1 still fails the
    measurement after run 2 succeeds."""
    grouped = _by_measurement([*earlier, *rows])
    return [measurement_record(r, _outcome(grouped[r.measurement_key()])) for r in rows]


def _by_measurement(rows: list[Row]) -> dict[tuple, list[Row]]:
    grouped = {}
    for row in rows:
        grouped.setdefault(row.measurement_key(), []).append(row)
    return grouped


def _outcome(rows: list[Row]) -> Row:
    """The row a measurement's status is: of the rows standing for its runs
    (results.standing: an ok row where one is), a failed one, else the latest."""
    latest = list(standing(rows).values())
    return next((r for r in latest if r.status == "failed"), max(latest, key=lambda r: r.timestamp or ""))


def measurement_record(row: Row, outcome: Row | None = None) -> RunRecord:
    """The run of `row`'s measurement; `outcome` (the row itself by default)
    sets its status, tags `status` and `reason` and whether it ended FAILED."""
    outcome = outcome or row
    load = row.load or {}
    level = f" {load.get('mode')}={load.get('level')}" if load else ""
    tags = {"artifact_id": row.artifact_id, "setup_id": row.setup_id, "comparison_id": row.comparison_id,
            "model": row.model_name, "recipe": row.recipe, "kind": row.kind, "scenario": row.scenario,
            "engine": row.engine, "status": outcome.status, "reason": outcome.reason}
    return RunRecord(
        key=run_key("measurement", *row.measurement_key()),
        name=f"{row.recipe} · {row.scenario} · {row.engine}{level}",
        params=clean_params(_params(row)),
        tags=clean_tags(tags), untags=cleared(tags, "reason"),
        metrics=numeric(flat(row.metrics), step=row.run_index or 0, at=_millis(row.timestamp)) if row.ok else (),
        parent=artifact_parent(row.artifact_path, row.artifact_id, row.model_name, row.recipe),
        failed=outcome.status == "failed")


def _millis(timestamp: str | None) -> int | None:
    """A row's ISO time in ms since the epoch: with its run index, which of a
    measurement's steps it is (one measured again is another)."""
    try:
        return int(datetime.fromisoformat(timestamp).timestamp() * 1000)
    except (TypeError, ValueError):
        return None


def _params(row: Row) -> dict:
    shape = {"kind": row.kind, "engine": row.engine, "engine_version": row.engine_version,
             "dtype": row.engine_args.get("dtype"), "scenario": row.scenario, "dataset": row.dataset,
             "batch_size": row.batch_size, "input_len": row.input_len, "output_len": row.output_len,
             "kv_quant": row.kv_quant, "serving_note": row.serving_note, "hardware_defaults": row.hardware_defaults}
    return {**shape, **flat(row.engine_args, "engine_args"), **flat(row.engine_env, "engine_env"),
            **flat(row.load or {}, "load"), **flat(row.hardware, "hardware"), **flat(row.versions, "versions")}


@functools.lru_cache(maxsize=256)
def artifact_parent(path: str | None, artifact_id: str | None, model: str | None, recipe: str | None) -> RunRecord:
    """The artifact's run: from its manifest when the artifact is at hand (as
    quantize logs it), else from what the rows say of it."""
    if path and artifact_id and (Path(path) / manifest.FILE).is_file():
        try:
            record = artifact_record(Path(path))
        except Exception:  # a manifest this job could not read: the rows' own fields below
            record = None
        if record is not None and record.key == artifact_key(artifact_id):
            return record
    key = artifact_key(artifact_id) if artifact_id else run_key("not built", model, recipe)
    return RunRecord(key=key, name=f"{model}/{recipe}",
                     tags=clean_tags({"artifact_id": artifact_id, "model": model, "recipe": recipe}))


REPORT_AGAIN = ("the report's files are written: once the tracker is back, the same python -m evaluate.report "
                "command logs them")


def report_record(results_dirs: list[Path], out_dir: Path, files: list[Path]) -> RunRecord:
    """The run of the report of these stores (the sweep's) written to out_dir:
    its files replace the last such report's. Another out_dir (another layout,
    say) is another run, so neither report deletes the other's files."""
    folders = sorted(str(Path(d).resolve()) for d in results_dirs)
    out = str(Path(out_dir).resolve())
    return RunRecord(key=run_key("report", *folders, "->", out),
                     name=f"report: {', '.join(Path(d).name for d in folders)} -> {Path(out).name}",
                     tags=clean_tags({"kind": "report", "results_dir": ", ".join(folders), "out_dir": out}),
                     files=tuple(p for p in files if Path(p).is_file()), refresh_files=True,
                     recovery=REPORT_AGAIN)
