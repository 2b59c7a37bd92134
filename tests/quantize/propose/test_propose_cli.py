"""`python -m quantize.propose` as a user runs it: bad input is one line and
exit 2 with nothing written; a proposed recipe goes through `python -m
quantize` with its kept modules dense in the saved checkpoint."""
import json
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from quantize.common.checkpoint import read_header, weight_files
from tests.conftest import (RECIPES_DIR, SMALL_CALIB, TINY_NAME, quantize_env, run_cli, run_quantize, serve_verdict,
                            shared_lock, tail)
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
    (["recipe=w4a16_gptq", "kept_dense=1", "name=true"], "name='true' is not a recipe name"),   # wrote True.yaml
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


@dataclass
class Built:
    """A proposal on the tiny model (kept_dense=2: TOP, SECOND and SECOND's
    fused siblings), quantized with the uniform base recipe beside it."""
    store: Path
    arts: Path
    estimate_line: str

    @property
    def mixed(self) -> Path:
        return self.arts / TINY_NAME / PROPOSED

    @property
    def uniform(self) -> Path:
        return self.arts / TINY_NAME / "w4a16_gptq"


PROPOSED = f"zz_test_proposed_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model, shared_dir) -> Built:
    """`python -m quantize.propose` into recipes/, then `python -m quantize` of it by name."""
    root = tmp_path_factory.mktemp("proposed")
    store, arts, cwd = root / "results", root / "artifacts", root / "cwd"
    cwd.mkdir()
    write_sensitivity(store, tiny_model, cells_with_kl(tiny_model, planted_kl))
    with shared_lock(shared_dir, "recipes-dir"):  # tests in other workers list recipes/
        try:
            proc = run_cli("quantize.propose", "recipe=w4a16_gptq", f"model={tiny_model}", f"results_dir={store}",
                           f"artifacts_dir={arts}", "kept_dense=2", f"name={PROPOSED}", cwd=cwd)
            assert proc.returncode == 0, tail(proc)
            assert f"python -m quantize recipe={PROPOSED} model={tiny_model}" in proc.stdout
            quantized = run_quantize("-m", f"recipe=w4a16_gptq,{PROPOSED}", f"model={tiny_model}", *SMALL_CALIB,
                                     f"artifacts_dir={arts}", cwd=cwd)
            assert quantized.returncode == 0, tail(quantized)
            estimate_line = next(line for line in (RECIPES_DIR / f"{PROPOSED}.yaml").read_text().splitlines()
                                 if line.startswith("# Estimated size:"))
        finally:
            (RECIPES_DIR / f"{PROPOSED}.yaml").unlink(missing_ok=True)
    return Built(store, arts, estimate_line)


def test_proposed_recipe_quantizes_with_its_kept_modules_dense(built, tiny_model, workdir, tmp_path):
    config = json.loads((built.mixed / "config.json").read_text())["quantization_config"]
    kept = {TOP, SECOND, *SIBLINGS}
    assert kept <= set(config["ignore"])
    tensors = stored_tensors(built.mixed)
    for module in linear_weights(tiny_model):
        if module in kept:
            assert tensors.get(f"{module}.weight") == "BF16" and f"{module}.weight_packed" not in tensors
        else:
            assert f"{module}.weight_packed" in tensors and f"{module}.weight" not in tensors

    # The size model against the bytes the two artifacts take on disk.
    measured = {a: json.loads((a / "manifest.json").read_text())["bytes_on_disk"]["total"]
                for a in (built.mixed, built.uniform)}
    estimated_mb = float(built.estimate_line.split()[3])
    assert estimated_mb == pytest.approx(measured[built.mixed] / 1e6, rel=0.02)
    # With the uniform artifact there, its measured size is the base.
    again = run_cli("quantize.propose", "recipe=w4a16_gptq", f"model={tiny_model}", f"results_dir={built.store}",
                    f"artifacts_dir={built.arts}", f"recipes_dir={tmp_path / 'recipes'}", "kept_dense=2", cwd=workdir)
    assert again.returncode == 0, tail(again)
    assert f"w4a16_gptq: {measured[built.uniform] / 1e6:.2f} MB, measured" in again.stdout


SERVE = """import sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], enforce_eager=True, max_model_len=256, dtype="bfloat16")
    out = llm.generate(["It is a truth universally acknowledged"], SamplingParams(max_tokens=4, temperature=0))
    print("TOKENS", len(out[0].outputs[0].token_ids))
"""


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.needs_vllm
def test_proposed_artifact_serves_in_vllm(built, tmp_path):
    """vLLM loads q/k/v (and gate/up) as one fused matrix with one scheme: a
    kept q_proj with its siblings quantized would not load."""
    if not serve_verdict(built.mixed)[0]:
        pytest.skip("vLLM here has no kernel for the proposal's W4A16 layers (the capability layer says why)")
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    with tempfile.TemporaryDirectory(prefix="qb-prop-") as sockets:   # socket paths must stay short
        env = quantize_env({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                            "TMPDIR": sockets})
        proc = subprocess.run([sys.executable, str(script), str(built.mixed)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0 and "TOKENS 4" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
