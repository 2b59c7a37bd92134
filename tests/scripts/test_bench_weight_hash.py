"""scripts/bench_weight_hash.py on a tiny Llama shape: --delete removes the
checkpoint it built, never a model of the user's at --dir."""
import importlib.util
import json
import sys
from pathlib import Path

import numpy
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_weight_hash.py"


@pytest.fixture
def bench(monkeypatch):
    """The script as a module, shrunk to a one-layer model of a few KB."""
    spec = importlib.util.spec_from_file_location("bench_weight_hash", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in dict(HIDDEN=64, LAYERS=1, MLP=128, HEADS=4, KV_HEADS=4, VOCAB=256).items():
        monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(module, "hash_in_memory_gbps", lambda: 1.0)
    return module


def run(bench, monkeypatch, *args) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_weight_hash.py", *map(str, args)])
    bench.main()


def test_delete_removes_the_checkpoint_this_script_built(bench, monkeypatch, tmp_path, capsys):
    run(bench, monkeypatch, "--dir", tmp_path / "built", "--delete")
    assert not (tmp_path / "built").exists()
    assert f"deleted {tmp_path / 'built'}" in capsys.readouterr().out


def test_delete_keeps_a_checkpoint_of_the_users(bench, monkeypatch, tmp_path, capsys):
    """A folder with an index was taken for the script's own build, hashed, and rmtree'd."""
    mine = tmp_path / "mine"
    mine.mkdir()
    shard = "model-00001-of-00001.safetensors"
    bench.write_shard(mine / shard, bench.tensors(), numpy.random.default_rng(0))
    (mine / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n, _ in bench.tensors()}}))
    (mine / "config.json").write_text(json.dumps(bench.config()))
    (mine / "MY_NOTES.txt").write_text("the user's own file\n")
    run(bench, monkeypatch, "--dir", mine, "--delete")
    assert (mine / "MY_NOTES.txt").is_file() and (mine / "model.safetensors.index.json").is_file()
    assert f"kept {mine}: it has no {bench.MARKER} marker (built by an older run of this script, or not by it)" \
        in capsys.readouterr().out


def test_a_folder_of_other_files_is_refused_not_replaced(bench, monkeypatch, tmp_path, capsys):
    """Without an index the build replaced the whole folder."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "MY_NOTES.txt").write_text("the user's own file\n")
    with pytest.raises(SystemExit) as exit_:
        run(bench, monkeypatch, "--dir", folder, "--delete")
    assert exit_.value.code == 2
    assert sorted(p.name for p in folder.iterdir()) == ["MY_NOTES.txt"]
    assert "pass --dir <a new or empty folder>" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["file", "link to a file"])
def test_a_file_at_dir_is_refused_not_replaced(bench, monkeypatch, tmp_path, capsys, kind):
    """--dir naming a file: the build renamed it aside and put the checkpoint in its place."""
    mine = tmp_path / "my_weights.safetensors"
    mine.write_text("the user's own file\n")
    given = mine if kind == "file" else tmp_path / "link"
    if kind != "file":
        given.symlink_to(mine)
    with pytest.raises(SystemExit) as exit_:
        run(bench, monkeypatch, "--dir", given, "--delete")
    assert exit_.value.code == 2
    assert mine.read_text() == "the user's own file\n" and given.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({mine.name, given.name})
    assert capsys.readouterr().err.strip() == (f"error: --dir {given} is a file, not a folder; building there would "
                                               "replace it: pass --dir <a new or empty folder>")
