"""Serving engines. Each one is a subclass of `evaluate.engines.base.Engine`
(the interface) named by its config, conf/engine/<name>.yaml, the way every
extension point is named (quantize.common.extensions):

    name: vllm                                  # the rows' `engine`
    _target_: evaluate.engines.vllm.VllmEngine  # module.Class, importable
    args: {...}                                 # engine.args.*, checked by accepted_args()
    env: {...}                                  # set while the engine runs
    startup_timeout_s: 1800                     # any other key: the engine's own setting

A new engine is one module and one YAML (the YAML may live on Hydra's search
path instead of conf/engine/); nothing here lists engines. `build` gives the
entry point the typed EngineConfig; `get` gives the class of a name (the
report and the capability table ask by name).
"""
import logging
import os

import yaml

from evaluate.engines.base import Engine, EngineConfig, LmEvalModel, scoped_env, user_set
from quantize.common import extensions
from quantize.common.errors import UserError, nearest
from quantize.common.paths import CONF_DIR

__all__ = ["Engine", "EngineConfig", "LmEvalModel", "scoped_env", "known", "config", "build", "get", "identity",
           "check_args"]

log = logging.getLogger("quantbench.evaluate")

ENGINE_CONF = CONF_DIR / "engine"
LEGACY_TARGET = "impl"  # the key before `_target_`; read for one release
_warned_legacy: set[str] = set()


def known(servers: bool = False) -> list[str]:
    """The engine configs shipped in conf/engine/ whose engines decide what
    they can serve (the capability table's columns); `servers=True` adds the
    ones driven over HTTP (`serves_http`: vllm_server answers as vllm does,
    openai cannot know the remote machine)."""
    names = sorted(p.stem for p in ENGINE_CONF.glob("*.yaml"))
    return names if servers else [n for n in names if not get(n).serves_http]


def config(name: str) -> dict:
    """conf/engine/<name>.yaml as a plain dict."""
    path = ENGINE_CONF / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"unknown engine {name!r}; choose one of {known(servers=True)} (conf/engine/)")
    return yaml.safe_load(path.read_text()) or {}


def build(node) -> EngineConfig:
    """The typed config of a composed engine config (a DictConfig or dict
    with `name` and `_target_`), its class imported and checked."""
    values = _with_target(extensions.plain(node))
    return extensions.build(values, Engine, _where(values))


def get(engine) -> type[Engine]:
    """The engine class of a name (conf/engine/<name>.yaml), of a composed
    engine config (anything with `name` and `_target_`) or of an EngineConfig."""
    if isinstance(engine, EngineConfig):
        return engine.engine
    values = _with_target(config(engine) if isinstance(engine, str) else extensions.plain(engine))
    return extensions.implementation(values.get(extensions.TARGET), Engine, _where(values))


def _where(values: dict) -> str:
    return f"conf/engine/{values.get('name')}.yaml"


def _with_target(values: dict) -> dict:
    """A copy whose class is under `_target_`; a config that still says
    `impl:` works, with one warning per config naming the new key."""
    values = dict(values)
    if extensions.TARGET not in values and LEGACY_TARGET in values:
        where = _where(values)
        if where not in _warned_legacy:
            _warned_legacy.add(where)
            log.warning("%s: `%s:` is deprecated and stops working in the next release; rename it to `%s:`",
                        where, LEGACY_TARGET, extensions.TARGET)
        values[extensions.TARGET] = values.pop(LEGACY_TARGET)
    values.pop(LEGACY_TARGET, None)
    return values


# Set per job by a scheduler without changing the setup: a resumed job may be
# given other GPUs of the same kind.
_PER_JOB_ENV = frozenset({"CUDA_VISIBLE_DEVICES"})
# Engine settings that bound how long a failure takes to show, or how often it
# is tried again, and change no measurement: not in the setup id, so stores
# measured before they existed keep theirs.
_BOUNDS = frozenset({"stall_timeout_s", "retries", "retry_backoff_s"})


def identity(engine_cfg: "dict | EngineConfig", cls: type[Engine] | None = None) -> dict:
    """The engine config as it enters the setup id: everything but `_target_`
    (which code serves a name is not a setting; ids stay what they were) and
    _BOUNDS, and as `shell_env` the engine's speed variables exported before
    quantbench started (e.g. OMP_NUM_THREADS, or the ISA caps of scripts/as_avx2_host.sh):
    they change speed as `engine.env` does. Absent when there are none, so
    the ids of setups without them stay what they were."""
    cls = cls or get(engine_cfg)
    if isinstance(engine_cfg, EngineConfig):
        engine_cfg = engine_cfg.as_dict()
    out = {k: v for k, v in engine_cfg.items() if k not in (extensions.TARGET, LEGACY_TARGET, *_BOUNDS)}
    # The engine leaves the shell's value where the env it sets holds none
    # (e.g. VLLM_CPU_KVCACHE_SPACE: auto, or null), not only where the config
    # names none. Without the args: the config may still say tensor_parallel_size=auto.
    prepared = cls.prepare_env(dict(engine_cfg.get("env") or {}))
    shell = {k: os.environ[k] for k in cls.speed_env or ()
             if user_set(k) and k in os.environ and prepared.get(k) is None and k not in _PER_JOB_ENV}
    if shell:
        out["shell_env"] = shell
    return out


def check_args(cls, args: dict, name: str | None = None) -> None:
    """Unknown `engine.args.*` keys, and values the engine refuses, fail here, before the engine starts."""
    name = name or cls.name
    accepted = cls.accepted_args()
    for key in sorted(set(args) - accepted):
        close = nearest(key, accepted)
        hint = (f"did you mean engine.args.{close}?" if close else
                f"it takes {', '.join(sorted(accepted))}" if len(accepted) <= 10 else "check its spelling")
        raise UserError(f"engine.args.{key} is not an argument of engine={name}; {hint} "
                        f"(remove it with ~engine.args.{key})")
    cls.check_arg_values(args)
