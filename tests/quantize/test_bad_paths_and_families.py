"""Inputs that used to end in a traceback, each now a working run or one
line naming the fix (exit 2, nothing written), through the real CLIs:
- artifacts_dir= / artifact_dir= at or under a regular file (quantize), and
  results_dir= / artifacts_dir= a regular file (evaluate);
- a GPT-NeoX-shaped model (fused query_key_value, lm_head stored as
  embed_out): recipe=original and w4a16_gptq are built and verified;
  SmoothQuant, for which llm-compressor has no GPT-NeoX mappings, is one line
  before calibration, and a recipe with the explicit `mappings:` that line asks
  for quantizes it."""
import json
import shutil

import pytest

from quantize import verify
from tests.conftest import SMALL_CALIB, check_ok, last_line, run_cli, run_quantize, tail

NEOX = "tiny-neox"
# What the one line asks for, written for GPT-NeoX: each norm smoothed into the Linear it feeds.
NEOX_SMOOTH_RECIPE = """\
quant_stage:
  quant_modifiers:
    SmoothQuantModifier:
      smoothing_strength: 0.8
      mappings:
        - [["re:.*query_key_value"], "re:.*input_layernorm"]
        - [["re:.*dense_h_to_4h"], "re:.*post_attention_layernorm"]
    GPTQModifier:
      targets: [Linear]
      scheme: W8A8
      ignore: [lm_head]
      dampening_frac: 0.01
"""


def build_tiny_neox(out, tokenizer_dir):
    """A 2-layer random GPT-NeoX (hidden 128) with SmolLM2's tokenizer; untied
    output embedding, as Pythia's, so the checkpoint holds embed_out.weight."""
    import torch
    from transformers import AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = GPTNeoXConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=1024, tie_word_embeddings=False,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           dtype="bfloat16")
    torch.manual_seed(0)
    GPTNeoXForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def neox(tmp_path_factory, tokenizer_dir):
    return build_tiny_neox(tmp_path_factory.mktemp("neox") / NEOX, tokenizer_dir)


def assert_one_line_error(proc, *phrases: str) -> str:
    assert proc.returncode == 2, tail(proc)
    line = last_line(proc.stderr)
    assert line.startswith("error: ") and "Traceback" not in proc.stderr, tail(proc)
    for phrase in phrases:
        assert phrase in line, line
    return line


# ---- output folders at or under a regular file --------------------------------

@pytest.mark.parametrize("setting", ["artifacts_dir", "artifact_dir"])
def test_quantize_output_under_a_file_is_one_line_before_any_work(tmp_path, workdir, tiny_model, setting):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file\n")
    proc = run_quantize("recipe=original", f"model={tiny_model}", f"{setting}={blocker}", cwd=workdir)
    assert_one_line_error(proc, f"{blocker} is a file, not a directory", "pass artifacts_dir=<a directory>")
    assert "load model" not in proc.stdout + proc.stderr  # refused before the model was read
    assert blocker.read_text() == "a file\n"


@pytest.mark.parametrize("force", [False, True])
def test_an_artifact_dir_that_holds_other_files_is_never_replaced(tmp_path, workdir, tiny_model, force):
    """artifact_dir= one level too high (a model's artifacts folder), or at a
    model or the project: the build's swap deleted everything in it."""
    model_folder = tmp_path / "artifacts" / "tiny"
    (model_folder / "w4a16_gptq").mkdir(parents=True)
    (model_folder / "w4a16_gptq" / "manifest.json").write_text('{"artifact_id": "other"}\n')
    (model_folder / "notes.txt").write_text("keep me\n")
    before = sorted(p.relative_to(model_folder) for p in model_folder.rglob("*"))
    proc = run_quantize("recipe=original", f"model={tiny_model}", f"artifact_dir={model_folder}",
                        f"force={str(force).lower()}", cwd=workdir)
    assert_one_line_error(proc, f"artifact_dir={model_folder} holds files but no manifest.json: it is not an artifact",
                          "pass artifact_dir=<a new or empty folder>")
    assert sorted(p.relative_to(model_folder) for p in model_folder.rglob("*")) == before
    assert "load model" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("setting,phrases", [
    ("results_dir", ("cannot write results to", "pass results_dir=<a writable directory>")),
    ("artifacts_dir", ("no complete artifact at", "python -m quantize recipe=original")),
])
def test_evaluate_output_or_input_folder_a_file_is_one_line(tmp_path, workdir, tiny_model, setting, phrases):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file\n")
    args = [f"results_dir={tmp_path / 'results'}", f"model={tiny_model}"]
    if setting == "artifacts_dir":
        args = [f"results_dir={tmp_path / 'results'}", "recipe=original"]
    proc = run_cli("evaluate", *args, f"{setting}={blocker}", "engine=hf", "runs=1", "accuracy=none", cwd=workdir)
    assert_one_line_error(proc, str(blocker), *phrases)
    assert blocker.read_text() == "a file\n"
    assert not [p for p in (tmp_path / "results").rglob("*") if p.is_file()]  # no row, no file


