"""What quantbench asks of a serving engine: the one interface every engine
implements, and the only way the pipeline, lm-eval, the capability probe and
the benchmarks talk to one.

An engine is a subclass of `Engine` in any importable module, named by
`_target_:` in its conf/engine/<name>.yaml (see evaluate.engines.build). It answers
capability questions as static methods, before anything starts, and serves
one target per instance:

    with EngineClass(target, args, env, max_model_len=...) as engine:
        start, timings = engine.run(prompts, output_len)   # per-token timestamps
        engine.prompt_logprobs(prompts, k)                 # if has_prompt_logprobs
        engine.describe()                                  # what the rows record

The engine environment (`env` of its config) is set for the instance's
lifetime and restored by close(): two jobs in one process (a Hydra `-m`
sweep) never inherit each other's environment.
"""
import math
import os
import struct
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator, NamedTuple

from evaluate import lifeline
from evaluate.formats import Verdict
from evaluate.memory import Baseline, PeakMemory, release_freed_memory
from evaluate.metrics import RequestTiming
from quantize.common.errors import UserError
from quantize.common.settings import is_integer, is_name, is_number, shown

# The variables this process was started with. Libraries write their own
# defaults into os.environ as they run (importing vLLM makes inductor set
# TORCHINDUCTOR_CACHE_DIR to /tmp/torchinductor_<user>), so whether the user
# set a variable is asked of this snapshot, not of os.environ.
LAUNCH_ENV = frozenset(os.environ)


def user_set(key: str) -> bool:
    return key in LAUNCH_ENV


def weights_in_memory(checkpoint, dtype: str | None, decompressed: bool = False) -> int:
    """Bytes a checkpoint's weights take once loaded to compute in `dtype`,
    from its safetensors headers (nothing is loaded): floating tensors at
    `dtype`'s width, quantized ones packed as stored
    (quantize.common.memory_check.footprint), or with `decompressed` dense
    in `dtype`. A folder without weights (a recipe not quantized yet) holds none."""
    from quantize.common.memory_check import footprint
    held = footprint(checkpoint, dtype).weight_bytes
    return held + (_decompression_growth(checkpoint, dtype) if decompressed else 0)


def _decompression_growth(checkpoint, dtype: str | None) -> int:
    """What decompressing to dense `dtype` adds to the packed size:
    compressed-tensors' `weight_packed` becomes a weight of the
    `weight_shape` stored beside it, an 8-bit `weight` one of its shape."""
    from quantize.common.checkpoint import read_header, weight_files
    from quantize.common.memory_check import FLOAT_TENSORS, STORED_WIDTH, dtype_width
    width = dtype_width(dtype)
    tensors = {}   # name -> (file, header entry, where the file's data starts)
    for path in weight_files(checkpoint):
        header, data = read_header(path)
        tensors |= {name: (path, info, path.stat().st_size - data) for name, info in header.items()
                    if name != "__metadata__"}
    growth = 0
    for name, (path, info, start) in tensors.items():
        module, _, kind = name.rpartition(".")
        stored = info["data_offsets"][1] - info["data_offsets"][0]
        if kind == "weight_packed" and f"{module}.weight_shape" in tensors:
            shape_file, shape_info, shape_start = tensors[f"{module}.weight_shape"]
            shape_bytes = shape_info["data_offsets"][1] - shape_info["data_offsets"][0]
            growth += math.prod(_stored_ints(shape_file, shape_info, shape_start)) * width - stored - shape_bytes
        elif kind == "weight" and info["dtype"] not in FLOAT_TENSORS:
            growth += math.prod(info["shape"]) * (width - STORED_WIDTH.get(info["dtype"], 1))
    return growth


def _stored_ints(path, info: dict, data_start: int) -> tuple[int, ...]:
    """The values of a small integer tensor (a weight_shape), read from its file."""
    code = {"I64": "q", "I32": "i", "I16": "h", "I8": "b"}[info["dtype"]]
    begin, end = info["data_offsets"]
    with open(path, "rb") as f:
        f.seek(data_start + begin)
        raw = f.read(end - begin)
    return struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw)


class EngineStartError(UserError):
    """An engine crashed or was not ready in time: one line with the reason.
    The measurements it owed are recorded as failed (unlike bad input, which
    writes nothing), so a sweep shows the job and goes on."""
    records_failure = True


