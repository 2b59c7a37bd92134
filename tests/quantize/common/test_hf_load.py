"""quantize/common/hf_load.py, in-process and fast: which folders are refused
and in what words; every transformers call in quantize/, evaluate/ and
scripts/ passes trust_remote_code=False; the loaders themselves never run a
folder's code, "y" on standard input or not; every entry point detaches
standard input; trust_remote_code=true is refused. tests/test_no_model_code.py
drives the real stages."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from quantize.common import hf_load
from quantize.common.errors import UserError
from tests.conftest import quantize_env

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("quantize", "evaluate", "scripts")
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 128}
AUTO_MAP = {"AutoConfig": "configuration_planted.PlantedConfig",
            "AutoModelForCausalLM": "modeling_planted.PlantedForCausalLM"}


def folder(tmp_path: Path, config: dict, tokenizer_config: dict | None = None, marker: Path | None = None,
           name: str = "model") -> Path:
    """A model folder holding these JSON files and, with `marker`, .py files that write it when imported."""
    out = tmp_path / name
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    if tokenizer_config is not None:
        (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    for name in ("configuration_planted.py", "modeling_planted.py") if marker else ():
        (out / name).write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n")
    return out


def refusal(path: Path) -> str:
    with pytest.raises(UserError) as caught:
        hf_load.refuse_model_code(path)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"{path}: ") and "never runs code from a model folder" in line
    return line


# ---- which folders are refused, and what the line says --------------------------

def test_auto_map_on_a_stock_model_type_names_the_fix(tmp_path):
    line = refusal(folder(tmp_path, LLAMA | {"auto_map": AUTO_MAP}))
    assert "config.json names code to run (auto_map: AutoConfig -> configuration_planted.PlantedConfig" in line
    assert line.endswith("model_type 'llama' is a stock transformers architecture: if this checkpoint is one, "
                         'delete "auto_map" from config.json')


def test_auto_map_on_an_unknown_model_type_asks_for_a_shipped_architecture(tmp_path):
    line = refusal(folder(tmp_path, LLAMA | {"auto_map": AUTO_MAP, "model_type": "planted"}))
    assert line.endswith("use a checkpoint of an architecture transformers ships")


def test_auto_map_in_tokenizer_config_is_refused(tmp_path):
    line = refusal(folder(tmp_path, LLAMA, {"auto_map": {"AutoTokenizer": ["tokenization_planted.T", None]}}))
    assert "tokenizer_config.json names code to run" in line and 'delete "auto_map" from tokenizer_config.json' in line


def test_an_unknown_model_type_is_refused(tmp_path):
    line = refusal(folder(tmp_path, LLAMA | {"model_type": "planted"}))
    assert "config.json's model_type 'planted' is not one transformers" in line


def test_the_model_types_read_from_transformers_source_are_the_ones_it_ships():
    """The quick answer (no transformers import) holds the common types and
    only types transformers' own table has; a type only a library registered
    is still answered, by transformers."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    shipped = hf_load._shipped_model_types()
    assert {"llama", "qwen2", "mistral", "gemma"} <= shipped <= set(CONFIG_MAPPING.keys())

    class RegisteredConfig(PretrainedConfig):
        model_type = "quantbench_registered"

    AutoConfig.register("quantbench_registered", RegisteredConfig)
    assert "quantbench_registered" not in shipped and hf_load.is_known_model_type("quantbench_registered")
    assert not hf_load.is_known_model_type("planted") and not hf_load.is_known_model_type(None)


def test_a_stock_folder_passes_even_with_py_files_beside_it(tmp_path):
    """Without auto_map transformers never imports a folder's .py files."""
    hf_load.refuse_model_code(folder(tmp_path, LLAMA, {"tokenizer_class": "PreTrainedTokenizerFast"},
                                     marker=tmp_path / "ran"))