def test_a_report_folder_that_cannot_be_written_is_one_line(tmp_path, workdir):
    """out_dir under a file, or where no file can be made (/proc: root too), before any result is read."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file\n")
    for out_dir, phrase in ((blocker / "reports", f"{blocker} is a file, not a directory"),
                            ("/proc/quantbench-reports", "cannot write to /proc/quantbench-reports (no file can be made in /proc)")):
        proc = run_cli("evaluate.report", f"results_dir={tmp_path / 'results'}", f"out_dir={out_dir}", cwd=workdir)
        assert_one_line_error(proc, phrase, "pass out_dir=<a writable directory>")
    assert blocker.read_text() == "a file\n"


def test_a_sensitivity_folder_that_cannot_be_written_is_one_line(tmp_path, workdir, tiny_model):
    proc = run_cli("quantize.sensitivity", f"model={tiny_model}", "recipe=w4a16_rtn",
                   "results_dir=/proc/quantbench-sensitivity", cwd=workdir)
    assert_one_line_error(proc, "cannot write to /proc/quantbench-sensitivity",
                          "pass results_dir=<a writable directory>")


# ---- names that are folders, folders left empty ------------------------------------

@pytest.mark.parametrize("arg", ["model.name=../../escaped", "model.name=", "recipe.name=.."])
def test_a_name_that_is_not_one_folder_is_refused_before_hydra_makes_its_log_folder(tmp_path, workdir, tiny_model,
                                                                                      arg):
    """model.name=../../escaped wrote a whole artifact two levels above artifacts_dir, and an empty name
    one level up; Hydra's own log folder (logs/quantize/<time>_<model>_<recipe>) escaped logs/ as well."""
    arts = tmp_path / "deep" / "artifacts"
    proc = run_quantize("recipe=original", f"model={tiny_model}", f"artifacts_dir={arts}", arg, cwd=workdir)
    key, _, value = arg.partition("=")
    assert_one_line_error(proc, f"{key}={value!r} is not a folder name", f"pass a name without '/', e.g. {key}=")
    assert not (tmp_path / "deep").exists() and not (tmp_path / "escaped").exists()
    assert not (workdir / "logs").exists()


@pytest.mark.parametrize("module,args,key", [
    ("quantize", ["recipe=original"], "artifacts_dir"),
    ("evaluate", ["engine=hf"], "results_dir"),
    ("evaluate", ["engine=hf", "recipe=original"], "artifacts_dir"),
    ("quantize.sensitivity", ["recipe=w4a16_rtn"], "results_dir"),
    ("quantize.propose", ["recipe=w4a16_gptq", "kept_dense=1"], "recipes_dir"),
    ("evaluate.track", [], "results_dir"),
])
def test_an_empty_folder_setting_is_refused(tmp_path, workdir, tiny_model, module, args, key):
    """`results_dir=$OUT` with OUT unset: evaluate wrote into the working directory, and quantize's
    `${artifacts_dir}/<model>/<recipe>` became /<model>/<recipe>, at the file system's root."""
    model = [] if module == "evaluate.track" else [f"model={tiny_model}"]
    proc = run_cli(module, *model, *args, f"{key}=", cwd=workdir)
    assert_one_line_error(proc, f"{key} is empty (an unset shell variable?); pass {key}=<a folder>, or {key}=. ")
    assert not [p for p in workdir.rglob("*") if p.is_file() and "logs" not in p.parts]


