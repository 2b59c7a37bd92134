"""One artifact x its scenarios x runs, in one engine, appended to the results store.

This module orchestrates: it plans the job from the typed EvaluateConfig
(evaluate.config), starts the engine and hands each scenario to its room,
evaluate.batch (timed batch runs) or evaluate.serving (load profiles), then
accuracy and lm-eval."""
import logging
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from evaluate import accuracy, batch, engines, hardware, lifeline, lmeval, results, scenarios, store_lock, target, tracking
from evaluate.accuracy import AccuracyConfig
from evaluate.config import EvaluateConfig
from evaluate.engines import Engine, EngineConfig, LmEvalModel
from evaluate.formats import Verdict
from evaluate.lmeval import LmEvalConfig
from evaluate.precision import RunPlan
from evaluate.results import Row
from evaluate.scenarios import Scenario
from evaluate.serving import run as serving
from evaluate.serving.profiles import LoadProfile
from evaluate.serving.slo import SLO
from evaluate.target import Target
from quantize.common import hf_load, provenance
from quantize.common.errors import (DiskFull, EngineDied, Interrupted, OneLineError, RunsFailed, UserError,
                                    is_no_room)
from quantize.common.jobs import in_multirun, interrupted, job_command, keep_trace, one_line, time_limit_reached
from quantize.common.paths import resolve
from quantize.common.settings import is_integer

log = logging.getLogger("quantbench.evaluate")


@dataclass(frozen=True)
class Job:
    """What the steps of one evaluate job share, decided before any engine starts."""
    config: EvaluateConfig               # what the command line asked for
    seed: int                            # prompt token ids are drawn from it (+ run index)
    plan: RunPlan                        # how many warm-up and timed runs (fixed or auto)
    target: Target
    store: Path                          # the results file rows are appended to
    engine: type[Engine]
    engine_cfg: EngineConfig             # the engine config, its args resolved and dtype chosen
    limit: int | None                    # the context every scenario must fit in
    fit: list[Scenario]                  # the scenarios that fit
    base: Row                            # what every row of the job holds (replaced once an engine describes itself)
    accuracy_cfg: AccuracyConfig | None  # None: accuracy=none
    lm_eval_cfg: LmEvalConfig | None     # None: lm_eval=none
    lm_eval_model: LmEvalModel | None    # how lm-eval runs this engine
    lm_eval_versions: dict | None        # of the lm-eval environment
    load: LoadProfile | None = None      # the load profile (conf/load/); None: batch timed runs
    slo: SLO | None = None               # the SLO the serving rows are judged against
    failed: list[str] = field(default_factory=list)  # the reasons of the failed rows this job recorded
    recorded: list[Row] = field(default_factory=list)  # the rows this job recorded, oldest first

    def speed_row(self, s: Scenario, run_index: int | None) -> Row:
        return self.base.but(kind="speed", **s.as_row(), run_index=run_index)

    def scenario_row(self, s: Scenario) -> Row:
        """The row that stands for a scenario's measurements (skipped, unsupported)."""
        return serving.serving_row(self, s, None) if self.load else self.speed_row(s, None)

    def accuracy_row(self) -> Row:
        name = self.accuracy_cfg.name
        return self.base.but(kind="accuracy", scenario=name, dataset=name, batch_size=None,
                             input_len=None, output_len=None, run_index=0,
                             accuracy_config=self.accuracy_cfg.as_dict())

    def lm_eval_row(self, task: str) -> Row:
        row = lmeval.row(self.base, self.lm_eval_cfg, task, engine=self.lm_eval_model.name)
        return row.but(lm_eval_versions=self.lm_eval_versions)

    def lm_eval_tasks(self) -> list[str]:
        return list(self.lm_eval_cfg.tasks) if self.lm_eval_cfg else []

    def record(self, row: Row, status: str, **fields) -> None:
        recorded = _record(self.store, row, status, **fields)
        if status == "failed":
            self.failed.append(fields.get("reason") or "no reason given")
        # after the store: it holds the row either way; its run's status counts this job's earlier rows
        tracking.log_rows(self.config.tracker, [recorded], earlier=self.recorded)
        self.recorded.append(recorded)

    def guarded(self, row: Row, what: str, fn):
        """Run fn; on failure record a failed row (the sweep summary and the
        report show it), then re-raise a failure that ends the job, or go on
        (None) past one of `what`'s own."""
        try:
            return fn()
        except Exception as e:
            self.record(row, "failed", reason=one_line(e))
            if _ends_job(e):
                raise _as_ending(e)
            _went_on(what, e)
            return None