def test_a_corrupt_config_is_left_to_the_stage_to_report(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    hf_load.refuse_model_code(tmp_path)  # the stage's own check says "corrupt" in its words


# ---- trust_remote_code=False at every call -------------------------------------

LOADERS = ("from_pretrained",)            # any class's: configs, tokenizers, models, processors
AUTO_FROM_CONFIG = "from_config"          # an Auto class's resolves auto_map again


def calls_without_the_flag(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line` of each transformers call that reads a config, tokenizer or
    model (or builds one from a config) without trust_remote_code=False."""
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and _loads(node.func) and not _flag_off(node):
            missing.append(f"{path.relative_to(root)}:{node.lineno}")
    return missing


def _loads(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id == "pipeline"
    if not isinstance(func, ast.Attribute):
        return False
    receiver = ast.unparse(func.value).split(".")[-1]
    return func.attr in LOADERS or (func.attr == AUTO_FROM_CONFIG and receiver.startswith("Auto"))


def _flag_off(call: ast.Call) -> bool:
    return any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def test_every_transformers_load_passes_trust_remote_code_false():
    missing = [where for top in SCANNED for path in sorted((ROOT / top).rglob("*.py"))
               for where in calls_without_the_flag(path)]
    assert not missing, f"pass trust_remote_code=False (or use quantize.common.hf_load): {missing}"


def test_the_scan_sees_a_call_without_the_flag(tmp_path):
    source = tmp_path / "pkg" / "bad.py"
    source.parent.mkdir()
    source.write_text("from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, pipeline\n"
                      "a = AutoConfig.from_pretrained(\n    'd',\n    revision='x',\n)\n"
                      "b = AutoTokenizer.from_pretrained('d', trust_remote_code=True)\n"
                      "c = AutoModelForCausalLM.from_config(a)\n"
                      "d = pipeline('text-generation', model='d')\n"
                      "e = AutoConfig.from_pretrained('d', trust_remote_code=False)\n")
    assert calls_without_the_flag(source, tmp_path) == ["pkg/bad.py:2", "pkg/bad.py:6", "pkg/bad.py:7", "pkg/bad.py:8"]


# ---- the loaders alone never run a folder's code; standard input stays unread -----

LOAD_ALL = """
import sys
from quantize.common import hf_load
stock, unknown = sys.argv[1:3]
config = hf_load.config(stock)          # the stock class; auto_map is ignored
hf_load.causal_lm_from_config(config)   # would ask again without the flag
try:
    hf_load.config(unknown)
except ValueError:
    print("unknown refused by transformers")
"""


def test_the_loaders_never_run_a_folders_code_with_y_on_stdin(tmp_path):
    marker = tmp_path / "CODE_RAN"
    stock = folder(tmp_path, LLAMA | {"auto_map": AUTO_MAP}, marker=marker, name="stock")
    unknown = folder(tmp_path, LLAMA | {"auto_map": AUTO_MAP, "model_type": "planted"}, marker=marker, name="unknown")
    proc = subprocess.run([sys.executable, "-c", LOAD_ALL, str(stock), str(unknown)], input="y\n" * 4,
                          capture_output=True, text=True, env=quantize_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "unknown refused by transformers" in proc.stdout and "[y/N]" not in proc.stdout + proc.stderr
    assert not marker.exists()


def test_detach_stdin_leaves_nothing_to_read():
    code = ("import os, sys\nfrom quantize.common.hf_load import detach_stdin\ndetach_stdin()\n"
            "print(repr(sys.stdin.read()), repr(os.read(0, 8)))")
    proc = subprocess.run([sys.executable, "-c", code], input="y\n", capture_output=True, text=True,
                          env=quantize_env(), timeout=60)
    assert proc.stdout.split() == ["''", "b''"], proc.stderr


def entry_modules() -> list[Path]:
    """Every module of quantize/ and evaluate/ that `python -m` runs."""
    return sorted(p for top in ("quantize", "evaluate") for p in (ROOT / top).rglob("*.py")
                  if 'if __name__ == "__main__":' in p.read_text())


@pytest.mark.parametrize("path", entry_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_entry_point_detaches_stdin_first(path):
    guard = next(node for node in ast.parse(path.read_text()).body
                 if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    assert ast.unparse(guard.body[0]).endswith("detach_stdin()"), f"{path}: call detach_stdin() first"


# ---- trust_remote_code=true ------------------------------------------------------

@pytest.mark.parametrize("value", [True, "true", 1])
def test_trust_remote_code_true_is_refused(value):
    with pytest.raises(UserError, match=r"never runs code from a model folder; leave trust_remote_code out"):
        hf_load.check_setting(value)


@pytest.mark.parametrize("value", [False, None, "false", 0])
def test_trust_remote_code_false_or_unset_passes(value):
    hf_load.check_setting(value)


def _quantize_config(cfg):
    from quantize.common.extensions import plain
    from quantize.config import QuantizeConfig
    return QuantizeConfig.from_config(plain(cfg))


def _sensitivity_config(cfg):
    from quantize.common.extensions import plain
    from quantize.sensitivity.config import SensitivityConfig
    return SensitivityConfig.from_config(plain(cfg))


def _evaluate_config(cfg):
    from evaluate.config import EvaluateConfig
    return EvaluateConfig.from_cfg(cfg)


# entry config -> (overrides besides trust_remote_code=true, its one conversion)
CONVERSIONS = {"quantize": (["recipe=original"], _quantize_config),
               "sensitivity": (["recipe=w4a16_rtn"], _sensitivity_config),
               "evaluate": ([], _evaluate_config)}


@pytest.mark.parametrize("entry", list(CONVERSIONS))
def test_each_stage_refuses_trust_remote_code_true_when_it_converts_its_config(entry):
    from hydra import compose, initialize_config_dir

    from quantize.common.config import register
    from quantize.common.paths import CONF_DIR
    overrides, convert = CONVERSIONS[entry]
    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(entry, overrides=[*overrides, "trust_remote_code=true"])
    with pytest.raises(UserError, match="trust_remote_code=True: quantbench never runs code"):
        convert(cfg)


def test_lm_eval_model_args_cannot_turn_it_on():
    from evaluate.lmeval import LmEvalConfig, validate
    config = LmEvalConfig(name="austen_lastword", tasks=["austen_lastword"], model_args={"trust_remote_code": True})
    with pytest.raises(UserError, match="lm_eval.model_args.trust_remote_code=True: quantbench never runs code"):
        validate(config, "vllm")  # before the lm-eval environment is looked at
