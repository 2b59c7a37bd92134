"""Where a vLLM engine's start-up goes, read from vLLM's own log lines.

vLLM's engine core and its worker run in child processes: their phases
(loading the weights, torch.compile, the profiling run, the KV-cache
allocation) are never seen by the process that starts them. Every vLLM
process configures its logging at import from `VLLM_LOGGING_CONFIG_PATH`, so
while an engine starts, `capture()` points that at a config that keeps
vLLM's own console output as it is and adds a file handler with sub-second
timestamps; `breakdown()` turns those records into seconds per phase.

Phases are measured between log lines vLLM and torch.compile write anyway
(INFO level; torch's are captured into the file only, see logging_config):

    spawn_s     our call -> "Starting to load model"   processes, imports, config
    load_s      -> start of "init engine ... took"     weights read and post-processed
    trace_s     "Warming up model for the compilation" -> dynamo's "done tracing":
                the model traced into a graph (no compile cache skips it)
    compile_s   -> the compiled function saved ("saved AOT compiled function"),
                loaded from vLLM's cache ("Directly load AOT compilation"), or
                returned by inductor (dynamo's last "done compiler function"):
                a compile, or a load from inductor's cache
    warmup_s    -> "Warming up done"                   the profiling run
    compile_warmup_s  the three above as one phase, where no line divides them
    kv_cache_s  -> "init engine ... took"              KV-cache sizing and allocation
    other_s     the rest of the total                  (e.g. the front end's own set-up)

A phase whose lines are missing (another vLLM version, another platform,
logging configured by the user) is absent, never estimated.
"""
import contextlib
import copy
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterator

from evaluate.engines.base import scoped_env

log = logging.getLogger("quantbench.evaluate")

# One record per line: wall-clock time, pid, message (first line only).
_FORMAT = "%(created).3f\t%(process)d\t%(message)s"

_EVENTS = {
    "load_start": re.compile(r"Starting to load model"),
    "warm_start": re.compile(r"Warming up model for the compilation"),
    "aot_saved": re.compile(r"saved AOT compiled function to"),
    "aot_loaded": re.compile(r"Directly load AOT compilation from path"),
    "aot_load_failed": re.compile(r"Compiling model again due to a load failure"),
    "warm_done": re.compile(r"Warming up done"),
    "init_engine": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
    "traced": re.compile(r"^Step \d+: torchdynamo done tracing"),
    "compiler_done": re.compile(r"^Step \d+: done compiler function"),
    "kv_tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
    "weights_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
    # one lookup per graph in each of torch's compile caches, counted
    "fx_graph_hits": re.compile(r"^fx graph cache hit for key"),
    "fx_graph_misses": re.compile(r"^fx graph cache miss for key"),
    "aot_autograd_hits": re.compile(r"^AOTAutograd cache hit for key"),
    "aot_autograd_misses": re.compile(r"^AOTAutograd cache miss for key"),
}
_CACHE_LOOKUPS = ("fx_graph_hits", "fx_graph_misses", "aot_autograd_hits", "aot_autograd_misses")

# torch.compile's own records, in the worker that compiles: dynamo's steps
# (tracing, calling the compiler) and the compile caches' lookups.
_TORCH_LOGGERS = ("torch._dynamo.symbolic_convert", "torch._dynamo.output_graph",
                  "torch._inductor.codecache", "torch._functorch._aot_autograd.autograd_cache")


