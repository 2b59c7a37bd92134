"""Inputs `python -m quantize` refuses before it loads the model: exit 2, one
`error:` line naming the fix, no traceback, nothing written."""
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import SMALL_CALIB, last_line, recipe_source, run_quantize, tail


def assert_refused(proc, arts: Path, *words: str) -> str:
    """The one error line, after checking how the run ended and that `arts` stayed unwritten."""
    assert proc.returncode == 2, tail(proc)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = last_line(proc.stderr)
    assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [line], proc.stderr[-3000:]
    for word in words:
        assert word in line, f"{word!r} not in: {line}"
    assert not arts.exists(), f"wrote into the artifacts dir: {sorted(arts.rglob('*'))}"
    return line


def copy_with_config(tiny: Path, dest: Path, **changes) -> Path:
    """A copy of the tiny model whose config.json has `changes` applied."""
    shutil.copytree(tiny, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(config | changes))
    return dest


PACKED_W4 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}}}


def test_an_already_quantized_model_is_refused_as_the_base(tmp_path, workdir, tiny_model):
    """Saved as `original` it would be the report's baseline; a recipe would quantize it twice."""
    quantized = copy_with_config(tiny_model, tmp_path / "w4", quantization_config=PACKED_W4)
    arts = tmp_path / "artifacts"
    for recipe in ("original", "w4a16_rtn"):
        proc = run_quantize(f"recipe={recipe}", f"model={quantized}", *SMALL_CALIB, f"artifacts_dir={arts}",
                            cwd=workdir)
        assert_refused(proc, arts, str(quantized), "already quantized", "model=<its full-precision checkpoint>")


def test_a_quantizing_recipe_named_original_is_refused(tmp_path, workdir, tiny_model):
    """Saved as `original`, it would be the report's speed-up and accuracy baseline."""
    copy = tmp_path / "mine" / "original.yaml"
    copy.parent.mkdir()
    copy.write_text(recipe_source("w4a16_rtn").read_text())
    arts = tmp_path / "artifacts"
    for args in ([f"recipe={copy}"], ["recipe=w4a16_rtn", "recipe.name=original"]):
        proc = run_quantize(*args, f"model={tiny_model}", *SMALL_CALIB, f"artifacts_dir={arts}", cwd=workdir)
        assert_refused(proc, arts, "'original' is the unquantized baseline's", "recipe.name=<another name>")


def test_a_recipe_without_modifiers_under_another_name_is_refused(tmp_path, workdir, tiny_model):
    """It would save the dense model as `my_w4`, ranked as a quantized recipe."""
    arts = tmp_path / "artifacts"
    for text in ("# int4 weights, to be written\n", "", "{}\n"):
        empty = tmp_path / "my_w4.yaml"
        empty.write_text(text)
        proc = run_quantize(f"recipe={empty}", f"model={tiny_model}", *SMALL_CALIB, f"artifacts_dir={arts}",
                            cwd=workdir)
        assert_refused(proc, arts, str(empty), "holds no modifiers", "'my_w4'", "recipe=original")


def test_calibration_windows_longer_than_the_model_positions_are_refused(tmp_path, workdir, tiny_model):
    """Learned positions (OPT) crashed oneshot with an IndexError; RoPE calibrated on positions never served."""
    short = copy_with_config(tiny_model, tmp_path / "short", max_position_embeddings=256)
    arts = tmp_path / "artifacts"
    proc = run_quantize("recipe=w8a8_smooth_ptq", f"model={short}", "calibration.num_samples=2",
                        "calibration.max_seq_len=512", f"artifacts_dir={arts}", cwd=workdir)
    assert_refused(proc, arts, "calibration.max_seq_len=512", "256 positions", "calibration.max_seq_len=256")


