"""`python -m quantize.sensitivity` as a user runs it, on a tiny model with a
planted sensitive cell: that cell ranks first, the JSON, CSV and heat map
read back, a rerun skips; bad input is one line, exit 2, nothing written."""
import csv

import pytest

from quantize.common import sensitivity_file
from quantize.common.atomic import staging_dir
from tests.conftest import run_cli, tail
from tests.quantize.sensitivity.planted import PLANTED_GROUP, PLANTED_LAYER, build_planted

SMALL_TEXT = ("text.num_windows=2", "text.window_len=64")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def planted_model(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("planted") / "planted-llama"
    with staging_dir(out) as tmp:
        build_planted(tiny_model, tmp)
    return out


@pytest.fixture(scope="module")
def measured(planted_model, tmp_path_factory):
    """One measurement of the planted model: (results dir, cwd, finished process)."""
    cwd = tmp_path_factory.mktemp("sensitivity-cwd")
    results = cwd / "results"
    proc = run_cli("quantize.sensitivity", "recipe=w4a16_rtn", f"model={planted_model}", f"results_dir={results}",
                   *SMALL_TEXT, cwd=cwd, timeout=300)
    assert proc.returncode == 0, tail(proc)
    return results, cwd, proc


def test_the_planted_cell_ranks_first_and_the_files_read_back(measured):
    results, _, proc = measured
    [path] = sensitivity_file.find(results)
    found = sensitivity_file.read(path)
    top, second = found.ranked()[:2]
    assert (top.layer, top.group) == (PLANTED_LAYER, PLANTED_GROUP), found.ranked()[:3]
    assert top.kl > 2 * second.kl
    assert top.modules == [f"model.layers.{PLANTED_LAYER}.{PLANTED_GROUP}"]
    # 2 layers x 7 Linear modules; lm_head is outside the layers (and ignored by the recipe)
    assert len(found.cells) == 14 and found.layers() == [0, 1]
    assert found.scheme_key == "w4a16-g64-asym" and "weights only" in found.scheme["applied"]
    assert found.text["scored_tokens"] == 2 * 63
    assert found.baseline_kl > top.kl
    assert path.parent == sensitivity_file.folder_for(results, "planted-llama", "w4a16-g64-asym", found.weights_hash)
    rows = list(csv.DictReader((path.parent / "sensitivity.csv").open()))
    assert (rows[0]["layer"], rows[0]["group"]) == (str(PLANTED_LAYER), PLANTED_GROUP) and len(rows) == 14
    assert (path.parent / "sensitivity.png").read_bytes().startswith(PNG_MAGIC)
    # the summary names the files and the planted cell first
    assert str(path) in proc.stdout
    top_line = proc.stdout.split("most sensitive cells")[1].splitlines()[1]
    assert f"layer   {PLANTED_LAYER}" in top_line and PLANTED_GROUP in top_line


def test_a_rerun_skips_and_says_where_the_file_is(measured, planted_model):
    results, cwd, _ = measured
    [path] = sensitivity_file.find(results)
    before = path.stat().st_mtime_ns
    proc = run_cli("quantize.sensitivity", "recipe=w4a16_rtn", f"model={planted_model}", f"results_dir={results}",
                   *SMALL_TEXT, cwd=cwd, timeout=300)
    assert proc.returncode == 0, tail(proc)
    assert "already measured" in proc.stdout and str(path) in proc.stdout and "force=true" in proc.stdout
    assert path.stat().st_mtime_ns == before


NO_WEIGHTS = """\
# KV cache quantization only: no weight scheme
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      kv_cache_scheme: {num_bits: 8, type: float, strategy: tensor, dynamic: false, symmetric: true}
"""


@pytest.mark.parametrize("args,said", [
    (["recipe=no_such_recipe"], "unknown recipe 'no_such_recipe'"),
    (["recipe=original"], "recipe original quantizes nothing"),
    (["recipe={no_weights}"], "has no weight quantization scheme"),
    (["recipe=w4a16_rtn", "text.source={short_text}"], "lower text.num_windows (2) or text.window_len"),
    (["recipe=w4a16_rtn", "text.books=[]"], "text.books is empty; name at least one held-out book"),
    # list("emma") was the letters e, m, m, a, refused as unknown Austen books after the model loaded
    (["recipe=w4a16_rtn", "text.books=emma"], "text.books=emma is one name, not a list; pass text.books=[emma]"),
    # list(5) was a TypeError traceback (exit 1)
    (["recipe=w4a16_rtn", "text.books=5"], "text.books=5 is not a list of names; pass a list, e.g. text.books=[persuasion]"),
])
def test_bad_input_is_one_line_and_writes_nothing(tiny_model, tmp_path, args, said):
    (tmp_path / "kv_only.yaml").write_text(NO_WEIGHTS)
    (tmp_path / "short.txt").write_text("Too short to hold two windows.")
    args = [a.format(no_weights=tmp_path / "kv_only.yaml", short_text=tmp_path / "short.txt") for a in args]
    results = tmp_path / "results"
    proc = run_cli("quantize.sensitivity", *args, f"model={tiny_model}", f"results_dir={results}", *SMALL_TEXT,
                   cwd=tmp_path, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, tail(proc)
    assert len(errors) == 1 and said in errors[0], tail(proc)
    assert not results.exists()


def test_a_window_longer_than_the_models_context_is_one_line_and_writes_nothing(tiny_model, tmp_path):
    """The tiny model covers 1024 positions: a window of 1025 tokens would be
    scored on positions it never learned, and the file would serve propose."""
    results = tmp_path / "results"
    proc = run_cli("quantize.sensitivity", "recipe=w4a16_rtn", f"model={tiny_model}", f"results_dir={results}",
                   "text.num_windows=1", "text.window_len=1025", cwd=tmp_path, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, tail(proc)
    assert len(errors) == 1, tail(proc)
    assert "text.window_len=1025 is longer than the 1024 positions" in errors[0], errors
    assert "text.window_len=1024 or less" in errors[0], errors
    assert not results.exists()