def run(config: EvaluateConfig) -> None:
    """Measure what `config` asks for that the results store lacks."""
    job, unfit, verdict = _plan(config)
    if not verdict:
        _unsupported(job, verdict)
        return
    if not job.target.built:  # servable, so quantizing it is what is missing
        _record_unloadable(config, job.store, job.target.not_built)
        raise job.target.not_built
    if verdict.reason:  # served, with a caveat the rows' numbers depend on
        log.warning("%s serves %s with a note: %s", job.engine.name, job.target.format.label, verdict.reason)
    store = job.store
    _track_stored(job)
    stored = [r for r in results.read(store.parent) if r.ok] if config.skip_completed else []
    done = {r.run_key() for r in stored}
    _skip(job, unfit)
    todo = {s: _pending(job, s, stored) for s in job.fit}
    todo = {s: pending for s, pending in todo.items() if pending.owed}
    accuracy_todo = job.accuracy_cfg is not None and job.accuracy_row().run_key() not in done
    lm_eval_todo = [t for t in job.lm_eval_tasks() if job.lm_eval_row(t).run_key() not in done]
    if not todo and not accuracy_todo and not lm_eval_todo:
        log.info("every requested run of %s is already in %s: nothing to do", job.target.artifact_id, store.parent)
        return
    if todo or accuracy_todo:
        _evaluate_in_engine(job, todo, accuracy_todo)
    if lm_eval_todo:
        with ExitStack() as held:  # in name order: two processes never hold one task each and wait for the other
            holds = {t: held.enter_context(_lock(job, job.lm_eval_row(t), f"lm-eval task {t}"))
                     for t in sorted(lm_eval_todo)}
            owed = [t for t in lm_eval_todo if _owed_now(job, job.lm_eval_row(t), f"lm-eval task {t}", holds[t])]
            if owed:
                _run_lm_eval(job, owed)
    log.info("results appended to %s", store)
    if job.failed:
        raise RunsFailed(f"{len(job.failed)} run(s) failed while the others were measured (the first: "
                         f"{job.failed[0]}); they are recorded failed in {store}: once the cause is fixed, the "
                         "same command measures only them")


def _skip(job: Job, unfit: list[Scenario]) -> None:
    """A `skipped` row for each scenario too long for the context, once per
    setup: a rerun says why again but appends no second row."""
    if not unfit:
        return
    known = results.completed_keys(job.store.parent, statuses=("skipped",))
    for s in unfit:
        reason = f"needs {s.max_len} tokens, max_model_len is {job.limit}"
        row = job.scenario_row(s)
        if row.run_key() not in known:
            job.record(row, "skipped", reason=reason)
        log.warning("skipping scenario %s: %s", s.name, reason)


def _track_stored(job: Job) -> None:
    """The store's rows of this artifact and setup into the tracker: what an
    earlier attempt (killed, requeued) stored but had not logged; a row logged
    before adds nothing. A first run finds no rows and makes no call."""
    if job.config.tracker:
        tracking.log_rows(job.config.tracker, [r for r in results.read(job.store.parent)
                                               if r.artifact_id == job.target.artifact_id
                                               and r.setup_id == job.base.setup_id])


def _pending(job: Job, s: Scenario, stored: list[Row]):
    """What scenario `s` owes, given the ok rows `stored`: a load profile's
    levels, or batch timed runs."""
    return serving.LoadPending(job, s, stored) if job.load else batch.pending_runs(job, s, stored)


def _lock(job: Job, row: Row, what: str):
    """One writer per measurement: the lock of `row`'s measurement in the job's store."""
    return store_lock.measurement(job.store.parent, row.measurement_key(), what)


def _stored_ok(job: Job) -> list[Row]:
    return [r for r in results.read(job.store.parent) if r.ok] if job.config.skip_completed else []