def test_calibration_windows_longer_than_gpt2_style_n_positions_are_refused(tmp_path, workdir, tiny_model):
    """GPT-2, GPT-J and StarCoder give their positions as n_positions, not max_position_embeddings."""
    gpt2_style = copy_with_config(tiny_model, tmp_path / "gpt2_style", n_positions=256, n_ctx=256)
    config = json.loads((gpt2_style / "config.json").read_text())
    del config["max_position_embeddings"]
    (gpt2_style / "config.json").write_text(json.dumps(config))
    arts = tmp_path / "artifacts"
    proc = run_quantize("recipe=w8a8_smooth_ptq", f"model={gpt2_style}", "calibration.num_samples=2",
                        "calibration.max_seq_len=512", f"artifacts_dir={arts}", cwd=workdir)
    assert_refused(proc, arts, "calibration.max_seq_len=512", "256 positions", "calibration.max_seq_len=256")


def test_an_artifact_of_another_seed_or_dtype_names_what_differs_and_a_folder_per_point(tmp_path, workdir, tiny_model):
    """Neither input is in the default folder name: a sweep over one collides, and the line says which
    differs and the artifact_dir that keeps each point apart."""
    arts = tmp_path / "artifacts"
    calibrated = ("recipe=w8a8_smooth_ptq", f"model={tiny_model}", "calibration.num_samples=2",
                  "calibration.max_seq_len=64", f"artifacts_dir={arts}")
    first = run_quantize(*calibrated, "seed=0", "calibration_dtype=float32", cwd=workdir)
    assert first.returncode == 0, tail(first)
    built = arts / "tiny-llama" / "w8a8_smooth_ptq"
    before = {p: p.stat().st_mtime_ns for p in built.rglob("*")}
    for change, words in (("seed=1", ["seed 0 -> 1", "artifact_dir='${artifacts_dir}/${model.name}/${recipe.name}"
                                                    "-seed${seed}'"]),
                          ("calibration_dtype=bfloat16", ["calibration_dtype float32 -> bfloat16", "-${calibration_dtype}'"])):
        seed = "seed=0" if change.startswith("calibration_dtype") else change
        dtype = change if change.startswith("calibration_dtype") else "calibration_dtype=float32"
        proc = run_quantize(*calibrated, seed, dtype, cwd=workdir)
        assert proc.returncode == 2, tail(proc)
        line = last_line(proc.stderr)
        assert line.startswith(f"error: {built} holds artifact "), line
        for word in words:
            assert word in line, f"{word!r} not in: {line}"
        assert {p: p.stat().st_mtime_ns for p in built.rglob("*")} == before
    # the folder the line proposes, as typed: each point gets its own
    pattern = line.split("artifact_dir=", 1)[1].split(" ", 1)[0].strip("'")
    apart = run_quantize(*calibrated, "seed=0", "calibration_dtype=bfloat16", f"artifact_dir={pattern}", cwd=workdir)
    assert apart.returncode == 0, tail(apart)
    assert (arts / "tiny-llama" / "w8a8_smooth_ptq-bfloat16" / "manifest.json").is_file()


def test_a_calibration_size_sweep_is_told_a_folder_naming_the_size(tmp_path, workdir, tiny_model):
    """calibration.num_samples=2,3 keeps the name austen: the line named
    -${calibration.name}, which collided again; it now names the size, and
    that folder takes the second point."""
    arts = tmp_path / "artifacts"
    calibrated = ("recipe=w8a8_smooth_ptq", f"model={tiny_model}", "calibration.max_seq_len=64",
                  f"artifacts_dir={arts}")
    first = run_quantize(*calibrated, "calibration.num_samples=2", cwd=workdir)
    assert first.returncode == 0, tail(first)
    proc = run_quantize(*calibrated, "calibration.num_samples=3", cwd=workdir)
    assert proc.returncode == 2, tail(proc)
    line = last_line(proc.stderr)
    suggested = "artifact_dir='${artifacts_dir}/${model.name}/${recipe.name}-n${calibration.num_samples}'"
    assert suggested in line and "calibration.name" not in line, line
    apart = run_quantize(*calibrated, "calibration.num_samples=3", suggested.replace("'", ""), cwd=workdir)
    assert apart.returncode == 0, tail(apart)
    assert (arts / "tiny-llama" / "w8a8_smooth_ptq-n3" / "manifest.json").is_file()


