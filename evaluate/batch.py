"""Batch speed: a scenario's timed runs in one engine, each run one batch of
`batch_size` requests of `input_len` random prompt tokens generating
`output_len` tokens (warm-up, timed runs, summary per run, one `speed` row
per run). The load profiles' counterpart is evaluate.serving.

`job` is the evaluate pipeline's Job (duck-typed, as evaluate.serving reads
it): plan, target, seed, speed_row, record."""
import logging
from typing import NamedTuple

from evaluate import precision
from evaluate.engines import Engine
from evaluate.engines.base import RunFailed
from evaluate.host_load import HostLoad, HostLoadMeter
from evaluate.metrics import summarize
from evaluate.precision import HEADLINE
from evaluate.results import Row
from evaluate.scenarios import PromptDraw, Scenario, random_prompts
from quantize.common.jobs import one_line

log = logging.getLogger("quantbench.evaluate")


class Pending(NamedTuple):
    """A scenario's timed runs still to measure, and the output throughputs of
    its runs already stored in this setup (runs=auto continues from them)."""
    indices: list[int]
    prior: list[float]

    @property
    def owed(self) -> bool:
        return bool(self.indices)

    def owed_indices(self, plan, recorded: set[int] = frozenset()) -> list[int]:
        """The run indices a failure stands for: those not recorded yet; with
        runs=auto, those up to min_runs (more are measured only as the spread asks)."""
        left = [i for i in self.indices if i not in recorded]
        return left[:max(1, plan.min_runs - len(self.prior) - len(recorded))] if plan.auto else left

    def failed_rows(self, job, s: Scenario, recorded: set[int] = frozenset()) -> list[Row]:
        """A failed row per owed run, each with the run index it stands for, so
        that skip_completed measures exactly those again."""
        return [job.speed_row(s, i) for i in self.owed_indices(job.plan, recorded)]

    def measure(self, job, engine: Engine, s: Scenario) -> None:
        _run_scenario(job, engine, s, self)


def stored_runs(rows) -> tuple[dict, list[float]]:
    """The timed runs of one measurement already stored: their output
    throughput by run index, and the numeric ones in run order (what
    RunPlan.indices decides the runs still owed from)."""
    prior = {r.run_index: r.metrics.get(HEADLINE) for r in rows if isinstance(r.run_index, int)}
    return prior, [float(v) for _, v in sorted(prior.items()) if isinstance(v, (int, float))]


def pending_runs(job, s: Scenario, stored: list[Row]) -> Pending:
    """What scenario `s` still owes, given the ok rows already `stored`."""
    key = job.speed_row(s, None).measurement_key()
    prior, values = stored_runs(r for r in stored if r.measurement_key() == key)
    indices = job.plan.indices(prior, values)
    if job.plan.auto and prior and not indices:
        log.info("scenario %s: its %d stored runs already meet runs=auto (%s)", s.name, len(values),
                 job.plan.stopped(values))
    return Pending(indices, values)


def _run_scenario(job, engine: Engine, s: Scenario, pending: Pending) -> None:
    """Warm up, then the owed timed runs. A run the server failed (RunFailed)
    is recorded failed and the next goes on; anything that ends the scenario
    records a failed row for each run still owed, and goes up."""
    plan = job.plan
    log.info("scenario %s: batch %d, %d in / %d out tokens, %s warm-up + %s timed runs", s.name, s.batch_size,
             s.input_len, s.output_len, plan.warmup_runs if plan.warmup_runs is not None else "auto",
             len(pending.indices) if not plan.auto else
             f"auto ({plan.min_runs}-{plan.max_runs}, target ±{plan.target_ci_pct:g} %)")
    recorded: set[int] = set()
    try:
        _measure_runs(job, engine, s, pending, recorded, PromptDraw.for_engine(engine))
    except Exception as e:
        _record_failed(job, pending.failed_rows(job, s, recorded), one_line(e))
        raise