def _still_pending(job: Job, s: Scenario, planned, hold: store_lock.Hold):
    """What scenario `s` owes now that this process holds its lock: another
    process on the store may have measured some or all of it since this job
    planned (runs=auto continues from its runs)."""
    if not job.config.skip_completed:  # measured again, as asked, one process at a time
        _say_owed(f"scenario {s.name}", hold, True)
        return planned
    now = _pending(job, s, _stored_ok(job))
    _say_owed(f"scenario {s.name}", hold, now.owed)
    return now


def _owed_now(job: Job, row: Row, what: str, hold: store_lock.Hold) -> bool:
    """Whether `row` (one accuracy pass or lm-eval task) is still owed now
    that this process holds its lock."""
    owed = row.run_key() not in {r.run_key() for r in _stored_ok(job)}
    _say_owed(what, hold, owed)
    return owed


def _say_owed(what: str, hold: store_lock.Hold, owed: bool) -> None:
    """One line when another process on the store changed what this one
    measures: it skips what that process completed, or measures what it left."""
    if not owed:
        by = f"{hold.holder} while this process waited {hold.waited_s:.1f} s" if hold.waited else \
            "another process since this job planned"
        log.info("%s: skipped, complete in the store (measured by %s)", what, by)
    elif hold.waited:
        log.info("%s: waited %.1f s for %s; measuring what the store still lacks", what, hold.waited_s,
                 hold.holder)


def comparison_id(engine_cfg: EngineConfig, versions: dict, hardware: dict) -> str:
    """A row's comparison_id: the setup id of the engine config as configured,
    before the engine resolves its `auto` values (the search's trials look
    their rows up by it: evaluate.search.speed.evaluate_setup)."""
    return results.setup_id(engines.identity(engine_cfg, engine_cfg.engine), versions, hardware)


def _plan(config: EvaluateConfig) -> tuple[Job, list[Scenario], Verdict]:
    """Every check that needs no engine, in the order bad input is reported:
    the job, the scenarios too long for the context, and whether the engine
    can serve the target here."""
    store = results.shard_path(resolve(config.results_dir), shard=config.results_per_process)
    _refuse_model_code(config, store)
    results.check_writable(store)  # before any measurement that could not be stored
    wanted = scenarios.resolve(config.scenario)  # a missing scenario file: before the weights are read, checked
    opened = target.as_recorded(_load_target(config, store), results.read(store.parent))
    engine_cfg = replace(config.engine, args=dict(config.engine.args))  # its args get resolved below
    engine, name, args = engine_cfg.engine, engine_cfg.name, engine_cfg.args
    # the scenarios and accuracy settings first: the engine's checks may import it (vLLM: ~6 s)
    limit = _context_limit(opened, args.get("max_model_len"))
    fit, unfit = _split_by_context(wanted, limit, opened.max_context)
    load, slo = serving.configure(config.load, config.slo, engine, name), config.slo
    if not load:  # a load profile's requests are not one batch
        config.limits.check_batch_sizes(fit)
    if config.accuracy:
        if not engine.has_prompt_logprobs:
            raise UserError(f"engine={name} gives no prompt logprobs, so it cannot measure accuracy; "
                            "pass accuracy=none")
        accuracy.validate(config.accuracy, opened, args.get("max_model_len"))
    engines.check_args(engine, args, name)
    args.update(engine.resolve_args(args, opened.config))  # e.g. tensor_parallel_size=auto -> 4: rows, setup id
    problem = engine.config_problem(opened.config, args)
    if problem:
        raise UserError(problem)
    machine = engine.machine()
    mismatch = hardware.mismatch(config.hardware, machine)
    if mismatch:
        log.warning("%s", mismatch)
    args["dtype"] = engine.choose_dtype(opened.format, machine, args)
    if not load:
        config.limits.check_batch_tokens(fit, opened, args, machine, engine)
    lm_eval_model, lm_eval_versions = _plan_lm_eval(config, engine, args)
    where = {"versions": provenance.versions(), "hardware": provenance.hardware()}
    verdict = engine.supports(opened.format, machine, args)
    # engine_args/env as configured; a started engine replaces them with what it used.
    base = Row(kind="speed", **opened.as_row(), seed=config.seed, engine=name, engine_args=args,
               engine_env=engine_cfg.env, **where, machine=machine.facts() | provenance.gpu_runtime(),
               hardware_defaults=config.hardware,
               kv_quant=engine.kv_quant(opened.format, args),
               serving_note=(verdict.reason or None) if verdict else None,
               setup_id=results.setup_id(engines.identity(engine_cfg, engine), **where),
               comparison_id=comparison_id(config.engine, **where),
               repro=_repro(opened))
    tracking.bind(config.tracker, store.parent)
    job = Job(config=config, seed=config.seed, plan=config.plan, target=opened, store=store, engine=engine,
              engine_cfg=engine_cfg, limit=limit, fit=fit, base=base, accuracy_cfg=config.accuracy,
              lm_eval_cfg=config.lm_eval, lm_eval_model=lm_eval_model, lm_eval_versions=lm_eval_versions,
              load=load, slo=slo)
    return job, unfit, verdict


