"""The open_platypus preset calibrates on the text llm-compressor's
`dataset="open_platypus"` does: each record in the Alpaca prompt (its
`### Input:` section only where the input is not empty) followed by the
output, not instruction and output joined by a newline. Driven through the
preset's YAML with the hub split served without network."""
import json
from pathlib import Path

import pytest
import yaml

from quantize import calibration
from quantize.calibration import CalibrationConfig
from quantize.common.errors import UserError
from tests.conftest import run_quantize, tail

RECORDS = [
    {"instruction": "Add 2 and 3.", "input": "", "output": "5"},
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
]
# The Alpaca prompt as llm-compressor's open_platypus dataset documents it
EXPECTED = [
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
    "\n\n### Instruction:\nAdd 2 and 3.\n\n### Response:\n5",
    "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
    "response that appropriately completes the request.\n\n### Instruction:\nTranslate to French.\n\n### Input:\n"
    "Good morning\n\n### Response:\nBonjour",
]


class Recorder:
    """A tokenizer stand-in that keeps each text it is given; one id per character."""
    chat_template = None

    def __init__(self):
        self.texts = []

    def __call__(self, text, add_special_tokens=False, truncation=False, max_length=None):
        self.texts.append(text)
        ids = [ord(c) for c in text]
        return {"input_ids": ids[:max_length] if truncation else ids}


def preset(**overrides) -> CalibrationConfig:
    values = yaml.safe_load((Path(__file__).parents[2] / "conf/calibration/open_platypus.yaml").read_text())
    return CalibrationConfig.from_config({**values, "num_samples": 2, **overrides})


@pytest.fixture
def platypus(monkeypatch):
    import datasets
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kw: datasets.Dataset.from_list(RECORDS))


def test_the_open_platypus_preset_renders_records_as_llm_compressor_does(platypus):
    tok = Recorder()
    calib = calibration.build(preset(), tok, seed=0)
    assert calib.samples == [[ord(c) for c in text] for text in EXPECTED]


def test_a_calibration_file_of_alpaca_records_takes_the_template(tmp_path):
    """calibration.template was a key of the open_platypus preset only: over a
    local file of the same records, Hydra refused it as no key of the config."""
    from hydra import compose, initialize_config_dir

    from quantize.common.config import register
    from quantize.common.extensions import plain
    from quantize.common.paths import CONF_DIR
    data = tmp_path / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("quantize", overrides=["recipe=w8a8_smooth_gptq", "calibration=file", f"calibration.path={data}",
                                             "calibration.num_samples=2",
                                             "calibration.template=alpaca",
                                             "calibration.text_field=[instruction,input,output]"])
    calib = calibration.build(CalibrationConfig.from_config(plain(cfg)["calibration"]), Recorder(), seed=0)
    assert sorted(calib.samples) == sorted([ord(c) for c in text] for text in EXPECTED)


def test_an_unknown_template_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"^unknown calibration.template 'vicuna'; use alpaca, or null to join"):
        calibration.check(preset(template="vicuna"))


def test_the_template_needs_its_three_fields():
    with pytest.raises(UserError, match=r"calibration.template=alpaca renders three fields, instruction, input and "
                                        r"output, but calibration.text_field is \['instruction', 'output'\]"):
        calibration.check(preset(text_field=["instruction", "output"]))


def test_without_the_template_the_fields_are_joined(platypus):
    tok = Recorder()
    calib = calibration.build(preset(template=None, text_field=["instruction", "output"]), tok, seed=0)
    assert calib.samples == [[ord(c) for c in "Add 2 and 3.\n5"], [ord(c) for c in "Translate to French.\nBonjour"]]


def test_chat_messages_under_the_template_are_refused_naming_the_record(monkeypatch):
    import datasets
    chat = [{"role": "user", "content": "hi"}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kw: datasets.Dataset.from_list(
        [{"instruction": "x", "input": "", "output": "y", "messages": chat}]))
    with pytest.raises(UserError, match=r"calibration record 1 holds chat messages, which calibration.template="
                                        r"alpaca does not render; pass calibration.template=null"):
        calibration.build(preset(num_samples=1, text_field=["instruction", "messages", "output"]), Recorder(), 0)


def test_one_field_under_the_template_is_told_how_to_calibrate_on_it_as_it_is():
    """-m calibration.text_field=a,b sweeps a and b, one field each: "join them" was no fix for one field."""
    with pytest.raises(UserError, match=r"calibration.text_field is \['a'\]; name three, e.g. calibration.text_field="
                                        r"\[instruction,input,output\], or pass calibration.template=null to use the "
                                        r"field's text as it is$"):
        calibration.check(preset(text_field="a"))
    with pytest.raises(UserError, match=r"or pass calibration.template=null to join the fields with newlines$"):
        calibration.check(preset(text_field=["a", "b"]))


def test_a_sweep_over_single_fields_under_the_template_fails_each_job_naming_the_fix(tiny_model, workdir):
    """The user's view: each job of -m calibration.text_field=a,b is refused before any model loads."""
    arts = workdir / "artifacts"
    proc = run_quantize("-m", "recipe=w4a16_gptq", "calibration=open_platypus", "calibration.text_field=a,b",
                        f"model={tiny_model}", f"artifacts_dir={arts}", cwd=workdir)
    assert "sweep finished: 2 of 2 job(s) failed" in proc.stderr, tail(proc)
    assert "Traceback" not in proc.stderr + proc.stdout
    for name in "ab":
        assert (f"calibration.text_field is ['{name}']; name three, e.g. calibration.text_field=[instruction,input,"
                "output], or pass calibration.template=null to use the field's text as it is") in proc.stderr
    assert not arts.exists()