AUSTEN = {"name": "austen", "source": "austen", "books": ["emma"], "num_samples": 2, "max_seq_len": 64}
CHATS = {"name": "train.jsonl", "source": "file", "path": "/a/train.jsonl", "text_field": "text",
         "num_samples": 2, "max_seq_len": 64}


@pytest.mark.parametrize("keys, now, suffix", [
    (["seed", "calibration_sha256"], AUSTEN, "-seed${seed}"),
    (["calibration_dtype"], AUSTEN, "-${calibration_dtype}"),
    (["seed", "calibration_sha256", "calibration_dtype"], AUSTEN, "-seed${seed}-${calibration_dtype}"),
    (["calibration_sha256"], AUSTEN | {"num_samples": 4}, "-n${calibration.num_samples}"),
    (["calibration_sha256"], AUSTEN | {"max_seq_len": 32}, "-len${calibration.max_seq_len}"),
    (["calibration_sha256"], CHATS, "-${calibration.name}"),           # another preset: its name tells
    (["seed", "calibration_sha256"], CHATS | {"num_samples": 4}, "-seed${seed}-${calibration.name}-n${calibration.num_samples}"),
    (["calibration_sha256"], AUSTEN | {"books": ["emma", "persuasion"]}, None),   # a list names no folder
    (["calibration_sha256"], AUSTEN, None),                            # same settings, other tokens
    (["recipe_sha256"], AUSTEN, None),
    (["seed", "versions"], AUSTEN, None)])
def test_the_per_point_folder_names_what_differs_or_asks_for_a_new_dir(keys, now, suffix):
    from quantize.pipeline import per_point_suffix
    assert per_point_suffix(keys, AUSTEN | {"num_tokens": 128, "sha256": "ab" * 32}, now) == suffix


@pytest.mark.parametrize("now", [CHATS | {"path": "/b/train.jsonl"}, CHATS | {"text_field": ["q", "a"]},
                                 CHATS | {"text_field": "a/b"}])
def test_files_of_one_basename_or_fields_no_folder_holds_get_no_suffix_that_collides_again(now):
    from quantize.pipeline import per_point_suffix
    assert per_point_suffix(["calibration_sha256"], CHATS, now) is None


CHATS_B = CHATS | {"name": "code.jsonl", "path": "/a/code.jsonl"}


@pytest.mark.parametrize("then, now, swept, suffix", [
    # another file read from another field: the name alone would not tell (code, text) from (code, body)
    (CHATS | {"text_field": "body"}, CHATS_B, (), "-${calibration.name}-${calibration.text_field}"),
    (CHATS, CHATS | {"text_field": "body"}, (), "-${calibration.text_field}"),
    # -m calibration.path=a,b calibration.text_field=text,body: each point's line names both
    (CHATS, CHATS_B, ("calibration.path", "calibration.text_field"), "-${calibration.name}-${calibration.text_field}"),
    (CHATS, CHATS | {"text_field": "body"}, ("calibration.path", "calibration.text_field"),
     "-${calibration.name}-${calibration.text_field}"),
    (AUSTEN, AUSTEN, ("seed", "calibration_dtype", "recipe"), "-seed${seed}-${calibration_dtype}"),
    (AUSTEN, AUSTEN, ("seed", "calibration.books"), None),       # books sweep too: no folder name holds them
])
def test_the_per_point_folder_names_every_setting_the_points_differ_in(then, now, swept, suffix):
    from quantize.pipeline import per_point_suffix
    keys = ["seed", "calibration_sha256"] if then == now else ["calibration_sha256"]
    assert per_point_suffix(keys, then | {"num_tokens": 128, "sha256": "ab" * 32}, now, swept) == suffix


