"""One artifact x its scenarios x runs, in one engine, appended to the results store."""
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from omegaconf import DictConfig, OmegaConf

from evaluate import accuracy, engines, hardware as hardware_mod, lmeval, precision, results, scenarios as scenario_mod, \
    target as target_mod
from evaluate.formats import Verdict
from evaluate.engines import Engine, LmEvalModel
from evaluate.memory import PeakMemory
from evaluate.metrics import summarize
from evaluate.precision import HEADLINE, RunPlan
from evaluate.results import Row
from evaluate.scenarios import Scenario
from evaluate.serving import run as serving
from evaluate.serving.load import ServerDied
from evaluate.target import Target
from quantize.common.errors import UserError
from quantize.common.jobs import in_multirun, job_command, one_line
from quantize.common.paths import resolve
from quantize.common.provenance import hardware, versions

log = logging.getLogger("quantbench.evaluate")


@dataclass(frozen=True)
class Job:
    """What the steps of one evaluate job share, decided before any engine starts."""
    cfg: DictConfig
    seed: int                            # prompt token ids are drawn from it (+ run index)
    plan: RunPlan                        # how many warm-up and timed runs (fixed or auto)
    target: Target
    store: Path                          # the results file rows are appended to
    engine: type[Engine]
    engine_cfg: dict                     # the engine config, resolved, its dtype chosen
    limit: int | None                    # the context every scenario must fit in
    fit: list[Scenario]                  # the scenarios that fit
    base: Row                            # what every row of the job holds (replaced once an engine describes itself)
    accuracy_cfg: DictConfig | None      # None: accuracy=none
    lm_eval_cfg: DictConfig | None       # None: lm_eval=none
    lm_eval_model: LmEvalModel | None    # how lm-eval runs this engine
    lm_eval_versions: dict | None        # of the lm-eval environment
    load: dict | None = None             # the load profile (conf/load/); None: batch timed runs
    slo: object = None                   # evaluate.serving.slo.SLO the serving rows are judged against

    def speed_row(self, s: Scenario, run_index: int | None) -> Row:
        return self.base.but(kind="speed", **s.as_row(), run_index=run_index)

    def scenario_row(self, s: Scenario) -> Row:
        """The row that stands for a scenario's measurements (skipped, unsupported)."""
        return serving.serving_row(self, s, None) if self.load else self.speed_row(s, None)

    def accuracy_row(self) -> Row:
        name = self.accuracy_cfg.name
        return self.base.but(kind="accuracy", scenario=name, dataset=name, batch_size=None,
                             input_len=None, output_len=None, run_index=0)

    def lm_eval_row(self, task: str) -> Row:
        return lmeval.row(self.base, self.lm_eval_cfg, task, engine=self.lm_eval_model.name)

    def lm_eval_tasks(self) -> list[str]:
        return list(self.lm_eval_cfg.tasks) if self.lm_eval_cfg else []

    def record(self, row: Row, status: str, **fields) -> None:
        _record(self.store, row, status, **fields)

    def guarded(self, row: Row, fn):
        """Run fn; on failure record a failed row (the sweep summary and the
        report show it) and re-raise."""
        try:
            return fn()
        except Exception as e:
            self.record(row, "failed", reason=one_line(e))
            raise


class Pending(NamedTuple):
    """A scenario's timed runs still to measure, and the output throughputs of
    its runs already stored in this setup (runs=auto continues from them)."""
    indices: list[int]
    prior: list[float]

    @property
    def owed(self) -> bool:
        return bool(self.indices)

    def failed_rows(self, job: Job, s: Scenario) -> list[Row]:
        return [job.speed_row(s, None)]

    def measure(self, job: Job, engine: Engine, s: Scenario) -> None:
        _run_scenario(job, engine, s, self)


