"""Serving engines, by name. Each engine serves one target and runs batches of
token-id prompts, returning per-request token timestamps:

    engine = ENGINES[name](target, args: dict, env: dict, max_model_len: int)
    start, timings = engine.run(prompts: list[list[int]], output_len: int)
    engine.describe() -> dict    # effective args/env, recorded in every row
    engine.close()
"""
import importlib

from quantize.errors import UserError

ENGINES = {
    "vllm": "evaluate.engines.vllm:VllmEngine",
    "hf": "evaluate.engines.hf:HfEngine",
}


def get(name: str):
    if name not in ENGINES:
        raise UserError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)} (conf/engine/)")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)
