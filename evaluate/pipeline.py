"""One artifact x its scenarios x runs, in one engine, appended to the results store."""
import logging
from datetime import datetime, timezone

import numpy as np
from omegaconf import OmegaConf

from evaluate import accuracy, engines, lmeval, results, scenarios as scenario_mod, target as target_mod
from evaluate.memory import PeakMemory
from evaluate.metrics import summarize
from evaluate.results import Row
from quantize.common.errors import UserError
from quantize.common.jobs import describe_error, in_multirun
from quantize.common.paths import resolve
from quantize.common.provenance import hardware, versions

log = logging.getLogger("quantbench.evaluate")


def run(cfg) -> None:
    if int(cfg.runs) < 1:
        raise UserError(f"runs={cfg.runs}: need at least one timed run (runs=3 is typical)")
    store = results.shard_path(resolve(cfg.results_dir), shard=bool(cfg.results_per_process))
    results.check_writable(store)  # before any measurement that could not be stored
    target = _load_target(cfg, store)
    engine_cfg = OmegaConf.to_container(cfg.engine, resolve=True)
    engine_cls = engines.get(engine_cfg["name"])
    args = engine_cfg["args"]
    engines.check_args(engine_cls, args)
    machine = engine_cls.machine()
    args["dtype"] = engine_cls.choose_dtype(target.format, machine, args.get("dtype") or "auto")
    limit = args.get("max_model_len") or target.max_context
    fit, unfit = _split_by_context(scenario_mod.resolve(cfg.scenario), limit)
    acc = cfg.accuracy if cfg.accuracy.get("enabled") else None
    if acc:
        accuracy.validate(acc, target, args.get("max_model_len"))
    lm = cfg.lm_eval if cfg.lm_eval.get("enabled") else None
    lm_versions = lmeval.validate(lm) if lm else None

    where = {"versions": versions(), "hardware": hardware()}
    # engine_args/env as configured; a started engine replaces them with what it used.
    base = Row(kind="speed", **target.as_row(), engine=engine_cfg["name"], engine_args=args,
               engine_env=engine_cfg.get("env", {}), **where, machine=machine.facts(),
               setup_id=results.setup_id(engine_cfg, **where))
    verdict = engine_cls.supports(target.format, machine, args)
    if not verdict:
        _unsupported(cfg, store, base, target, verdict, fit, acc, lm)
        return
    done = results.completed_keys(store.parent) if cfg.skip_completed else set()
    for s in unfit:
        reason = f"needs {s.max_len} tokens, max_model_len is {limit}"
        _record(store, _speed_row(base, s, None), "skipped", reason=reason)
        log.warning("skipping scenario %s: %s", s.name, reason)
    todo = {s: [i for i in range(int(cfg.runs)) if _speed_row(base, s, i).run_key() not in done]
            for s in fit}
    todo = {s: runs for s, runs in todo.items() if runs}
    acc_todo = acc is not None and _accuracy_row(base, acc).run_key() not in done
    lm_todo = [t for t in (lm.tasks if lm else []) if lmeval.row(base, lm, t).run_key() not in done]
    if not todo and not acc_todo and not lm_todo:
        log.info("every requested run of %s is already in %s: nothing to do", target.artifact_id, store.parent)
        return
    if todo or acc_todo:
        _evaluate_in_engine(cfg, engine_cfg, target, fit, todo, acc if acc_todo else None, limit, base, store)
    if lm_todo:
        _run_lm_eval(cfg, lm, engine_cfg, target, lm_todo, lm_versions, base, store)
    log.info("results appended to %s", store)


def _load_target(cfg, store):
    """The artifact; in a sweep, one that cannot be opened still leaves a
    failed row, so the report never shows the sweep as all good."""
    try:
        return target_mod.load(cfg)
    except UserError as e:
        if in_multirun():
            row = Row(kind="speed", model_name=cfg.model.get("name"),
                      recipe=cfg.recipe.name if cfg.get("recipe") else None, engine=cfg.engine.name,
                      scenario=cfg.scenario.get("name"))
            _record(store, row, "failed", reason=str(e))
        raise


def _unsupported(cfg, store, base, target, verdict, fit, acc, lm) -> None:
    """The engine cannot serve this format here. Asked alone: one line and a
    non-zero exit. In a scenario set or a sweep: an `unsupported` row per
    measurement it was meant to make (once per setup), and the sweep goes on."""
    message = f"{base.engine} cannot serve {target.format.label} ({target.path.name}) here: {verdict.reason}"
    if not (in_multirun() or scenario_mod.is_set(cfg.scenario)):
        raise UserError(message)
    log.warning("unsupported: %s", message)
    rows = [_speed_row(base, s, None) for s in fit] + ([_accuracy_row(base, acc)] if acc else [])
    rows += [lmeval.row(base, lm, t) for t in (lm.tasks if lm else [])]
    known = results.completed_keys(store.parent, statuses=("unsupported",))
    for row in rows:
        if row.run_key() not in known:
            _record(store, row, "unsupported", reason=verdict.reason)


def _evaluate_in_engine(cfg, engine_cfg, target, fit, todo, acc, limit, base, store) -> None:
    """Speed scenarios, then the accuracy pass, in one engine; the accuracy
    reference is scored after the engine is closed."""
    try:
        engine = _start_engine(engine_cfg, target, fit, acc, limit, cfg.trust_remote_code)
    except Exception as e:  # every measurement this job owed is recorded as failed
        reason = f"engine start-up failed: {one_line(e)}"
        for s in todo:
            _record(store, _speed_row(base, s, None), "failed", reason=reason)
        if acc:
            _record(store, _accuracy_row(base, acc), "failed", reason=reason)
        raise
    base = base.but(**engine.describe())
    passed = None
    try:
        for s, run_indices in todo.items():
            _run_scenario(engine, s, run_indices, cfg, base, store, target)
        if acc:
            passed = _guarded(store, _accuracy_row(base, acc), lambda: accuracy.engine_pass(
                engine, acc, _tokenizer(target, cfg), int(cfg.seed)))
    finally:
        engine.close()  # before the accuracy reference loads: no competition for cores or memory
    if passed:
        _score_accuracy(passed, target, acc, _accuracy_row(base, acc), store)