def _plan_lm_eval(config: EvaluateConfig, engine: type[Engine], args: dict):
    """(how lm-eval runs the engine, the lm-eval environment's versions), both
    None for lm_eval=none."""
    if not config.lm_eval:
        return None, None
    model = engine.lm_eval_model(args)
    if model is None:
        raise UserError(f"lm-eval cannot run engine={config.engine.name}; pass lm_eval=none, or an engine "
                        "lm-eval can run (engine=vllm)")
    return model, lmeval.validate(config.lm_eval, model.name)


def _repro(target: Target) -> str | None:
    """The commands that give this job's rows again: build the artifact (a
    no-op while it is complete), then evaluate it."""
    evaluate = job_command("evaluate")
    build = target.manifest.command if target.manifest else None
    return f"{build} && {evaluate}" if build and evaluate else evaluate


def _load_target(config: EvaluateConfig, store: Path) -> Target:
    """The artifact; in a sweep, one that cannot be opened still leaves a
    failed row, so the report never shows the sweep as all good."""
    try:
        return target.load(config.target)
    except target.NotBuilt as e:
        # Not quantized: if the engine cannot serve it here anyway, say that instead.
        planned = target.planned(config.target, e)
        if planned:
            return planned
        _record_unloadable(config, store, e)
        raise
    except UserError as e:
        _record_unloadable(config, store, e)
        raise


def _refuse_model_code(config: EvaluateConfig, store: Path) -> None:
    """A folder that names code to run (the target, or the accuracy
    reference given), before the store is made and the target's weights are
    checked: a refusal writes nothing (in a sweep, only its failed row)."""
    try:
        target.refuse_model_code(config.target)
        reference = resolve(config.accuracy.reference) if config.accuracy and config.accuracy.reference else None
        if reference and (reference / "config.json").is_file():
            hf_load.refuse_model_code(reference)
    except UserError as e:
        _record_unloadable(config, store, e)
        raise


def _record_unloadable(config: EvaluateConfig, store: Path, e: UserError) -> None:
    if in_multirun():
        row = Row(kind="speed", model_name=config.target.model_name, recipe=config.target.recipe_name,
                  engine=config.engine.name, scenario=getattr(config.scenario, "name", None),
                  hardware_defaults=config.hardware)
        recorded = _record(store, row, "failed", reason=str(e))
        tracking.log_rows(tracking.bind(config.tracker, store.parent), [recorded])


def _unsupported(job: Job, verdict) -> None:
    """The engine cannot serve this format here. Asked alone: one line and a
    non-zero exit. In a scenario set or a sweep: an `unsupported` row per
    measurement it was meant to make (once per setup), and the sweep goes on."""
    opened = job.target
    what = opened.path.name if opened.built else f"{opened.recipe}, not quantized"
    message = f"{job.base.engine} cannot serve {opened.format.label} ({what}) here: {verdict.reason}"
    if not (in_multirun() or scenarios.is_set(job.config.scenario)):
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
    with ExitStack() as held:  # the accuracy lock: from its engine pass until its row is scored
        try:
            job = replace(job, base=job.base.but(**engine.describe()))
            _measure_scenarios(job, engine, todo, with_accuracy)
            if with_accuracy:
                row = job.accuracy_row()
                if _owed_now(job, row, "accuracy pass", held.enter_context(_lock(job, row, "accuracy pass"))):
                    logprob_pass = job.guarded(row, "accuracy pass", lambda: accuracy.engine_pass(
                        engine, job.accuracy_cfg, _tokenizer(job), job.seed))
        finally:
            engine.close()  # before the accuracy reference loads: no competition for cores or memory
        if logprob_pass:
            _score_accuracy(job, logprob_pass)