@pytest.mark.parametrize("module,args,arg,expect", [
    ("quantize", ["recipe=original"], "artifacts_dir=true", "artifacts_dir=true is not a folder path; pass one"),
    ("quantize", ["recipe=original"], "model.name=2.5",
     "model.name=2.5 is not a folder name; pass one, e.g. model.name=my-model; to name a folder 2.5, quote it: "
     "'model.name=\"2.5\"'"),
    ("evaluate", ["engine=hf"], "results_dir=1e999", "results_dir=inf is not a folder path"),
    ("evaluate.report", [], "out_dir=true", "out_dir=true is not a folder path"),
])
def test_a_folder_hydra_reads_as_a_bool_or_a_float_is_refused(tmp_path, workdir, tiny_model, module, args, arg, expect):
    """`out_dir=true` wrote the report to ./True and `results_dir=1e999` rows to ./inf: not the text typed."""
    model = [] if module == "evaluate.report" else [f"model={tiny_model}"]
    proc = run_cli(module, *model, *args, arg, cwd=workdir)
    assert_one_line_error(proc, expect)
    assert not [p for p in workdir.rglob("*") if p.is_file() and "logs" not in p.parts]


# ---- a GPT-NeoX-shaped model ------------------------------------------------------

@pytest.fixture(scope="module")
def neox_artifacts(neox, tmp_path_factory):
    """original and w4a16_gptq in one sweep; W8A8 SmoothQuant with explicit mappings (a recipe file)."""
    root = tmp_path_factory.mktemp("neox-builds")
    smooth = root / "w8a8_smooth_gptq_neox.yaml"
    smooth.write_text(NEOX_SMOOTH_RECIPE)
    arts = root / "artifacts"
    for recipe in ("-m recipe=original,w4a16_gptq", f"recipe={smooth}"):
        check_ok(run_quantize(*recipe.split(), f"model={neox}", *SMALL_CALIB, f"artifacts_dir={arts}", cwd=root))
    return {name: arts / NEOX / name for name in ("original", "w4a16_gptq", smooth.stem)}


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["original", "w4a16_gptq", "w8a8_smooth_gptq_neox"])
def test_neox_is_built_and_its_tensors_verified(neox_artifacts, recipe):
    manifest = json.loads((neox_artifacts[recipe] / "manifest.json").read_text())
    assert manifest["model"]["architecture"] == "GPTNeoXForCausalLM"
    checks = manifest["checks"]
    assert (checks["verified_by"], checks["layout_matches_model"], checks["values_finite"]) == ("tensors", True, True)
    assert verify.read_headers(neox_artifacts[recipe]).keys() >= {"embed_out.weight"}  # stored as transformers saves it


@pytest.mark.extended
@pytest.mark.slow
def test_the_tensor_check_still_finds_a_missing_neox_output_layer(neox_artifacts, tmp_path):
    """embed_out is compared as the lm_head it loads as, not skipped."""
    from safetensors.torch import load_file, save_file
    broken = tmp_path / "broken"
    shutil.copytree(neox_artifacts["original"], broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["embed_out.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="missing tensor lm_head.weight"):
        verify.check(broken, "tensors", prunes=False)


@pytest.mark.parametrize("recipe,phrases", [
    ("w8a8_smooth_gptq", ("llm-compressor has no SmoothQuant mappings for GPTNeoXForCausalLM",
                          "would fall back to its Llama-style defaults",
                          "`mappings: [[<balance Linear layers>], <smooth norm layer>]` under its SmoothQuantModifier",
                          "attention.query_key_value")),
    pytest.param("typo", ("mappings in the recipe name layers GPTNeoXForCausalLM lacks", "re:.*query_key_valu$"),
                 marks=pytest.mark.slow),  # a second llm-compressor start-up (~25 s on 2 shared cores)
])
def test_smoothquant_without_mappings_for_the_model_is_one_line_before_calibration(neox, tmp_path, recipe, phrases):
    if recipe == "typo":
        path = tmp_path / "typo.yaml"
        path.write_text(NEOX_SMOOTH_RECIPE.replace('"re:.*query_key_value"', '"re:.*query_key_valu$"'))
        recipe = str(path)
    arts = tmp_path / "artifacts"
    proc = run_quantize(f"recipe={recipe}", f"model={neox}", *SMALL_CALIB, f"artifacts_dir={arts}", cwd=tmp_path)
    assert_one_line_error(proc, *phrases)
    assert "load tokenizer and calibration" not in proc.stdout + proc.stderr  # nothing calibrated or loaded
    assert not arts.exists()
