"""Same inputs -> same artifact id -> skipped; force=true rebuilds; other inputs
into an existing artifact dir are refused unless forced."""
import shutil

import pytest

from tests.conftest import (SMALL_CALIB, TINY_NAME, Artifact, check_ok, file_sha256, last_line,
                      run_quantize)

RECIPE = "w4a16_rtn"  # the fastest quantizing recipe
CALIBRATED = "w8a8_smooth_ptq"  # the fastest recipe that calibrates on data


def snapshot(art_dir):
    """mtime (ns) and content hash of every file in the artifact."""
    return {p.name: (p.stat().st_mtime_ns, file_sha256(p)) for p in art_dir.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def local(tmp_path_factory, tiny_model, build_artifact):
    """A copy of the session's artifact in this module's own artifacts dir (the
    tests below rebuild and overwrite it), and a way to rerun quantize there
    with the same inputs plus extra overrides."""
    session = build_artifact(RECIPE)
    root = tmp_path_factory.mktemp("idempotence")
    cwd, arts = root / "cwd", root / "artifacts"
    cwd.mkdir()
    art = Artifact(RECIPE, arts / TINY_NAME / RECIPE, session.proc)
    shutil.copytree(session.dir, art.dir)
    args = (f"recipe={RECIPE}", f"model={tiny_model}", *SMALL_CALIB, f"artifacts_dir={arts}")

    def rerun(*extra):
        return run_quantize(*args, *extra, cwd=cwd)

    return art, rerun, session


def test_rerun_with_same_inputs_skips(local):
    """Inputs re-hashed from another cwd and artifacts dir give the same id."""
    art, rerun, _ = local
    before, manifest = snapshot(art.dir), art.manifest
    proc = check_ok(rerun())
    assert "skipping" in (proc.stdout + proc.stderr)
    assert manifest["artifact_id"] in (proc.stdout + proc.stderr)
    assert snapshot(art.dir) == before  # nothing rewritten, manifest mtime included
    assert art.manifest == manifest


def test_other_calibration_without_force_is_refused(build_artifact, tiny_model, tmp_path):
    """Of a recipe that calibrates on data (w4a16_rtn needs none: tests/quantize/test_data_free.py)."""
    session = build_artifact(CALIBRATED)
    art = Artifact(CALIBRATED, tmp_path / CALIBRATED, session.proc)
    shutil.copytree(session.dir, art.dir)
    (tmp_path / "cwd").mkdir()
    before, manifest = snapshot(art.dir), art.manifest
    proc = run_quantize(f"recipe={CALIBRATED}", f"model={tiny_model}", *SMALL_CALIB, f"artifact_dir={art.dir}",
                        "seed=1", cwd=tmp_path / "cwd")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    line = last_line(proc.stderr)
    assert line.startswith("error:") and "force=true" in line, proc.stderr[-2000:]
    assert manifest["artifact_id"] in line  # names the artifact it would have replaced
    assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [line]
    assert snapshot(art.dir) == before


def test_force_rebuilds_the_same_bytes(local):
    """A forced rebuild is an independent build: same id, byte-identical files."""
    art, rerun, session = local
    before, manifest = snapshot(art.dir), art.manifest
    proc = check_ok(rerun("force=true"))
    assert "skipping" not in (proc.stdout + proc.stderr)
    after = snapshot(art.dir)
    assert after.keys() == before.keys()
    assert after["manifest.json"][0] != before["manifest.json"][0]          # rewritten
    assert after["model.safetensors"][0] != before["model.safetensors"][0]
    assert art.manifest["artifact_id"] == manifest["artifact_id"]
    assert art.manifest["config"]["force"] is True
    for name in ("model.safetensors", "config.json", "recipe.yaml", "tokenizer.json"):
        assert file_sha256(art.dir / name) == file_sha256(session.dir / name), name
    assert not [p.name for p in art.dir.parent.iterdir() if p.name.startswith(".")]
