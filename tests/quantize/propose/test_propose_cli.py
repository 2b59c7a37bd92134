"""`python -m quantize.propose` as a user runs it: bad input is one line and
exit 2 with nothing written; a proposed recipe goes through `python -m
quantize` with its kept modules dense in the saved checkpoint."""
import json
import uuid

import pytest

from quantize.common.checkpoint import read_header, weight_files
from tests.conftest import RECIPES_DIR, SMALL_CALIB, TINY_NAME, run_cli, run_quantize, tail
from tests.quantize.propose.synthetic import cells_with_kl, linear_weights, write_sensitivity
from tests.quantize.propose.test_propose import SECOND, SIBLINGS, TOP, planted_kl


@pytest.fixture
def store(tmp_path, tiny_model):
    results = tmp_path / "results"
    write_sensitivity(results, tiny_model, cells_with_kl(tiny_model, planted_kl))
    return results


def propose(tmp_path, tiny_model, results, *args: str, cwd):
    return run_cli("quantize.propose", f"model={tiny_model}", f"results_dir={results}",
                   f"artifacts_dir={tmp_path / 'artifacts'}", f"recipes_dir={tmp_path / 'recipes'}", *args, cwd=cwd)


@pytest.mark.parametrize("args,said", [
    (["recipe=w4a16_gptq"], "give exactly one target"),
    (["recipe=w4a16_gptq", "max_kl=0.1", "kept_dense=2"], "give exactly one target: max_size_mb=<MB>, max_kl=<nats> "
                                                           "or kept_dense=<k> (got max_kl, kept_dense)"),
    (["recipe=w4a16_gptq", "kept_dense=15"], "kept_dense=15 is out of range"),
    (["recipe=w4a16_gptq", "max_kl=-1"], "max_kl=-1 must be 0 or more"),
    (["recipe=no_such_recipe", "kept_dense=1"], "unknown recipe 'no_such_recipe'"),
    (["recipe=original", "kept_dense=1"], "recipe=original quantizes nothing"),
    (["recipe=w4a16_gptq", "kept_dense=1", "name=../escape"], "is not a recipe name"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, workdir, tiny_model, store, args, said):
    proc = propose(tmp_path, tiny_model, store, *args, cwd=workdir)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, tail(proc)
    assert len(errors) == 1 and said in errors[0], tail(proc)
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "recipes").exists()


def test_auto_without_a_sensitivity_file_names_the_command(tmp_path, workdir, tiny_model):
    proc = propose(tmp_path, tiny_model, tmp_path / "empty", "recipe=w4a16_gptq", "max_kl=0.1", cwd=workdir)
    assert proc.returncode == 2, tail(proc)
    assert f"python -m quantize.sensitivity recipe=w4a16_gptq model={tiny_model}" in proc.stderr
    assert not (tmp_path / "recipes").exists()


def stored_tensors(artifact) -> dict[str, str]:
    """Tensor name -> dtype of a saved checkpoint."""
    out = {}
    for path in weight_files(artifact):
        header, _ = read_header(path)
        out |= {name: t["dtype"] for name, t in header.items() if name != "__metadata__"}
    return out


def test_proposed_recipe_quantizes_with_its_kept_modules_dense(tmp_path, workdir, tiny_model, store,
                                                              recipes_dir_lock):
    name = f"zz_test_proposed_{uuid.uuid4().hex[:8]}"
    arts = tmp_path / "artifacts"
    try:
        proc = run_cli("quantize.propose", "recipe=w4a16_gptq", f"model={tiny_model}", f"results_dir={store}",
                       f"artifacts_dir={arts}", "kept_dense=2", f"name={name}", cwd=workdir)
        assert proc.returncode == 0, tail(proc)
        assert f"python -m quantize recipe={name} model={tiny_model}" in proc.stdout
        built = run_quantize("-m", f"recipe=w4a16_gptq,{name}", f"model={tiny_model}", *SMALL_CALIB,
                             f"artifacts_dir={arts}", cwd=workdir)
        assert built.returncode == 0, tail(built)
        estimate_line = next(line for line in (RECIPES_DIR / f"{name}.yaml").read_text().splitlines()
                             if line.startswith("# Estimated size:"))
    finally:
        (RECIPES_DIR / f"{name}.yaml").unlink(missing_ok=True)

    mixed, uniform = arts / TINY_NAME / name, arts / TINY_NAME / "w4a16_gptq"
    config = json.loads((mixed / "config.json").read_text())["quantization_config"]
    kept = {TOP, SECOND, *SIBLINGS}
    assert kept <= set(config["ignore"])
    tensors = stored_tensors(mixed)
    for module in linear_weights(tiny_model):
        if module in kept:
            assert tensors.get(f"{module}.weight") == "BF16" and f"{module}.weight_packed" not in tensors
        else:
            assert f"{module}.weight_packed" in tensors and f"{module}.weight" not in tensors

    # The size model against the bytes the two artifacts take on disk.
    measured = {a: json.loads((a / "manifest.json").read_text())["bytes_on_disk"]["total"] for a in (mixed, uniform)}
    estimated_mb = float(estimate_line.split()[3])
    assert estimated_mb == pytest.approx(measured[mixed] / 1e6, rel=0.02)
    # With the uniform artifact there, its measured size is the base.
    again = run_cli("quantize.propose", "recipe=w4a16_gptq", f"model={tiny_model}", f"results_dir={store}",
                    f"artifacts_dir={arts}", f"recipes_dir={tmp_path / 'recipes'}", "kept_dense=2", cwd=workdir)
    assert again.returncode == 0, tail(again)
    assert f"w4a16_gptq: {measured[uniform] / 1e6:.2f} MB, measured" in again.stdout