def test_a_sweep_over_calibration_files_and_fields_is_told_a_folder_that_keeps_every_point_apart(
        tmp_path, workdir, tiny_model):
    """It was told -${calibration.name}, under which (b, text) and (b, body) collide again."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a", "b"):
        (data / f"{name}.jsonl").write_text("".join(
            json.dumps({"text": f"{name} plain text number {i}.", "body": f"{name} body {i} of the record."}) + "\n"
            for i in range(8)))
    arts = tmp_path / "artifacts"
    sweep = ("-m", "recipe=w8a8_smooth_ptq", f"model={tiny_model}", "calibration.num_samples=2",
             "calibration.max_seq_len=64", f"calibration={data / 'a.jsonl'},{data / 'b.jsonl'}",
             "calibration.text_field=text,body", f"artifacts_dir={arts}")
    proc = run_quantize(*sweep, cwd=workdir)
    assert proc.returncode == 1, tail(proc)
    folder = "artifact_dir='${artifacts_dir}/${model.name}/${recipe.name}-${calibration.name}-${calibration.text_field}'"
    refusals = [line for line in proc.stderr.splitlines() if "pass force=true to replace it" in line]
    assert len(refusals) == 3 and all(folder in line for line in refusals), proc.stderr[-3000:]
    apart = run_quantize(*sweep, folder.replace("'", ""), cwd=workdir)
    assert apart.returncode == 0, tail(apart)
    built = {p.parent.name for p in (arts / "tiny-llama").glob("*/manifest.json")}
    assert built == {"w8a8_smooth_ptq", *(f"w8a8_smooth_ptq-{f}.jsonl-{t}" for f in "ab" for t in ("text", "body"))}


def test_a_recipe_file_that_is_not_utf8_is_refused(tmp_path, workdir, tiny_model):
    latin1 = tmp_path / "w4_latin1.yaml"
    latin1.write_bytes(recipe_source("w4a16_rtn").read_bytes() + "# réglé pour le modèle\n".encode("latin-1"))
    arts = tmp_path / "artifacts"
    proc = run_quantize(f"recipe={latin1}", f"model={tiny_model}", *SMALL_CALIB, f"artifacts_dir={arts}", cwd=workdir)
    assert_refused(proc, arts, str(latin1), "is not UTF-8 text", "save it as UTF-8")


def test_a_config_json_that_holds_no_object_is_refused(tmp_path, workdir, tiny_model):
    """Truncated, it crashed the memory check; a JSON list crashed on .get."""
    arts = tmp_path / "artifacts"
    whole = (tiny_model / "config.json").read_text()
    for name, text, words in (("truncated", whole[:len(whole) // 2], ["is corrupt (not valid JSON"]),
                              ("a-list", "[" + whole + "]", ["holds a JSON list", "not the object of a model config"]),
                              ("latin1", None, ["is corrupt"])):
        model = copy_with_config(tiny_model, tmp_path / name)
        if text is None:
            (model / "config.json").write_bytes(whole.replace('"llama"', '"llamà"').encode("latin-1"))
        else:
            (model / "config.json").write_text(text)
        for recipe in ("original", "w4a16_rtn"):
            proc = run_quantize(f"recipe={recipe}", f"model={model}", *SMALL_CALIB, f"artifacts_dir={arts}",
                                cwd=workdir)
            assert_refused(proc, arts, str(model / "config.json"), "re-copy or re-create the checkpoint", *words)


def test_a_forced_sweep_whose_points_share_a_folder_is_refused_before_any_job(tmp_path, workdir, tiny_model):
    """-m seed=0,1 force=true had each point replace the one before: the last won, silently."""
    arts = tmp_path / "artifacts"
    sweep = ("-m", "recipe=w8a8_smooth_ptq", f"model={tiny_model}", *SMALL_CALIB, "seed=0,1", "force=true",
             f"artifacts_dir={arts}")
    proc = run_quantize(*sweep, cwd=workdir)
    folder = "artifact_dir='${artifacts_dir}/${model.name}/${recipe.name}-seed${seed}'"
    assert_refused(proc, arts, "force=true", "(seed=0) and (seed=1)", str(arts / "tiny-llama" / "w8a8_smooth_ptq"),
                   folder, "or drop force=true")
    assert not (workdir / "logs").exists(), "a job started"
    apart = run_quantize(*sweep, folder.replace("'", ""), cwd=workdir)   # points in folders of their own run
    assert apart.returncode == 0, tail(apart)
    assert {p.parent.name for p in (arts / "tiny-llama").glob("*/manifest.json")} == {
        "w8a8_smooth_ptq-seed0", "w8a8_smooth_ptq-seed1"}
