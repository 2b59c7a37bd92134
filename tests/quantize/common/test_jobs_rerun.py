"""Every row carries the command that measures it again; running that line
gives a row of the same artifact and setup (dummy engine: seconds, no model)."""
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import quantize_env, run_quantize, tail
from evaluate import results
from tests.evaluate.engines.test_base import DUMMY_DIR, evaluate_with_dummy


def test_a_rows_repro_line_measures_it_again(tiny_model, tmp_path):
    built = run_quantize(f"model={tiny_model}", "recipe=original", f"artifacts_dir={tmp_path / 'art'}",
                         "force=true", cwd=tmp_path)
    assert built.returncode == 0, tail(built)
    (artifact,) = (tmp_path / "art").glob("*/original")
    res = tmp_path / "res"
    out = evaluate_with_dummy(f"model={artifact}", "accuracy=none", "scenario=interactive", "runs=1",
                              f"results_dir={res}", cwd=tmp_path)
    assert out.returncode == 0, tail(out)
    (first,) = results.read(res)
    assert first.repro.startswith(f"cd {tmp_path} && python -m quantize ")
    assert "force=" not in first.repro and " && python -m evaluate " in first.repro

    for f in res.glob("results*.jsonl"):
        f.unlink()
    env = quantize_env()
    env["PYTHONPATH"] = os.pathsep.join((str(DUMMY_DIR), env["PYTHONPATH"]))
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env["PATH"]))
    again = subprocess.run(["bash", "-c", first.repro], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, tail(again)
    assert "skipping" in again.stderr + again.stdout  # the artifact is complete: not rebuilt
    (second,) = results.read(res)
    assert (second.artifact_id, second.setup_id, second.scenario) == (first.artifact_id, first.setup_id,
                                                                      first.scenario)
    assert second.repro == first.repro