class RunFailed(RuntimeError):
    """One run failed and the engine can still serve the next (a stalled
    stream): that run's row is recorded as failed, with this one-line
    message as its reason, and the scenario goes on."""


class LmEvalModel(NamedTuple):
    """How lm-eval runs what an engine serves: `lm_eval --model <name>
    --model_args <args>`. `name` is also the package whose version in the
    lm-eval environment is the rows' engine_version."""
    name: str
    args: dict


@contextmanager
def scoped_env(values: dict, restore: Iterable[str] = ()) -> Iterator[None]:
    """Set `values` in os.environ (None: leave that variable as it is), and
    put every variable back as it was on exit, even after an error; those
    named in `restore` too, whoever set them meanwhile."""
    saved = {key: os.environ.get(key) for key, value in values.items() if value is not None}
    saved |= {key: os.environ.get(key) for key in restore if key not in saved}
    try:
        for key, value in values.items():
            if value is not None:
                os.environ[key] = str(value)
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


class Engine:
    """Base of every engine. Subclasses set `name`, implement the capability
    answers, `start`, `run` and `stop`, and override the extras they have."""

    name: str = ""
    # False: prompt_logprobs() is not implemented, so accuracy cannot be measured.
    has_prompt_logprobs: bool = True
    # Environment variables that change this engine's speed: their values while
    # it runs are recorded in every row. None: the variables its config sets.
    speed_env: tuple[str, ...] | None = None
    # True: it serves over OpenAI-compatible HTTP once started (attributes
    # base_url, model, server_pid, alive()), so load profiles (conf/load/) can drive it.
    serves_http: bool = False
    # True: it serves from a machine quantbench cannot see (a running server's),
    # so this machine's memory bounds none of its batches (evaluate.limits).
    remote: bool = False
    # True: it starts processes, which hold a lifeline (evaluate.lifeline)
    # so that they die with evaluate, however it dies.
    starts_processes: bool = False

    @classmethod
    def from_config(cls, values: dict, where: str) -> "EngineConfig":
        """The typed config of conf/engine/<name>.yaml (without `_target_`):
        name, args and env, and the engine's own keys as `settings`."""
        values = dict(values)
        name = values.pop("name", None)
        if not is_name(name):
            raise UserError(f"engine.name={shown(name)} is not a name: it is the rows' `engine`; pass text, "
                            "e.g. engine.name=vllm, or add `name: <text>` to the engine's YAML")
        args, env = values.pop("args", None) or {}, values.pop("env", None) or {}
        for key, value in (("args", args), ("env", env)):
            if not isinstance(value, dict):
                raise UserError(f"{where}: {key} must be a mapping, not {value!r}")
        for key, value in values.items():   # seconds (startup_timeout_s, ...) and retries, read deep in a run
            seconds, count = key.endswith("_s"), key == "retries"
            if (seconds or count) and value is not None and not (
                    (is_integer(value) if count else is_number(value)) and value >= 0):
                raise UserError(f"{where}: engine.{key}={shown(value)} is not {'a count' if count else 'a number of seconds'}"
                                f" >= 0; pass e.g. engine.{key}={2 if count else 600}")
        cls.check_settings(values, dict(env))
        return EngineConfig(name=str(name), engine=cls, args=dict(args), env=dict(env), settings=values)

    @classmethod
    def check_settings(cls, settings: dict, env: dict) -> None:
        """The engine's own keys (besides name, args, env) and the environment
        variables it reads itself, checked as the config is read, before any
        work; an engine with such keys overrides it."""

    # ---- capability answers (no engine starts) -----------------------------

    @staticmethod
    def machine():
        """This machine's facts (quantize.common.machine.Machine) as this engine sees them."""
        raise NotImplementedError

    @staticmethod
    def choose_dtype(fmt, machine, args: dict | None = None) -> str:
        """The compute dtype for `engine.args` (`dtype: auto`: the engine's own
        choice, which may depend on other args, e.g. the device)."""
        raise NotImplementedError

    @staticmethod
    def accepted_args() -> set[str]:
        """The `engine.args.*` keys this engine takes."""
        raise NotImplementedError

    @classmethod
    def check_arg_values(cls, args: dict) -> None:
        """Values of `engine.args.*` this engine would fail on deep in its start,
        refused before any work (vLLM checks its own as its config is built)."""

    @staticmethod
    def supports(fmt, machine, args: dict) -> Verdict:
        """Can it serve checkpoint format `fmt` on `machine` with `args`, and why not."""
        raise NotImplementedError

    @staticmethod
    def resolve_args(args: dict, model_config: dict) -> dict:
        """The `engine.args.*` whose configured value is decided here (e.g.
        `auto`), with the value this machine and model give: called before the
        engine starts, so the rows and the setup id record what ran."""
        return {}

    @staticmethod
    def config_problem(model_config: dict, args: dict) -> str | None:
        """Why `args` cannot serve a model with this config.json (a one-line
        error naming the fix), or None."""
        return None

    @classmethod
    def kv_quant(cls, fmt, args: dict) -> str | None:
        """The KV-cache quantization this engine runs for checkpoint format
        `fmt` with `args` (every row records it as `kv_quant`): "none", the
        checkpoint's scheme (e.g. "fp8") where the engine applies it, or the
        asked-for `kv_cache_dtype`. None: unknown (an engine that does not
        say what it does with a checkpoint's KV-cache scheme)."""
        kv = str(args.get("kv_cache_dtype") or "auto")
        if kv != "auto":
            return kv
        return None if fmt.kv_cache else "none"

    # ---- what a recorded row of this engine means (the report asks) -----------

    @classmethod
    def preallocated_kv_cache_bytes(cls, env: dict, hardware: dict) -> int | None:
        """The KV cache this engine allocated up front, whatever the batch, as
        its recorded `env` and `hardware` tell; None where it grows the cache
        per request (or did not say)."""
        return None

    @classmethod
    def compiles(cls, args: dict) -> bool:
        """Whether a run with these recorded `engine.args` compiled the model."""
        return bool(args.get("compile", False))

    # ---- engine-specific settings the callers ask for ------------------------

    @classmethod
    def logprob_args(cls, top_k: int) -> dict:
        """Engine args (defaults: configured ones win) that prompt_logprobs(k=top_k) needs."""
        return {}

    @classmethod
    def lm_eval_model(cls, args: dict) -> LmEvalModel | None:
        """lm-eval's model for this engine with `args` (before lm_eval.model_args
        go over them); None when lm-eval cannot run it."""
        return None

    @classmethod
    def quick_start(cls) -> tuple[dict, dict]:
        """(args, env) over the defaults for a small, fast start on a tiny
        model (the capability probe)."""
        return {}, {}

    @classmethod
    def sized_env(cls, env: dict, target, args: dict, tokens: int | None) -> dict:
        """The configured `env` with what the engine sizes to the job settled:
        `tokens` is the most the job keeps in the KV cache at once (None:
        unknown, e.g. a load profile's open-ended concurrency)."""
        return dict(env)

    @classmethod
    def kv_itemsize(cls, fmt, args: dict) -> int:
        """Bytes per KV-cache element as this engine stores it for `fmt`: the
        compute dtype's here (transformers keeps its cache unquantized)."""
        from quantize.common.dtypes import dtype_name
        return 4 if dtype_name(args.get("dtype")) == "float32" else 2

    @classmethod
    def weight_bytes(cls, target, args: dict) -> int:
        """Bytes `target`'s weights take in this engine's memory computing in
        `args["dtype"]`: floating tensors cast to it, quantized ones packed as
        stored (the format's kernels read them so, as vLLM's do)."""
        return weights_in_memory(target.path, args.get("dtype"))

    @classmethod
    def prepare_env(cls, env: dict, args: dict | None = None) -> dict:
        """The variables to set for the configured `env` (None: leave as is),
        given the engine `args` it will run with, where known."""
        return dict(env)

    @classmethod
    @contextmanager
    def environment(cls, env: dict, args: dict | None = None, places: dict | None = None) -> Iterator[dict]:
        """The engine environment, set on entry and restored on exit (an
        engine instance holds it for its lifetime; the lm-eval subprocess runs
        inside it). Yields the speed-relevant variables as set. `places`:
        folders the engine is given, set too but not settings, so not recorded."""
        values = cls.prepare_env(env, args) | (places or {})
        # the engine's own settings of its speed variables (vLLM-CPU's LD_PRELOAD) end with it
        with scoped_env(values, restore=cls.speed_env or ()):
            yield cls.recorded_env(env)

    @classmethod
    def recorded_env(cls, env: dict) -> dict:
        """The engine's speed variables and every one its config `env` sets, as
        os.environ has them now, so rows of a sweep over `engine.env.X` say
        which X each measured."""
        return {k: os.environ[k] for k in dict.fromkeys((*(cls.speed_env or ()), *env)) if k in os.environ}

    # ---- one running engine -------------------------------------------------

    startup_s: float | None = None

    def __init__(self, target, args: dict, env: dict, max_model_len: int, settings: dict | None = None):
        """`settings`: the engine config's own keys besides name/_target_/args/env
        (e.g. a server's host and start-up timeout)."""
        self.settings = dict(settings or {})
        self._scope = ExitStack()
        self.env = self._scope.enter_context(self.environment(env, args))
        self.lifeline = self._scope.enter_context(lifeline.hold()) if self.starts_processes else None
        self.args = dict(args)
        self.import_libraries(target)
        self.memory_baseline = Baseline.now()  # the engine's memory is what grows from here
        t0 = time.perf_counter()
        try:
            self.start(target, dict(args), max_model_len)
        except BaseException:
            self._scope.close()
            raise
        if self.startup_s is None:
            self.startup_s = time.perf_counter() - t0
        release_freed_memory()  # what loading freed (decompression, conversion) is not the engine's to keep
        # read again: an engine may set some while starting, for the processes it
        # spawns (vLLM-CPU preloads torch's libgomp through LD_PRELOAD)
        self.env = self.recorded_env(env)
        self._closed = False

    @classmethod
    def import_libraries(cls, target) -> None:
        """Import the libraries an engine in this process runs `target` with,
        before its memory baseline: their code is loaded once per process, so
        counted it would go to whichever engine of a sweep started first."""

    def start(self, target, args: dict, max_model_len: int) -> None:
        """Load `target`, never with code from its folder (quantize.common.hf_load);
        set self.args to the effective args (and self.startup_s to the seconds
        until ready, if not the whole call)."""
        raise NotImplementedError

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True
            ) -> tuple[float, list[RequestTiming]]:
        """Generate exactly `output_len` tokens for each token-id prompt, all at
        once: (batch start, per-request token timestamps). `stream=False`: final
        outputs only where the engine has such a mode (no per-token times)."""
        raise NotImplementedError

    def prompt_logprobs(self, prompts: list[list[int]], k: int) -> list[list[dict | None]]:
        """Per prompt, per position: {token id: (logprob, rank)} for the top-k
        and the actual token (None at position 0)."""
        raise NotImplementedError(f"engine {self.name} gives no prompt logprobs")

    def peak_memory(self) -> PeakMemory:
        """A watch of this engine's peak memory over one run (`with
        engine.peak_memory() as mem:`): what grew since it began starting,
        in this process and in the processes it started (evaluate.memory)."""
        return PeakMemory(baseline=self.memory_baseline)

    def versions(self) -> dict[str, str]:
        """The versions of the libraries serving, as the engine reports them
        (a remote engine: its server's), the engine's own first."""
        return {}

    def describe(self) -> dict:
        """What every row of this engine records: effective args and
        environment, the engine's version, start-up seconds."""
        return {"engine_args": self.args, "engine_env": self.env,
                "engine_version": next(iter(self.versions().values()), None),
                "engine_startup_s": round(self.startup_s, 2)}

    def stop(self) -> None:
        """Release the model and any processes."""

    def close(self) -> None:
        """Stop the engine and restore the environment (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop()
        except BaseException as e:  # stop() did not finish: the lifeline keeps its watchdog (evaluate.lifeline)
            self._scope.__exit__(type(e), e, e.__traceback__)
            raise
        self._scope.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class EngineConfig:
    """One engine config (conf/engine/<name>.yaml), typed: what serves it and
    how it is set up. `settings` are the keys only that engine reads
    (openai: base_url, model, allow_remote; vllm_server: host,
    startup_timeout_s), handed to it as `Engine(..., settings=)`."""
    name: str
    engine: type[Engine]
    args: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The config as the YAML gave it, less `_target_`: what the setup id hashes."""
        return {"name": self.name, "args": self.args, "env": self.env, **self.settings}