def _measure_scenarios(job: Job, engine: Engine, todo: dict, with_accuracy: bool) -> None:
    """Each scenario under its lock, measuring what the store still lacks
    once this process holds it. A scenario that fails on its own (a CUDA OOM
    at its batch size, a request refused) leaves its failed rows and the
    next goes on. A failure that ends the job (_ends_job) leaves a failed row
    for every run still owed: the scenario records its own, the ones after
    it are recorded here."""
    for i, (s, pending) in enumerate(todo.items()):
        with _lock(job, job.scenario_row(s), f"scenario {s.name}") as hold:
            pending = _still_pending(job, s, pending, hold)
            if not pending.owed:
                continue
            failed = len(job.failed)
            try:
                pending.measure(job, engine, s)
            except Exception as e:
                if _ends_job(e):
                    _record_owed(job, dict(list(todo.items())[i + 1:]), with_accuracy, one_line(e))
                    raise _as_ending(e)
                if len(job.failed) == failed:  # it failed before recording any row: one stands for it
                    job.record(job.scenario_row(s), "failed", reason=one_line(e))
                _went_on(f"scenario {s.name}", e)


# Text of the device errors after which every later kernel fails alike (an
# illegal memory access, a device-side assert, a lost GPU); an out-of-memory
# one leaves the device usable.
DEVICE_LOST = ("CUDA error", "HIP error")
DEVICE_DIED = ("the GPU failed mid-run ({error}): every later kernel fails alike, so the job stopped; the runs it "
               "owed are recorded failed, and the same command measures them once the GPU works again "
               "(nvidia-smi; its driver log: dmesg | tail)")


def _device_lost(e: Exception) -> bool:
    text = str(e)
    return any(t in text for t in DEVICE_LOST) and "out of memory" not in text


def _ends_job(e: Exception) -> bool:
    """Whether nothing more can be measured after `e`: the engine died (its
    core, its server, a stall), the device is lost, there is no room for the
    rows, Ctrl-C, or the launcher's time-limit warning (the job has its grace
    period left to record what it owed). Anything else is the failure of one measurement alone."""
    return (isinstance(e, (EngineDied, DiskFull, Interrupted)) or interrupted() or is_no_room(e) or _device_lost(e)
            or time_limit_reached(e))


def _as_ending(e: Exception) -> Exception:
    """The error a job that `e` ends (_ends_job) ends with: a lost device as
    EngineDied, exit 3, the way vLLM's dead engine core ends it (an engine in
    this process, engine=hf, dies with its device); any other as it is."""
    if isinstance(e, OneLineError) or not _device_lost(e):
        return e
    died = EngineDied(DEVICE_DIED.format(error=one_line(e)))
    died.__cause__ = e   # its trace goes to the log file
    return died


def _went_on(what: str, e: Exception) -> None:
    """One line for a failure of `what` alone (its trace in the log file):
    the job goes on, ends non-zero (RunsFailed) once the rest is measured,
    and a rerun measures the failed rows again."""
    keep_trace(e)
    log.error("%s failed: %s; going on", what, one_line(e))


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
    with job.engine.environment(job.engine_cfg.env, model.args) as env, lifeline.hold():  # its vLLM dies with us
        job = replace(job, base=job.base.but(engine_args=args, engine_env=env,
                                             engine_version=job.lm_eval_versions.get(model.name),
                                             lm_eval_versions=job.lm_eval_versions))
        log.info("lm-eval: tasks %s on %s", ", ".join(tasks), job.target.path)
        rows = {t: job.lm_eval_row(t) for t in tasks}
        try:
            scores, missing = lmeval.run(lm_eval_cfg, job.target, model.name, args, tasks, job.seed,
                                         on_cpu=not (job.base.machine or {}).get("cuda"))   # the machine the engine decided on
        except Exception as e:
            for r in rows.values():
                job.record(r, "failed", reason=one_line(e))
            raise
    for task in tasks:
        if (score := scores.get(task)) is None:   # its own failure: the other tasks keep their scores
            job.record(rows[task], "failed", reason=missing[task])
            continue
        job.record(rows[task], "ok", metrics=score["metrics"], lm_eval=score)
        log.info("lm-eval %s: %s", rows[task].scenario,
                 ", ".join(f"{k} {v:.4g}" for k, v in score["metrics"].items() if "stderr" not in k))