@dataclass
class StartupLog:
    """What one engine's start-up logged: (time, message) per event name."""
    t0: float                                   # time.time() when the start was asked for
    events: dict[str, tuple[float, re.Match]] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)  # time of each event's last occurrence
    counts: dict[str, int] = field(default_factory=dict)  # occurrences of each event

    @classmethod
    def parse(cls, text: str, t0: float) -> "StartupLog":
        out = cls(t0)
        for line in text.splitlines():
            parts = line.split("\t", 2)
            if len(parts) != 3:
                continue
            try:
                created = float(parts[0])
            except ValueError:
                continue
            for name, pattern in _EVENTS.items():
                m = pattern.search(parts[2])
                if not m:
                    continue
                if name not in out.events:  # the first occurrence: the start-up's
                    out.events[name] = (created, m)
                out.last[name] = created
                out.counts[name] = out.counts.get(name, 0) + 1
        return out

    def at(self, name: str) -> float | None:
        return self.events[name][0] if name in self.events else None

    def compile_cache(self) -> str | None:
        """"loaded" (the compiled model came from vLLM's compile cache),
        "compiled" (compiled and saved), "load failed" (the cache was there
        and could not be used), or None (no compile-cache line: eager, or the
        compile cache is off)."""
        if "aot_loaded" in self.events:
            return "loaded"
        if "aot_load_failed" in self.events:
            return "load failed"
        if "aot_saved" in self.events:
            return "compiled"
        return None

    def compile_cache_lookups(self) -> dict[str, int] | None:
        """Hits and misses of torch's compile caches while the engine started,
        e.g. {"fx_graph_hits": 1, "fx_graph_misses": 0, "aot_autograd_hits": 1,
        "aot_autograd_misses": 0}: a miss means a graph was compiled. None when
        no lookup was logged (eager, or torch's caches off)."""
        if not any(name in self.counts for name in _CACHE_LOOKUPS):
            return None
        return {name: self.counts.get(name, 0) for name in _CACHE_LOOKUPS}

    def breakdown(self, total_s: float) -> dict[str, float]:
        """Seconds per phase (see the module doc); only phases whose bounding
        lines were logged, each >= 0, together <= total_s."""
        phases: dict[str, float] = {}
        load_start, warm_start, warm_done = self.at("load_start"), self.at("warm_start"), self.at("warm_done")
        init_end = self.at("init_engine")
        init_start = init_end - float(self.events["init_engine"][1].group(1)) if init_end else None
        # several graphs (graph breaks) compile in turn: the last one returned ends the compile
        compiled = self.at("aot_loaded") or self.at("aot_saved") or self.last.get("compiler_done")
        traced = self.at("traced")
        if load_start is not None:
            phases["spawn_s"] = load_start - self.t0
            if init_start is not None:
                phases["load_s"] = init_start - load_start
        if warm_start is not None and warm_done is not None:
            if compiled is not None and warm_start <= compiled <= warm_done:
                if traced is not None and warm_start <= traced <= compiled:
                    phases["trace_s"] = traced - warm_start
                phases["compile_s"] = compiled - (traced if "trace_s" in phases else warm_start)
                phases["warmup_s"] = warm_done - compiled
            else:
                phases["compile_warmup_s"] = warm_done - warm_start
            if init_end is not None:
                phases["kv_cache_s"] = init_end - warm_done
        if any(v < 0 for v in phases.values()) or sum(phases.values()) > total_s:
            return {}  # lines out of order or past the total: no breakdown rather than a wrong one
        if phases:
            phases["other_s"] = total_s - sum(phases.values())
        return {k: round(v, 2) for k, v in phases.items()}

    def kv_cache_tokens(self) -> int | None:
        return int(self.events["kv_tokens"][1].group(1).replace(",", "")) if "kv_tokens" in self.events else None

    def weights_bytes(self) -> int | None:
        """From "Model loading took X GiB" (vLLM logs it on CUDA; to 0.01 GiB)."""
        return round(float(self.events["weights_gib"][1].group(1)) * 2**30) if "weights_gib" in self.events else None


def logging_config(log_file: str) -> dict:
    """vLLM's default logging config plus a file handler for the start-up records."""
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    config["formatters"]["quantbench_startup"] = {"format": _FORMAT}
    config["handlers"]["quantbench_startup"] = {"class": "logging.FileHandler", "filename": log_file,
                                                "formatter": "quantbench_startup", "level": "INFO"}
    vllm_logger = config["loggers"]["vllm"]
    vllm_logger["handlers"] = [*vllm_logger["handlers"], "quantbench_startup"]
    # the console handler keeps the user's VLLM_LOGGING_LEVEL; the logger lets INFO through to the file
    if logging.getLevelName(str(vllm_logger.get("level", "INFO"))) > logging.INFO:
        vllm_logger["level"] = "INFO"
    # torch.compile's INFO records go to the file. Unless the user asked torch for
    # its logs (TORCH_LOGS: torch's own handlers then print them), they stop there,
    # and only warnings reach the console, as they would without this config.
    asked = bool(os.environ.get("TORCH_LOGS"))
    config["handlers"]["quantbench_torch_warnings"] = {"class": "logging.StreamHandler", "level": "WARNING",
                                                       "stream": "ext://sys.stderr"}
    handlers = ["quantbench_startup"] + ([] if asked else ["quantbench_torch_warnings"])
    for name in _TORCH_LOGGERS:
        config["loggers"][name] = {"handlers": handlers, "level": "INFO", "propagate": asked}
    return config


@contextlib.contextmanager
def capture() -> Iterator["Capture"]:
    """While an engine starts inside: its processes write their log records
    to a temp file too. Nothing is captured where the user configures vLLM's
    logging themselves (VLLM_LOGGING_CONFIG_PATH, VLLM_CONFIGURE_LOGGING=0)."""
    cap = Capture(time.time())
    if os.environ.get("VLLM_LOGGING_CONFIG_PATH") or os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        yield cap
        return
    with tempfile.TemporaryDirectory(prefix="qb-vllm-startup-") as tmp:
        cap.log_file = os.path.join(tmp, "startup.log")
        config_file = os.path.join(tmp, "logging.json")
        try:
            with open(config_file, "w") as f:
                json.dump(logging_config(cap.log_file), f)
        except Exception as e:  # a vLLM without DEFAULT_LOGGING_CONFIG: no breakdown, same engine
            log.debug("no start-up breakdown: %s", e)
            cap.log_file = None
            yield cap
            return
        # unset again on exit: the engine's processes exist by now and have read it
        with scoped_env({"VLLM_LOGGING_CONFIG_PATH": config_file}):
            try:
                yield cap
            finally:
                cap.read()


@dataclass
class Capture:
    t0: float
    log_file: str | None = None
    log: StartupLog | None = None

    def read(self) -> None:
        if self.log_file and os.path.exists(self.log_file):
            with open(self.log_file, errors="replace") as f:
                self.log = StartupLog.parse(f.read(), self.t0)
