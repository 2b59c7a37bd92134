"""summary.csv (one record per speed group: every metric's mean, std and 95%
interval of the mean, the speed-up, its interval and verdict, the dtypes it compares,
the price per hour and cost per 1M output tokens where a price is set, the GPU
weights and KV cache the engine reported on a GPU: memory_figures),
runs.csv (one per ok row), both with the `hardware` (but the hostname)
and `versions` their setup_id hashes, as JSON, serving.csv (one per ok
serving row: a load level) and search_front.csv (one per complete trial of each recipe search,
with `on_front`). Columns are the rows' raw keys, metrics in formatting.LABELS' order;
`store` says which store a line came from where several were read.
Named tables_csv so it never shadows the standard library's csv."""
import csv
import io
import json
from dataclasses import dataclass

from evaluate.analysis import Analysis
from evaluate.analysis.cost import Prices, group_cost
from evaluate.analysis.groups import Group, numeric_metrics
from evaluate.report.formatting import mb, ordered_metrics, speed_verdict
from evaluate.report.config import OutputFormat, ReportConfig
from evaluate.report.memory_figures import gpu_kv_bytes, gpu_weights_bytes
from evaluate.report.search_files import StudyEntry, studies
from evaluate.results import Row, machine_of
from quantize.common.provenance import setup_versions

SUMMARY_FIELDS = ("scenario", "batch_size", "input_len", "output_len", "model_name", "recipe", "artifact_id",
                  "engine", "quant_format", "modules_changed", "model_bytes", "model_size_mb", "runs",
                  "speedup_vs_original", "speedup_ci95_low", "speedup_ci95_high", "speedup_verdict", "dtype",
                  "baseline_dtype", "setup_id", "hardware", "versions", "store", "usd_per_hour", "usd_per_1m_output_tokens",
                  "gpu_weights_bytes", "gpu_kv_cache_bytes", "serving_note")
SERVING_ROW_FIELDS = ("timestamp", "scenario", "input_len", "output_len", "model_name", "recipe", "artifact_id",
                      "engine", "setup_id", "model_bytes")
SERVING_LOAD_FIELDS = ("profile", "mode", "level", "burstiness", "max_requests", "max_seconds", "drain_seconds",
                       "arrivals")
SERVING_FIELDS = (*SERVING_ROW_FIELDS, *SERVING_LOAD_FIELDS, "slo")
SEARCH_FIELDS = ("study", "trial", "recipe", "artifact_id", "on_front", "speed", "repro", "params", "recipe_path",
                 "artifact_dir", "wall_s", "study_file")
RUN_FIELDS = ("timestamp", "kind", "scenario", "batch_size", "input_len", "output_len", "model_name", "recipe",
              "artifact_id", "engine", "quant_format", "model_bytes", "run_index", "setup_id", "comparison_id",
              "serving_note")


@dataclass
class Csv(OutputFormat):
    """summary.csv and runs.csv; serving.csv where the store has serving rows."""

    def render(self, analysis: Analysis, report: ReportConfig) -> dict[str, str]:
        files = {"summary.csv": to_csv(summary_records(analysis.speed, report.cost), SUMMARY_FIELDS),
                 "runs.csv": to_csv(run_records(analysis.rows), RUN_FIELDS)}
        if any(r.kind == "serving" for r in analysis.rows):
            files["serving.csv"] = to_csv(serving_records(analysis.rows), SERVING_FIELDS)
        searches = studies(analysis.results_dirs, analysis.suspect_ids)
        if searches:
            files["search_front.csv"] = to_csv(search_records(searches), SEARCH_FIELDS)
        return files


def summary_records(speed: list[Group], prices: Prices = Prices()) -> list[dict]:
    """One record per speed group; the cost columns empty where no price is set for its machine."""
    metrics = ordered_metrics({k for g in speed for k in g.stats})
    out = []
    for g in speed:
        rec = dict(zip(SUMMARY_FIELDS, (
            g.scenario.name, g.scenario.batch_size, g.scenario.input_len, g.scenario.output_len, g.model_name,
            g.recipe, g.artifact_id, g.engine, g.quant_format, modules_changed(g.runs[0]), g.model_bytes,
            mb(g.model_bytes), len(g.runs),
            g.speedup, *(g.speedup_ci or (None, None)), verdict_text(g), g.dtype,
            g.baseline.dtype if g.baseline else None,
            g.setup_id, *setup_of(g.runs[0]), store_name(g.runs[0]), prices.of(g.runs[0]), group_cost(prices, g),
            gpu_weights_bytes(g.runs[0]), gpu_kv_bytes(g.runs[0]), g.runs[0].serving_note)))
        for k in metrics:
            rec[f"{k}_mean"], rec[f"{k}_std"] = g.mean(k), g.std(k)
            rec[f"{k}_ci95_low"], rec[f"{k}_ci95_high"] = g.interval(k) or (None, None)
        out.append(rec)
    return out


