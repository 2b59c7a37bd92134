"""Serving engines, by name. Each engine serves one target and runs batches of
token-id prompts, returning per-request token timestamps:

    engine = ENGINES[name](target, args: dict, env: dict, max_model_len: int)
    start, timings = engine.run(prompts: list[list[int]], output_len: int)
    engine.describe() -> dict    # effective args/env, recorded in every row
    engine.close()
    cls.accepted_args() -> set[str]   # the engine.args.* keys it takes
"""
import difflib
import importlib

from quantize.common.errors import UserError

ENGINES = {
    "vllm": "evaluate.engines.vllm:VllmEngine",
    "hf": "evaluate.engines.hf:HfEngine",
}


def get(name: str):
    if name not in ENGINES:
        raise UserError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)} (conf/engine/)")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def check_args(cls, args: dict) -> None:
    """Unknown `engine.args.*` keys fail here, before the engine starts."""
    accepted = cls.accepted_args()
    for key in sorted(set(args) - accepted):
        close = difflib.get_close_matches(key, accepted, n=1)
        hint = (f"did you mean engine.args.{close[0]}?" if close else
                f"it takes {', '.join(sorted(accepted))}" if len(accepted) <= 10 else "check its spelling")
        raise UserError(f"engine.args.{key} is not an argument of engine={cls.name}; {hint} "
                        f"(remove it with ~engine.args.{key})")