def run(cfg) -> None:
    job, unfit, verdict = _plan(cfg)
    if not verdict:
        _unsupported(job, verdict)
        return
    if not job.target.built:  # servable, so quantizing it is what is missing
        _record_unloadable(cfg, job.store, job.target.not_built)
        raise job.target.not_built
    if verdict.reason:  # served, with a caveat the rows' numbers depend on
        log.warning("%s serves %s with a note: %s", job.engine.name, job.target.format.label, verdict.reason)
    cfg, store = job.cfg, job.store
    stored = [r for r in results.read(store.parent) if r.ok] if cfg.skip_completed else []
    done = {r.run_key() for r in stored}
    for s in unfit:
        reason = f"needs {s.max_len} tokens, max_model_len is {job.limit}"
        job.record(job.scenario_row(s), "skipped", reason=reason)
        log.warning("skipping scenario %s: %s", s.name, reason)
    todo = {s: serving.LoadPending(job, s, stored) if job.load else _pending(job, s, stored) for s in job.fit}
    todo = {s: pending for s, pending in todo.items() if pending.owed}
    accuracy_todo = job.accuracy_cfg is not None and job.accuracy_row().run_key() not in done
    lm_eval_todo = [t for t in job.lm_eval_tasks() if job.lm_eval_row(t).run_key() not in done]
    if not todo and not accuracy_todo and not lm_eval_todo:
        log.info("every requested run of %s is already in %s: nothing to do", job.target.artifact_id, store.parent)
        return
    if todo or accuracy_todo:
        _evaluate_in_engine(job, todo, accuracy_todo)
    if lm_eval_todo:
        _run_lm_eval(job, lm_eval_todo)
    log.info("results appended to %s", store)


def _pending(job: Job, s: Scenario, stored: list[Row]) -> Pending:
    key = job.speed_row(s, None).measurement_key()
    prior = {r.run_index: r.metrics.get(HEADLINE) for r in stored
             if r.measurement_key() == key and isinstance(r.run_index, int)}
    values = [float(v) for _, v in sorted(prior.items()) if isinstance(v, (int, float))]
    indices = job.plan.indices(prior, values)
    if job.plan.auto and prior and not indices:
        log.info("scenario %s: its %d stored runs already meet runs=auto (%s)", s.name, len(values),
                 job.plan.stopped(values))
    return Pending(indices, values)


def _plan(cfg) -> tuple[Job, list[Scenario], Verdict]:
    """Every check that needs no engine, in the order bad input is reported:
    the job, the scenarios too long for the context, and whether the engine
    can serve the target here."""
    plan = precision.plan(cfg)
    store = results.shard_path(resolve(cfg.results_dir), shard=bool(cfg.results_per_process))
    results.check_writable(store)  # before any measurement that could not be stored
    target = _load_target(cfg, store)
    engine_cfg = OmegaConf.to_container(cfg.engine, resolve=True)
    engine = engines.get(engine_cfg)
    name, args = engine_cfg["name"], engine_cfg["args"]
    # the scenarios and accuracy settings first: the engine's checks may import it (vLLM: ~6 s)
    limit = args.get("max_model_len") or target.max_context
    fit, unfit = _split_by_context(scenario_mod.resolve(cfg.scenario), limit)
    accuracy_cfg = cfg.accuracy if cfg.accuracy.get("enabled") else None
    if accuracy_cfg:
        if not engine.has_prompt_logprobs:
            raise UserError(f"engine={name} gives no prompt logprobs, so it cannot measure accuracy; "
                            "pass accuracy=none")
        accuracy.validate(accuracy_cfg, target, args.get("max_model_len"))
    engines.check_args(engine, args, name)
    args.update(engine.resolve_args(args, target.config))  # e.g. tensor_parallel_size=auto -> 4: rows, setup id
    problem = engine.config_problem(target.config, args)
    if problem:
        raise UserError(problem)
    machine = engine.machine()
    defaults = _defaults_profile(cfg)
    mismatch = hardware_mod.mismatch(defaults, machine)
    if mismatch:
        log.warning("%s", mismatch)
    args["dtype"] = engine.choose_dtype(target.format, machine, args.get("dtype") or "auto")
    load, slo = serving.configure(_group(cfg, "load"), _group(cfg, "slo"), engine, name)
    lm_eval_cfg = cfg.lm_eval if cfg.lm_eval.get("enabled") else None
    lm_eval_model = lm_eval_versions = None
    if lm_eval_cfg:
        lm_eval_model = engine.lm_eval_model(args, bool(cfg.trust_remote_code))
        if lm_eval_model is None:
            raise UserError(f"lm-eval cannot run engine={name}; pass lm_eval=none, or an engine lm-eval "
                            "can run (engine=vllm)")
        lm_eval_versions = lmeval.validate(lm_eval_cfg, lm_eval_model.name)

    where = {"versions": versions(), "hardware": hardware()}
    # engine_args/env as configured; a started engine replaces them with what it used.
    base = Row(kind="speed", **target.as_row(), engine=name, engine_args=args,
               engine_env=engine_cfg.get("env", {}), **where, machine=machine.facts(), hardware_defaults=defaults,
               kv_quant=engine.kv_quant(target.format, args),
               setup_id=results.setup_id(engines.identity(engine_cfg, engine), **where), repro=_repro(target))
    job = Job(cfg=cfg, seed=int(cfg.seed), plan=plan, target=target, store=store, engine=engine, engine_cfg=engine_cfg, limit=limit,
              fit=fit, base=base, accuracy_cfg=accuracy_cfg, lm_eval_cfg=lm_eval_cfg, lm_eval_model=lm_eval_model,
              lm_eval_versions=lm_eval_versions, load=load, slo=slo)
    return job, unfit, engine.supports(target.format, machine, args)