def verdict_text(g: Group) -> str | None:
    """The rule's verdict on g's speed-up; none for the original itself."""
    return None if g.speedup_verdict is None or g.baseline is g else speed_verdict(g.speedup_verdict)


def run_records(rows: list[Row]) -> list[dict]:
    """Every ok row, flat: metrics.* become columns; engine args/env as JSON."""
    ok = [r for r in rows if r.ok]
    metrics = ordered_metrics({k for r in ok for k in numeric_metrics(r)})
    out = []
    for r in ok:
        m = numeric_metrics(r)
        rec = {k: getattr(r, k) for k in RUN_FIELDS} | {"store": store_name(r)}
        rec["engine_args"] = json.dumps(r.engine_args, sort_keys=True)
        rec["engine_env"] = json.dumps(r.engine_env, sort_keys=True)
        rec["hardware"], rec["versions"] = setup_of(r)
        rec.update({f"metrics.{k}": m.get(k) for k in metrics})
        out.append(rec)
    return out


def setup_of(row: Row) -> tuple[str | None, str | None]:
    """The hardware (but the hostname) and versions the row's setup_id
    hashes, as JSON: what ties the id to its machine."""
    versions = setup_versions(row.versions)
    return (json.dumps(machine_of(row.hardware), sort_keys=True) if row.hardware else None,
            json.dumps(versions, sort_keys=True) if versions else None)


def modules_changed(row: Row) -> int | None:
    """How many modules the artifact's recipe quantized or pruned (the
    manifest's modules_changed); empty for the baseline and older artifacts."""
    return ((row.manifest or {}).get("modules_changed") or {}).get("total")


def store_name(row: Row) -> str | None:
    """Which store the row came from where the report read several (results_dir=a,b)."""
    return row.store.name if row.store else None


def to_csv(records: list[dict], empty_fields: tuple = ()) -> str:
    """CSV text; with no records, just the header `empty_fields`."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(records[0]) if records else list(empty_fields), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in rec.items()} for rec in records)
    return buf.getvalue()


def search_records(searches: list[StudyEntry]) -> list[dict]:
    """Every complete trial of every study, its objectives' values as columns
    by their names (the union over the studies, in order of first appearance)
    and `on_front`: whether it is on its study's Pareto front."""
    names = list(dict.fromkeys(o.name for e in searches for o in e.search.record.objectives))
    out = []
    for entry in searches:
        search = entry.search
        for t in search.complete:
            values = {o.name: v for o, v in zip(search.record.objectives, t.values)}
            rec = {"study": search.record.study, "trial": t.number, "recipe": t.recipe, "artifact_id": t.artifact_id}
            rec |= {name: values.get(name) for name in names}
            rec |= {"on_front": search.on_front(t), "speed": t.speed, "repro": t.repro,
                    "params": json.dumps(t.params, sort_keys=True), "recipe_path": t.recipe_path,
                    "artifact_dir": t.artifact_dir, "wall_s": t.wall_s, "study_file": str(entry.path)}
            out.append(rec)
    return out


def serving_records(rows: list[Row]) -> list[dict]:
    """Every ok serving row, flat: its load level, the SLO's name and every metric as a column."""
    ok = [r for r in rows if r.ok and r.kind == "serving"]
    keys = list(dict.fromkeys(k for r in ok for k in r.metrics))
    out = []
    for r in ok:
        load = r.load or {}
        rec = {k: getattr(r, k) for k in SERVING_ROW_FIELDS}
        rec |= {k: load.get(k) for k in SERVING_LOAD_FIELDS}
        rec["slo"] = (r.slo or {}).get("name")
        rec.update({k: r.metrics.get(k) for k in keys})
        out.append(rec)
    return out