def _run_lm_eval(cfg, lm, engine_cfg, target, tasks, lm_versions, base, store) -> None:
    """lm-eval's own vLLM engine, in its own environment; one row per task."""
    from evaluate.engines.vllm import apply_env, on_cpu
    args = lmeval.model_args(engine_cfg["args"], lm, cfg.trust_remote_code, on_cpu())
    base = base.but(engine_args=args, engine_env=apply_env(engine_cfg.get("env", {})),
                    engine_version=lm_versions.get("vllm"), lm_eval_versions=lm_versions)
    log.info("lm-eval: tasks %s on %s", ", ".join(tasks), target.path)
    rows = {t: lmeval.row(base, lm, t) for t in tasks}
    try:
        scores = lmeval.run(lm, target, args, tasks, int(cfg.seed))
    except Exception as e:
        for r in rows.values():
            _record(store, r, "failed", reason=one_line(e))
        raise
    lm_config = OmegaConf.to_container(lm, resolve=True)
    for task, score in scores.items():
        _record(store, rows[task], "ok", metrics=score["metrics"], lm_eval=score, lm_eval_config=lm_config)
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


def _start_engine(engine_cfg, target, fit, acc, limit, trust_remote_code):
    args = dict(engine_cfg.get("args", {}))
    needed = [s.max_len for s in fit]
    if acc:
        needed.append(accuracy.needed_len(acc))
        if int(acc.top_k) > 20 and engine_cfg["name"] == "vllm":
            args.setdefault("max_logprobs", int(acc.top_k))
    max_len = args.get("max_model_len") or min(max(needed), limit or max(needed))
    return engines.get(engine_cfg["name"])(target, args, engine_cfg.get("env", {}),
                                           max_model_len=max_len, trust_remote_code=trust_remote_code)


def _run_scenario(engine, s, run_indices, cfg, base, store, target) -> None:
    log.info("scenario %s: batch %d, %d in / %d out tokens, %d warm-up + %d timed runs",
             s.name, s.batch_size, s.input_len, s.output_len, cfg.warmup_runs, len(run_indices))
    vocab = int(target.config.get("vocab_size") or 10000)

    def measure_all():
        for w in range(int(cfg.warmup_runs)):
            engine.run(prompts(s, cfg.seed, -1 - w, vocab), s.output_len)
        for i in run_indices:
            with PeakMemory() as mem:
                start, timings = engine.run(prompts(s, cfg.seed, i, vocab), s.output_len)
            short = [t.output_tokens for t in timings if t.output_tokens != s.output_len]
            if short:
                raise RuntimeError(f"engine generated {short[0]} tokens instead of {s.output_len}")
            metrics = summarize(timings, start, target.model_bytes) | mem.as_metrics()
            metrics["model_bytes"] = target.model_bytes
            _record(store, _speed_row(base, s, i), "ok", metrics=metrics)
            log.info("  run %d/%d: %.1f tok/s out, latency %.2f s, TTFT %.0f ms", i + 1, cfg.runs,
                     metrics["output_throughput"], metrics["latency_s"], metrics["ttft_ms_mean"])

    _guarded(store, _speed_row(base, s, None), measure_all)


def _score_accuracy(passed, target, acc, row, store) -> None:
    metrics = _guarded(store, row, lambda: accuracy.score(passed, target, acc))
    _record(store, row, "ok", metrics=metrics, accuracy_config=OmegaConf.to_container(acc, resolve=True))
    log.info("accuracy: perplexity %.2f (reference %.2f), KL %.4f nats, top-1 agreement %.3f, "
             "last-word %.3f", metrics["perplexity"], metrics["reference_perplexity"],
             metrics["kl_divergence"], metrics["top1_agreement"], metrics["lastword_accuracy"])


def prompts(s, seed: int, run_index: int, vocab: int) -> list[list[int]]:
    """Exactly input_len random token ids per request, fresh for every run
    (so prefix caching cannot serve a timed run from the warm-up), drawn below
    10000 as `vllm bench` does."""
    rng = np.random.default_rng([int(seed), run_index + 1000, s.batch_size, s.input_len])
    return rng.integers(0, min(vocab, 10000), size=(s.batch_size, s.input_len)).tolist()


def _tokenizer(target, cfg):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(target.path, trust_remote_code=cfg.trust_remote_code)


def _speed_row(base: Row, s, run_index) -> Row:
    return base.but(kind="speed", **s.as_row(), run_index=run_index)


def _accuracy_row(base: Row, acc) -> Row:
    return base.but(kind="accuracy", scenario=acc.name, dataset=acc.name, batch_size=None,
                    input_len=None, output_len=None, run_index=0)


def _record(store, row: Row, status: str, **fields) -> None:
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results.append(store, row.but(status=status, timestamp=stamp, **fields))


def one_line(e: BaseException, limit: int = 400) -> str:
    """The job's description of a failure, cut to one line for a result row
    (engines raise screenfuls)."""
    text = next((line.strip() for line in describe_error(e).splitlines() if line.strip()), type(e).__name__)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _guarded(store, row, fn):
    """Run fn; on failure record a failed row (the sweep summary and the report
    show it) and re-raise."""
    try:
        return fn()
    except Exception as e:
        _record(store, row, "failed", reason=one_line(e))
        raise
