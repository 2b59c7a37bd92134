"""Serving rows: what evaluate does for a scenario when a load profile is
chosen (load=..., conf/load/). The scenario gives the request shape
(input_len, output_len; its batch_size does not apply); the profile gives
the levels; every level becomes one `kind="serving"` row whose `load` names
the level, `slo` the SLO it was judged against, and `metrics` are
evaluate.serving.metrics.level_metrics.

Resume: a level whose row is already ok in this setup is not run again; its
stored metrics feed the profile (a sweep's rates, slo_search's next level),
so a completed search re-runs nothing. A failed level records a failed row
and the profile goes on; a server that dies records failed rows for every
level still owed."""
import json
import logging
import zlib

from evaluate.host_load import HostLoadMeter
from evaluate.results import Row
from evaluate.scenarios import PromptDraw
from evaluate.serving.load import ARRIVALS, Level, ServerDied, level_prompts, level_requests, run_level
from evaluate.serving.metrics import level_metrics
from evaluate.serving.profiles import LoadProfile
from evaluate.serving.slo import SLO
from quantize.common.errors import UserError
from quantize.common.jobs import one_line

log = logging.getLogger("quantbench.evaluate")


def configure(load: LoadProfile | None, slo: SLO | None, engine_cls, engine_name: str) -> LoadProfile | None:
    """The job's load profile, checked against its engine and SLO before any
    engine starts; None for load=none and for an `only_with_server` profile
    with an in-process engine."""
    if load is None:
        return None
    if not getattr(engine_cls, "serves_http", False):
        if load.only_with_server:  # a default (hardware=cuda): in-process engines run batches
            return None
        raise UserError(f"load={load.name} needs a server engine: pass engine=vllm_server "
                        f"(or engine=openai engine.base_url=...); engine={engine_name} runs in-process")
    load.validate(slo)
    return load


def serving_row(job, s, level: Level | None) -> Row:
    """The row of one level of scenario `s` (level None: the profile as a
    whole, for rows that say why nothing ran)."""
    p = job.load
    # drain_seconds decides which late requests complete and which fail, so it is part of the level's key
    load = {"profile": p.name, "mode": level.mode if level else None, "level": level.level if level else None,
            "burstiness": level.burstiness if level else None, "max_requests": p.max_requests,
            "max_seconds": p.max_seconds, "drain_seconds": p.drain()}
    if level and level.mode == "rate":  # concurrency rows keep the keys they had
        load["arrivals"] = ARRIVALS
    return job.base.but(kind="serving", scenario=s.name, batch_size=None, input_len=s.input_len,
                        output_len=s.output_len, run_index=0, load=load,
                        slo=job.slo.as_dict() if job.slo else None)


class _Owed(Exception):
    """A level not stored yet (raised while checking what is owed)."""


class LoadPending:
    """A scenario's load profile: owed or not, how to measure it, and the
    rows that stand for it when it cannot run."""

    def __init__(self, job, s, stored: list[Row]):
        self.stored = {r.run_key(): r for r in stored if r.kind == "serving"}
        self.recorded: set[tuple] = set()  # levels this job recorded, ok or failed
        self.draw = PromptDraw()  # replaced as the profile runs on an engine (measure)
        self.owed = False
        try:
            job.load.run(self._from_store(job, s, missing=None), job.slo)
        except _Owed:
            self.owed = True

    def _from_store(self, job, s, missing):
        """measure() that answers from stored rows; `missing(row)` for the
        others (None: raise _Owed)."""
        def measure(level: Level):
            row = serving_row(job, s, level)
            hit = self.stored.get(row.run_key())
            if hit is not None:
                return hit.metrics
            if missing is None:
                raise _Owed
            return missing(row)
        return measure

    def failed_rows(self, job, s) -> list[Row]:
        """The rows still owed as far as they are known (a sweep's rates follow
        from levels that never ran: the profile's row stands for them)."""
        rows = []

        def owed(row):
            if row.run_key() not in self.recorded:
                rows.append(row)

        job.load.run(self._from_store(job, s, missing=owed), job.slo)
        return rows or [serving_row(job, s, None)]

    def measure(self, job, engine, s) -> None:
        """Run the scenario's profile on the started `engine`."""
        log.info("scenario %s: load=%s, %d in / %d out tokens, levels of at most %s requests and %s s",
                 s.name, job.load.name, s.input_len, s.output_len, job.load.max_requests,
                 job.load.max_seconds)
        self.draw = PromptDraw.for_engine(engine)
        try:
            result = job.load.run(self._from_store(
                job, s, missing=lambda row: self._run(job, engine, s, row)), job.slo)
        except ServerDied as e:
            for row in self.failed_rows(job, s):
                job.record(row, "failed", reason=one_line(e))
            raise
        if result is not None:
            log.info("  %s", job.load.describe_outcome(result, job.slo))


    def _run(self, job, engine, s, row: Row) -> dict | None:
        metrics = _run_level(job, engine, s, row.but(prompts=self.draw.as_row()), self.draw)
        self.recorded.add(row.run_key())
        if metrics is not None:  # later levels of the profile may read it (sweep, slo_search)
            self.stored[row.run_key()] = row.but(status="ok", metrics=metrics)
        return metrics


def _run_level(job, engine, s, row: Row, draw: PromptDraw) -> dict | None:
    """One level: its row (ok with metrics, or failed and the profile goes on)."""
    p, load = job.load, row.load
    level = Level(load["mode"], load["level"], load["burstiness"])
    # the prompts and arrivals follow the level, not its drain: levels apart in drain alone send the same requests
    drawn = {k: v for k, v in load.items() if k != "drain_seconds"}
    key = zlib.crc32(json.dumps(drawn, sort_keys=True).encode())
    vocab = int(job.target.config.get("vocab_size") or 10000)
    prompts = level_prompts(int(job.seed), key, level_requests(p.max_requests), s.input_len, vocab, draw.key(s))
    try:
        with HostLoadMeter() as host:
            run = run_level(engine.base_url, engine.model, level, prompts, s.output_len, float(p.max_seconds),
                            p.drain(), engine.alive, engine.server_pid, seed=key,
                            stall_timeout_s=engine.stall_timeout_s)
        metrics = level_metrics(run, job.slo)
        if not metrics["completed"]:  # nothing to measure: say why instead of a row of zeros
            first = next((r.error for r in run.results if r.error), "no request was sent")
            raise RuntimeError(f"no request of the level completed ({len(run.results)} sent): {first}")
    except ServerDied as e:  # LoadPending.measure records this level with the others owed
        log.error("  %s: the server died: %s", level.describe(), e)
        raise
    except Exception as e:
        job.record(row, "failed", reason=one_line(e))
        log.error("  %s failed: %s", level.describe(), one_line(e))
        return None
    job.record(row, "ok", metrics=metrics, host_load=host.result.as_dict())
    log.info("  %s: %d ok, %d failed in %.1f s; %.2f req/s, %.1f tok/s out; TTFT p50 %.0f ms, TPOT p50 %.1f ms%s",
             level.describe(), metrics["completed"], metrics["failed"], metrics["duration"],
             metrics["request_throughput"] or 0, metrics["output_throughput"] or 0, metrics["median_ttft_ms"],
             metrics["median_tpot_ms"], "" if metrics.get("valid", True) else
             f" (not valid: {metrics.get('valid_reason')})")
    return metrics
