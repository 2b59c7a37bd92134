"""The one way quantbench opens a model folder with transformers: never with
code from the folder.

transformers imports a folder's own .py files when its config.json or
tokenizer_config.json names them under `auto_map`; with trust_remote_code
left unset it even asks "Do you wish to run the custom code? [y/N]" on
standard input. So a folder that names code, or whose model_type
transformers does not ship (only code could build it), is refused in one
line before anything loads (`refuse_model_code`); every loader here passes
trust_remote_code=False; and the entry points detach standard input
(`detach_stdin`), so nothing can prompt. tests/quantize/common/test_hf_load.py
fails on any transformers call in quantize/, evaluate/ or scripts/ without
trust_remote_code=False."""
import ast
import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

from quantize.common.errors import UserError

# The files in which transformers looks for `auto_map` (code to import).
CODE_MAP_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")
NEVER_RUNS_CODE = "quantbench never runs code from a model folder"


def refuse_model_code(model_dir: Path) -> None:
    """One line, before anything loads, for a folder that names code to run
    (`auto_map`) or an architecture transformers does not know."""
    model_dir = Path(model_dir)
    for name in CODE_MAP_FILES:
        auto_map = _read_json(model_dir / name).get("auto_map")
        if auto_map:
            raise UserError(_auto_map_message(model_dir, name, auto_map))
    model_type = _read_json(model_dir / "config.json").get("model_type")
    if model_type is not None and not is_known_model_type(model_type):
        raise UserError(f"{model_dir}: config.json's model_type {model_type!r} is not one transformers "
                        f"{_transformers_version()} knows, and {NEVER_RUNS_CODE}; use a checkpoint of an "
                        "architecture transformers ships, or a transformers release that has it")


def check_setting(value, key: str = "trust_remote_code") -> None:
    """`trust_remote_code=true` on the command line is refused, not ignored."""
    if value not in (None, False, "false", "False"):
        raise UserError(f"{key}={value}: {NEVER_RUNS_CODE}; leave {key} out and use a checkpoint whose "
                        "architecture transformers ships")


def is_known_model_type(model_type) -> bool:
    """transformers ships it, or a library registered it (AutoConfig.register).
    A type in transformers' own table is answered from its source file: a
    refusal that follows then comes before transformers' import (seconds)."""
    if not isinstance(model_type, str):
        return False
    if model_type in _shipped_model_types():
        return True
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    return model_type in CONFIG_MAPPING


# Where transformers keeps its model-type table (CONFIG_MAPPING_NAMES), by release.
_MAPPING_FILES = ("models/auto/auto_mappings.py", "models/auto/configuration_auto.py")


@functools.cache
def _shipped_model_types() -> frozenset:
    """The model types of CONFIG_MAPPING_NAMES, read (not imported) from the
    installed transformers' source; empty where it cannot be read, and then
    is_known_model_type asks transformers itself. A subset of CONFIG_MAPPING:
    only a "yes" is taken from it."""
    spec = importlib.util.find_spec("transformers")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for name in _MAPPING_FILES:
            try:
                tree = ast.parse((Path(location) / name).read_text())
            except (OSError, SyntaxError, ValueError):
                continue
            for node in tree.body:
                names = [getattr(t, "id", None) for t in getattr(node, "targets", ())]
                if names == ["CONFIG_MAPPING_NAMES"] and isinstance(node.value, ast.Call) and len(node.value.args) == 1:
                    try:
                        return frozenset(key for key, _ in ast.literal_eval(node.value.args[0]))
                    except (ValueError, TypeError):
                        pass
    return frozenset()


def detach_stdin() -> None:
    """Standard input becomes /dev/null, for this process and the engines it
    starts: no library can stop on a prompt, or read a "y" typed or piped
    for something else."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(os.devnull)


# ---- the loaders: trust_remote_code=False on every call ------------------------

def config(path, **kwargs):
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(path, trust_remote_code=False, **kwargs)


def tokenizer(path, **kwargs):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, trust_remote_code=False, **kwargs)


def causal_lm(path, **kwargs):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, **kwargs)


def causal_lm_from_config(model_config, **kwargs):
    """A config loaded here keeps a stock model_type's `auto_map`, and
    from_config would ask about it again: the flag goes here too."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_config(model_config, trust_remote_code=False, **kwargs)


def _auto_map_message(model_dir: Path, name: str, auto_map) -> str:
    classes = ", ".join(f"{k} -> {v}" for k, v in auto_map.items()) if isinstance(auto_map, dict) else auto_map
    model_type = _read_json(model_dir / "config.json").get("model_type")
    stock = model_type is not None and is_known_model_type(model_type)
    fix = (f"model_type {model_type!r} is a stock transformers architecture: if this checkpoint is one, delete "
           f"\"auto_map\" from {name}" if stock else
           "use a checkpoint of an architecture transformers ships")
    return f"{model_dir}: {name} names code to run (auto_map: {classes}) and {NEVER_RUNS_CODE}; {fix}"


def _read_json(path: Path) -> dict:
    """The file's object; {} where it is absent or not a JSON object (the
    stage's own checks report a corrupt config.json in their words)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _transformers_version() -> str:
    from importlib.metadata import version
    return version("transformers")