def _group(cfg, key: str) -> dict | None:
    return OmegaConf.to_container(cfg[key], resolve=True) if cfg.get(key) is not None else None


def _defaults_profile(cfg) -> str | None:
    """The conf/hardware/ profile the job's defaults came from (None: a config without one)."""
    return cfg.hardware.name if cfg.get("hardware") else None


def _repro(target: Target) -> str | None:
    """The commands that give this job's rows again: build the artifact (a
    no-op while it is complete), then evaluate it."""
    evaluate = job_command("evaluate")
    build = target.manifest.command if target.manifest else None
    return f"{build} && {evaluate}" if build and evaluate else evaluate


def _load_target(cfg, store):
    """The artifact; in a sweep, one that cannot be opened still leaves a
    failed row, so the report never shows the sweep as all good."""
    try:
        return target_mod.load(cfg)
    except target_mod.NotBuilt as e:
        # Not quantized: if the engine cannot serve it here anyway, say that instead.
        target = target_mod.planned(cfg, e)
        if target:
            return target
        _record_unloadable(cfg, store, e)
        raise
    except UserError as e:
        _record_unloadable(cfg, store, e)
        raise


def _record_unloadable(cfg, store, e: UserError) -> None:
    if in_multirun():
        row = Row(kind="speed", model_name=cfg.model.get("name"),
                  recipe=cfg.recipe.name if cfg.get("recipe") else None, engine=cfg.engine.name,
                  scenario=cfg.scenario.get("name"), hardware_defaults=_defaults_profile(cfg))
        _record(store, row, "failed", reason=str(e))


def _unsupported(job: Job, verdict) -> None:
    """The engine cannot serve this format here. Asked alone: one line and a
    non-zero exit. In a scenario set or a sweep: an `unsupported` row per
    measurement it was meant to make (once per setup), and the sweep goes on."""
    target = job.target
    what = target.path.name if target.built else f"{target.recipe}, not quantized"
    message = f"{job.base.engine} cannot serve {target.format.label} ({what}) here: {verdict.reason}"
    if not (in_multirun() or scenario_mod.is_set(job.cfg.scenario)):
        raise UserError(message)
    log.warning("unsupported: %s", message)
    rows = [job.scenario_row(s) for s in job.fit] + ([job.accuracy_row()] if job.accuracy_cfg else [])
    rows += [job.lm_eval_row(t) for t in job.lm_eval_tasks()]
    known = results.completed_keys(job.store.parent, statuses=("unsupported",))
    for row in rows:
        if row.run_key() not in known:
            job.record(row, "unsupported", reason=verdict.reason)


