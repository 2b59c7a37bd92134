"""Serving engines. Each one is a subclass of `evaluate.engines.base.Engine`
(the interface) named by its config, conf/engine/<name>.yaml:

    name: vllm                                  # the rows' `engine`
    impl: evaluate.engines.vllm.VllmEngine      # module.Class, importable
    args: {...}                                 # engine.args.*, checked by accepted_args()
    env: {...}                                  # set while the engine runs

A new engine is one module and one YAML (the YAML may live on Hydra's search
path instead of conf/engine/); nothing here lists engines.
"""
import difflib
import importlib
import os

import yaml

from evaluate.engines.base import Engine, LmEvalModel, scoped_env, user_set
from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR

__all__ = ["Engine", "LmEvalModel", "scoped_env", "known", "config", "get", "identity", "check_args"]

ENGINE_CONF = CONF_DIR / "engine"


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


def get(engine) -> type[Engine]:
    """The engine class of a name (conf/engine/<name>.yaml) or of a composed
    engine config (anything with `name` and `impl`)."""
    cfg = config(engine) if isinstance(engine, str) else engine
    name, impl = cfg.get("name"), cfg.get("impl")
    where = f"conf/engine/{name}.yaml"
    if not impl or "." not in str(impl):
        raise UserError(f"{where} names no implementation; add `impl: <module>.<EngineClass>` "
                        f"(e.g. evaluate.engines.vllm.VllmEngine)")
    module_name, _, cls_name = str(impl).rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if not (e.name and (module_name == e.name or module_name.startswith(e.name + "."))):
            raise  # the module exists and lacks a dependency: its own error says which
        raise UserError(f"engine {name}: cannot import module {module_name!r} (impl: {impl} in {where}); "
                        "fix impl or put its folder on PYTHONPATH") from None
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        what = "is not an engine (a subclass of evaluate.engines.base.Engine)" if cls else "does not exist"
        raise UserError(f"engine {name}: {impl} {what}; fix impl in {where}")
    return cls


# Set per job by a scheduler without changing the setup: a resumed job may be
# given other GPUs of the same kind.
_PER_JOB_ENV = frozenset({"CUDA_VISIBLE_DEVICES"})


def identity(engine_cfg: dict, cls: type[Engine] | None = None) -> dict:
    """The engine config as it enters the setup id: everything but `impl`
    (which code serves a name is not a setting; ids stay what they were), and
    as `shell_env` the engine's speed variables exported before quantbench
    started (e.g. OMP_NUM_THREADS, or the ISA caps of scripts/as_avx2_host.sh):
    they change speed as `engine.env` does. Absent when there are none, so
    the ids of setups without them stay what they were."""
    cls = cls or get(engine_cfg)
    out = {k: v for k, v in engine_cfg.items() if k != "impl"}
    configured = engine_cfg.get("env") or {}
    shell = {k: os.environ[k] for k in cls.speed_env or ()
             if user_set(k) and k in os.environ and k not in configured and k not in _PER_JOB_ENV}
    if shell:
        out["shell_env"] = shell
    return out


def check_args(cls, args: dict, name: str | None = None) -> None:
    """Unknown `engine.args.*` keys fail here, before the engine starts."""
    name = name or cls.name
    accepted = cls.accepted_args()
    for key in sorted(set(args) - accepted):
        close = difflib.get_close_matches(key, accepted, n=1)
        hint = (f"did you mean engine.args.{close[0]}?" if close else
                f"it takes {', '.join(sorted(accepted))}" if len(accepted) <= 10 else "check its spelling")
        raise UserError(f"engine.args.{key} is not an argument of engine={name}; {hint} "
                        f"(remove it with ~engine.args.{key})")
