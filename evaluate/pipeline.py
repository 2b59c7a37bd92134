"""One artifact x its scenarios x runs, in one engine, appended to the results store."""
import logging
from datetime import datetime, timezone

import numpy as np
from omegaconf import OmegaConf

from evaluate import engines, results, scenarios as scenario_mod, target as target_mod
from evaluate.memory import PeakMemory
from evaluate.metrics import summarize
from quantize.errors import UserError
from quantize.paths import resolve
from quantize.provenance import hardware, versions

log = logging.getLogger("quantbench.evaluate")


def run(cfg) -> None:
    if int(cfg.runs) < 1:
        raise UserError(f"runs={cfg.runs}: need at least one timed run (runs=3 is typical)")
    target = target_mod.load(cfg)
    scenarios = scenario_mod.resolve(cfg.scenario)
    engine_cfg = OmegaConf.to_container(cfg.engine, resolve=True)
    limit = engine_cfg["args"].get("max_model_len") or target.max_context
    fit = [s for s in scenarios if not limit or s.max_len <= limit]
    unfit = [s for s in scenarios if s not in fit]
    if unfit and not fit:
        s = unfit[0]
        raise UserError(f"scenario {s.name} needs input_len + output_len = {s.max_len} tokens but "
                        f"max_model_len is {limit}; choose a shorter scenario or raise engine.args.max_model_len")

    store = results.shard_path(resolve(cfg.results_dir))
    done = results.completed_keys(store.parent) if cfg.skip_completed else set()
    base = {"kind": "speed", **target.as_row(), "engine": engine_cfg["name"],
            "versions": versions(), "hardware": hardware()}
    for s in unfit:
        _append(store, base, s, None, status="skipped",
                reason=f"needs {s.max_len} tokens, max_model_len is {limit}")
        log.warning("skipping scenario %s: needs %d tokens, max_model_len is %d", s.name, s.max_len, limit)

    todo = {s: [i for i in range(int(cfg.runs)) if results.run_key(_key(base, s, i)) not in done]
            for s in fit}
    todo = {s: runs for s, runs in todo.items() if runs}
    acc = cfg.accuracy if cfg.accuracy.get("enabled") else None
    if acc:
        from evaluate import accuracy
        accuracy.validate(acc, target)
    acc_row = {**base, **_accuracy_key(acc)} if acc else None
    acc_todo = acc is not None and results.run_key(acc_row) not in done
    if not todo and not acc_todo:
        log.info("every requested run of %s is already in %s: nothing to do", target.artifact_id, store.parent)
        return
    args = dict(engine_cfg.get("args", {}))
    # Prompt-logprob requests need their prompt plus one generated token.
    needed = [s.max_len for s in fit] + ([int(acc.window_len) + 1, int(acc.lastword.context_tokens) + 16] if acc else [])
    if acc and int(acc.top_k) > 20 and engine_cfg["name"] == "vllm":
        args.setdefault("max_logprobs", int(acc.top_k))
    engine = engines.get(engine_cfg["name"])(
        target, args, engine_cfg.get("env", {}),
        max_model_len=args.get("max_model_len") or min(max(needed), limit or max(needed)),
        trust_remote_code=cfg.trust_remote_code)
    base |= engine.describe()
    vocab = int(target.config.get("vocab_size") or 10000)
    try:
        for s, run_indices in todo.items():
            _run_scenario(engine, s, run_indices, cfg, base, store, target, vocab)
        if acc_todo:
            _run_accuracy(engine, target, acc, cfg, {**base, **_accuracy_key(acc)}, store)
    finally:
        engine.close()
    log.info("results appended to %s", store)


def _accuracy_key(acc) -> dict:
    return {"kind": "accuracy", "scenario": acc.name, "dataset": acc.name, "batch_size": None,
            "input_len": None, "output_len": None, "run_index": 0}


def _run_accuracy(engine, target, acc, cfg, row, store) -> None:
    from transformers import AutoTokenizer

    from evaluate import accuracy
    tokenizer = AutoTokenizer.from_pretrained(target.path, trust_remote_code=cfg.trust_remote_code)
    stamp = {"timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        metrics = accuracy.measure(engine, target, acc, tokenizer, int(cfg.seed))
    except Exception as e:
        results.append(store, row | stamp | {"status": "failed", "reason": f"{type(e).__name__}: {e}"})
        raise
    results.append(store, row | stamp | {"status": "ok", "metrics": metrics,
                                         "accuracy_config": OmegaConf.to_container(acc, resolve=True)})
    log.info("accuracy: perplexity %.2f (reference %.2f), KL %.4f nats, top-1 agreement %.3f, "
             "last-word %.3f", metrics["perplexity"], metrics["reference_perplexity"],
             metrics["kl_divergence"], metrics["top1_agreement"], metrics["lastword_accuracy"])


def _run_scenario(engine, s, run_indices, cfg, base, store, target, vocab) -> None:
    log.info("scenario %s: batch %d, %d in / %d out tokens, %d warm-up + %d timed runs",
             s.name, s.batch_size, s.input_len, s.output_len, cfg.warmup_runs, len(run_indices))
    try:
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
            _append(store, base, s, i, status="ok", metrics=metrics)
            log.info("  run %d/%d: %.1f tok/s out, latency %.2f s, TTFT %.0f ms", i + 1, cfg.runs,
                     metrics["output_throughput"], metrics["latency_s"], metrics["ttft_ms_mean"])
    except Exception as e:
        _append(store, base, s, None, status="failed", reason=f"{type(e).__name__}: {e}")
        raise


def prompts(s, seed: int, run_index: int, vocab: int) -> list[list[int]]:
    """Exactly input_len random token ids per request, fresh for every run
    (so prefix caching cannot serve a timed run from the warm-up), drawn below
    10000 as `vllm bench` does."""
    rng = np.random.default_rng([int(seed), run_index + 1000, s.batch_size, s.input_len])
    return rng.integers(0, min(vocab, 10000), size=(s.batch_size, s.input_len)).tolist()


def _key(base: dict, s, run_index) -> dict:
    return {**base, **s.as_row(), "run_index": run_index}


def _append(store, base, s, run_index, status, metrics=None, reason=None) -> None:
    row = _key(base, s, run_index) | {
        "status": status, "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if metrics is not None:
        row["metrics"] = metrics
    if reason is not None:
        row["reason"] = reason
    results.append(store, row)