def _evaluate_in_engine(job: Job, todo: dict, with_accuracy: bool) -> None:
    """Speed scenarios, then the accuracy pass, in one engine; the accuracy
    reference is scored after the engine is closed."""
    try:
        engine = _start_engine(job, with_accuracy)
    except Exception as e:  # every measurement this job owed is recorded as failed
        if isinstance(e, UserError) and not getattr(e, "records_failure", False):
            raise  # bad input (e.g. a server that does not answer): nothing measured, nothing written
        _record_owed(job, todo, with_accuracy, f"engine start-up failed: {one_line(e)}")
        raise
    logprob_pass = None
    try:
        job = replace(job, base=job.base.but(**engine.describe()))
        for i, (s, pending) in enumerate(todo.items()):
            try:
                pending.measure(job, engine, s)
            except ServerDied as e:  # the scenario recorded its own; the rest cannot run either
                _record_owed(job, dict(list(todo.items())[i + 1:]), with_accuracy, f"server died: {e}")
                raise
        if with_accuracy:
            logprob_pass = job.guarded(job.accuracy_row(), lambda: accuracy.engine_pass(
                engine, job.accuracy_cfg, _tokenizer(job), int(job.cfg.seed)))
    finally:
        engine.close()  # before the accuracy reference loads: no competition for cores or memory
    if logprob_pass:
        _score_accuracy(job, logprob_pass)


def _record_owed(job: Job, todo: dict, with_accuracy: bool, reason: str) -> None:
    for s, pending in todo.items():
        for row in pending.failed_rows(job, s):
            job.record(row, "failed", reason=reason)
    if with_accuracy:
        job.record(job.accuracy_row(), "failed", reason=reason)


def _run_lm_eval(job: Job, tasks: list[str]) -> None:
    """lm-eval's own engine (lm_eval_model), in the engine's environment; one row per task."""
    lm_eval_cfg, model = job.lm_eval_cfg, job.lm_eval_model
    args = lmeval.model_args(model.args, lm_eval_cfg)
    with job.engine.environment(job.engine_cfg.get("env", {}), model.args) as env:
        job = replace(job, base=job.base.but(engine_args=args, engine_env=env,
                                             engine_version=job.lm_eval_versions.get(model.name),
                                             lm_eval_versions=job.lm_eval_versions))
        log.info("lm-eval: tasks %s on %s", ", ".join(tasks), job.target.path)
        rows = {t: job.lm_eval_row(t) for t in tasks}
        try:
            scores = lmeval.run(lm_eval_cfg, job.target, model.name, args, tasks, int(job.cfg.seed))
        except Exception as e:
            for r in rows.values():
                job.record(r, "failed", reason=one_line(e))
            raise
    config = OmegaConf.to_container(lm_eval_cfg, resolve=True)
    for task, score in scores.items():
        job.record(rows[task], "ok", metrics=score["metrics"], lm_eval=score, lm_eval_config=config)
        log.info("lm-eval %s: %s", rows[task].scenario,
                 ", ".join(f"{k} {v:.4g}" for k, v in score["metrics"].items() if "stderr" not in k))


def _split_by_context(scenarios, limit):
    fit = [s for s in scenarios if not limit or s.max_len <= limit]
    unfit = [s for s in scenarios if s not in fit]
    if unfit and not fit:
        s = unfit[0]
        raise UserError(f"scenario {s.name} needs input_len + output_len = {s.max_len} tokens but "
                        f"max_model_len is {limit}; choose a shorter scenario or raise engine.args.max_model_len")
    return fit, unfit


def _start_engine(job: Job, with_accuracy: bool) -> Engine:
    args = dict(job.engine_cfg.get("args", {}))
    needed = [s.max_len for s in job.fit]
    if with_accuracy:
        needed.append(accuracy.needed_len(job.accuracy_cfg))
        for key, value in job.engine.logprob_args(int(job.accuracy_cfg.top_k)).items():
            args.setdefault(key, value)
    max_len = args.get("max_model_len") or min(max(needed), job.limit or max(needed))
    settings = {k: v for k, v in job.engine_cfg.items() if k not in ("name", "_target_", "impl", "args", "env")}
    # a batch scenario holds batch_size sequences at once; a load profile's concurrency is open-ended
    tokens = None if job.load else max([max_len] + [s.kv_tokens for s in job.fit])
    env = job.engine.sized_env(job.engine_cfg.get("env", {}), job.target, args, tokens)
    return job.engine(job.target, args, env, max_model_len=max_len,
                      trust_remote_code=job.cfg.trust_remote_code, settings=settings)