def _context_limit(target: Target, max_model_len) -> int | None:
    """The context every scenario must fit in: engine.args.max_model_len, else
    the model's. A max_model_len past the positions the model covers is
    refused: tokens there sit on positions it never learned, and an engine
    that does not check (hf) would record their speed as ok."""
    positions = target.max_context
    if max_model_len is not None and not (is_integer(max_model_len) and max_model_len >= 1):
        # (vLLM's own -1, "fit what memory allows", leaves no context to check scenarios against)
        raise UserError(f"engine.args.max_model_len={max_model_len}: pass an integer >= 1, or null for the longest "
                        "scenario's length, capped at the model's context")
    if max_model_len and positions and max_model_len > positions:
        raise UserError(f"engine.args.max_model_len={max_model_len} is past the {positions} positions of "
                        f"{target.path.name} (the positions its config.json declares, no rope_scaling beyond "
                        f"them); pass at most engine.args.max_model_len={positions}, or a checkpoint "
                        "whose config.json declares rope_scaling for the longer context")
    return max_model_len or positions


def _split_by_context(scenarios, limit, positions):
    """(the scenarios that fit in `limit` tokens, those that do not); none
    fitting is one line naming the fix, which never points past the model's
    `positions`."""
    fit = [s for s in scenarios if not limit or s.max_len <= limit]
    unfit = [s for s in scenarios if s not in fit]
    if unfit and not fit:
        s = unfit[0]
        raise UserError(f"scenario {s.name} needs input_len + output_len = {s.max_len} tokens but "
                        f"max_model_len is {limit}; {_longer_context_fix(s.max_len, positions)}")
    return fit, unfit


def _longer_context_fix(needed: int, positions: int | None) -> str:
    if positions is None:  # config.json does not say: the engine will
        return "choose a shorter scenario or raise engine.args.max_model_len"
    if needed > positions:
        return f"choose a shorter scenario: the model has {positions} positions"
    return f"choose a shorter scenario, or raise engine.args.max_model_len to {needed} (at most {positions})"


def _start_engine(job: Job, with_accuracy: bool) -> Engine:
    args = dict(job.engine_cfg.args)
    needed = [s.max_len for s in job.fit]
    if with_accuracy:
        needed.append(accuracy.needed_len(job.accuracy_cfg))
        for key, value in job.engine.logprob_args(int(job.accuracy_cfg.top_k)).items():
            args.setdefault(key, value)
    max_len = args.get("max_model_len") or min(max(needed), job.limit or max(needed))
    # a batch scenario holds batch_size sequences at once; a load profile's concurrency is open-ended
    tokens = None if job.load else max([max_len] + [s.kv_tokens for s in job.fit])
    env = job.engine.sized_env(job.engine_cfg.env, job.target, args, tokens)
    return job.engine(job.target, args, env, max_model_len=max_len, settings=job.engine_cfg.settings)


def _score_accuracy(job: Job, logprob_pass: dict) -> None:
    row = job.accuracy_row()
    scores = job.guarded(row, "accuracy scoring", lambda: accuracy.score(logprob_pass, job.target, job.accuracy_cfg))
    if scores is None:
        return
    job.record(row, "ok", metrics=scores.metrics, accuracy_samples=scores.samples)
    metrics = scores.metrics
    log.info("accuracy: perplexity %.2f (reference %.2f), KL %.4f nats, top-1 agreement %.3f, "
             "last-word %.3f", metrics["perplexity"], metrics["reference_perplexity"],
             metrics["kl_divergence"], metrics["top1_agreement"], metrics["lastword_accuracy"])


def _tokenizer(job: Job):
    return hf_load.tokenizer(job.target.path)


def _record(store, row: Row, status: str, **fields) -> Row:
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    recorded = row.but(status=status, timestamp=stamp, **fields)
    results.append(store, recorded)
    return recorded