def _measure_runs(job, engine: Engine, s: Scenario, pending: Pending, recorded: set[int],
                  draw: PromptDraw) -> None:
    """The warm-up and the timed runs; `recorded` gets each run index as its row is written."""
    plan = job.plan
    vocab = int(job.target.config.get("vocab_size") or 10000)
    try:
        warmups = _warm_up(job, engine, s, vocab, draw)
    except RunFailed as e:
        _record_failed(job, pending.failed_rows(job, s), f"warm-up failed: {e}")
        log.error("  warm-up failed: %s; scenario %s goes unmeasured", e, s.name)
        return
    values = list(pending.prior)
    for i in pending.indices:
        try:
            metrics, host = _timed_run(job, engine, s, i, vocab, draw)
        except RunFailed as e:
            job.record(job.speed_row(s, i), "failed", reason=str(e))
            recorded.add(i)
            log.error("  run %d failed: %s; going on", i + 1, e)
            continue
        values.append(metrics[HEADLINE])
        record = plan.record(values, warmups)
        job.record(job.speed_row(s, i), "ok", metrics=metrics, precision=record, host_load=host.as_dict(),
                   prompts=draw.as_row())
        recorded.add(i)
        log.info("  run %d%s: %.1f tok/s out, latency %.2f s, TTFT %.0f ms%s", i + 1,
                 f" (auto, at most {plan.max_runs})" if plan.auto else f"/{plan.runs}", metrics[HEADLINE],
                 metrics["latency_s"], metrics["ttft_ms_mean"],
                 f", 95% CI ±{record['achieved_ci_pct']:.1f} %" if plan.auto and len(values) > 1 else "")
        if plan.stopped(values):
            log.info("  runs=auto: %s after %d runs", plan.stopped(values), len(values))
            break


def _record_failed(job, rows: list[Row], reason: str) -> None:
    for row in rows:
        job.record(row, "failed", reason=reason)


def _warm_up(job, engine: Engine, s: Scenario, vocab: int, draw: PromptDraw) -> int:
    """Untimed runs before the timed ones; with warmup_runs=auto, until the
    throughput is stable. Returns how many ran."""
    plan, seed = job.plan, job.seed
    if plan.warmup_runs is not None:
        for w in range(plan.warmup_runs):
            engine.run(prompts(s, seed, -1 - w, vocab, draw), s.output_len)
        return plan.warmup_runs
    speeds = []
    while not precision.warmed_up(speeds, plan.warmup_tolerance_pct, plan.max_warmup_runs):
        start, timings = engine.run(prompts(s, seed, -1 - len(speeds), vocab, draw), s.output_len)
        speeds.append(summarize(timings, start, job.target.model_bytes)[HEADLINE])
    log.info("  warm-up: %d runs (%s tok/s)", len(speeds), ", ".join(f"{v:.1f}" for v in speeds))
    return len(speeds)


def _timed_run(job, engine: Engine, s: Scenario, i: int, vocab: int, draw: PromptDraw) -> tuple[dict, HostLoad]:
    """One timed run: its metrics, and how busy the host was meanwhile."""
    target = job.target
    with engine.peak_memory() as mem, HostLoadMeter() as host:
        start, timings = engine.run(prompts(s, job.seed, i, vocab, draw), s.output_len)
    short = [t.output_tokens for t in timings if t.output_tokens != s.output_len]
    if short:
        raise RuntimeError(f"engine generated {short[0]} tokens instead of {s.output_len}")
    metrics = summarize(timings, start, target.model_bytes) | mem.as_metrics()
    metrics["model_bytes"] = target.model_bytes
    return metrics, host.result


def prompts(s, seed: int, run_index: int, vocab: int, draw: PromptDraw = PromptDraw()) -> list[list[int]]:
    """Exactly input_len random token ids per request, fresh for every run and
    scenario (so prefix caching cannot serve a timed run from the warm-up or
    from another scenario of the job: PromptDraw), drawn below 10000 as
    `vllm bench` does."""
    return random_prompts([seed, run_index + 1000, *draw.key(s)], s.batch_size, s.input_len, vocab)