def _run_scenario(job: Job, engine: Engine, s: Scenario, pending: Pending) -> None:
    plan = job.plan
    log.info("scenario %s: batch %d, %d in / %d out tokens, %s warm-up + %s timed runs", s.name, s.batch_size,
             s.input_len, s.output_len, plan.warmup_runs if plan.warmup_runs is not None else "auto",
             len(pending.indices) if not plan.auto else
             f"auto ({plan.min_runs}-{plan.max_runs}, target ±{plan.target_ci_pct:g} %)")
    vocab = int(job.target.config.get("vocab_size") or 10000)

    def measure_all():
        warmups = _warm_up(job, engine, s, vocab)
        values = list(pending.prior)
        for i in pending.indices:
            metrics = _timed_run(job, engine, s, i, vocab)
            values.append(metrics[HEADLINE])
            record = plan.record(values, warmups)
            job.record(job.speed_row(s, i), "ok", metrics=metrics, precision=record)
            log.info("  run %d%s: %.1f tok/s out, latency %.2f s, TTFT %.0f ms%s", i + 1,
                     f" (auto, at most {plan.max_runs})" if plan.auto else f"/{plan.runs}", metrics[HEADLINE],
                     metrics["latency_s"], metrics["ttft_ms_mean"],
                     f", 95% CI ±{record['achieved_ci_pct']:.1f} %" if plan.auto and len(values) > 1 else "")
            if plan.stopped(values):
                log.info("  runs=auto: %s after %d runs", plan.stopped(values), len(values))
                break

    job.guarded(job.speed_row(s, None), measure_all)


def _warm_up(job: Job, engine: Engine, s: Scenario, vocab: int) -> int:
    """Untimed runs before the timed ones; with warmup_runs=auto, until the
    throughput is stable. Returns how many ran."""
    plan, seed = job.plan, job.cfg.seed
    if plan.warmup_runs is not None:
        for w in range(plan.warmup_runs):
            engine.run(prompts(s, seed, -1 - w, vocab), s.output_len)
        return plan.warmup_runs
    speeds = []
    while not precision.warmed_up(speeds, plan.warmup_tolerance_pct, plan.max_warmup_runs):
        start, timings = engine.run(prompts(s, seed, -1 - len(speeds), vocab), s.output_len)
        speeds.append(summarize(timings, start, job.target.model_bytes)[HEADLINE])
    log.info("  warm-up: %d runs (%s tok/s)", len(speeds), ", ".join(f"{v:.1f}" for v in speeds))
    return len(speeds)


def _timed_run(job: Job, engine: Engine, s: Scenario, i: int, vocab: int) -> dict:
    target = job.target
    with PeakMemory() as mem:
        start, timings = engine.run(prompts(s, job.cfg.seed, i, vocab), s.output_len)
    short = [t.output_tokens for t in timings if t.output_tokens != s.output_len]
    if short:
        raise RuntimeError(f"engine generated {short[0]} tokens instead of {s.output_len}")
    metrics = summarize(timings, start, target.model_bytes) | mem.as_metrics()
    metrics["model_bytes"] = target.model_bytes
    return metrics


def _score_accuracy(job: Job, logprob_pass: dict) -> None:
    row = job.accuracy_row()
    metrics = job.guarded(row, lambda: accuracy.score(logprob_pass, job.target, job.accuracy_cfg))
    job.record(row, "ok", metrics=metrics, accuracy_config=OmegaConf.to_container(job.accuracy_cfg, resolve=True))
    log.info("accuracy: perplexity %.2f (reference %.2f), KL %.4f nats, top-1 agreement %.3f, "
             "last-word %.3f", metrics["perplexity"], metrics["reference_perplexity"],
             metrics["kl_divergence"], metrics["top1_agreement"], metrics["lastword_accuracy"])


def prompts(s, seed: int, run_index: int, vocab: int) -> list[list[int]]:
    """Exactly input_len random token ids per request, fresh for every run
    (so prefix caching cannot serve a timed run from the warm-up), drawn below
    10000 as `vllm bench` does."""
    return scenario_mod.random_prompts([seed, run_index + 1000, s.batch_size, s.input_len],
                                       s.batch_size, s.input_len, vocab)


def _tokenizer(job: Job):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(job.target.path, trust_remote_code=job.cfg.trust_remote_code)


def _record(store, row: Row, status: str, **fields) -> None:
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results.append(store, row.but(status=status, timestamp=stamp, **fields))
