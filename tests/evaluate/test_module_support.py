"""Layers vLLM has no compressed-tensors scheme for: answered from the
checkpoint's quantization_config through vLLM's own scheme matching before
any engine starts, and, where a start fails anyway, vLLM's root cause in the
failed row (real vLLM for both; the slow tests build and start real models)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SMALL_CALIB, quantize_env, run_quantize
from evaluate import results
from evaluate.capabilities import KNOWN_MACHINES
from evaluate.engines.vllm import VllmEngine, failure_cause
from evaluate.formats import W4A16, classify

pytest.importorskip("vllm")
from evaluate.engines.vllm_schemes import unserved_groups  # noqa: E402

INT4_GROUP = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64,
              "dynamic": False}
INT8_CHANNEL = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
INT8_TOKEN = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}


def ct_config(storage: str, weights: dict, inputs: dict | None = None, targets=("Linear",)) -> dict:
    """A compressed-tensors quantization_config as llm-compressor saves it, one group."""
    return {"quant_method": "compressed-tensors", "format": storage, "ignore": ["lm_head"],
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": list(targets), "weights": weights,
                                          "input_activations": inputs, "format": storage}}}


def model_config(quantization_config: dict) -> dict:
    return {"architectures": ["FalconForCausalLM"], "dtype": "bfloat16", "quantization_config": quantization_config}


# ---- the answer before the start ------------------------------------------------

FP8_CHANNEL = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}
FP8_TOKEN = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}


def test_a_scheme_that_reads_the_engines_config_is_not_asked():
    """vLLM's FP8 scheme reads the running engine's config as it is built: known only inside a start,
    so no answer up front (the capability layer's FP8 rules and the start decide), never an error."""
    assert unserved_groups(ct_config("float-quantized", FP8_CHANNEL, FP8_TOKEN)) is None

def test_int4_weights_stored_dense_have_no_vllm_scheme():
    """Falcon's W4A16 as llm-compressor saved it: fake-quantized, format dense."""
    (unserved,) = unserved_groups(ct_config("dense", INT4_GROUP))
    assert unserved.group == "group_0" and unserved.targets == ("Linear",)
    assert unserved.storage_format == "dense"
    assert unserved.reason.startswith("NotImplementedError: No compressed-tensors compatible scheme")
    assert "weight_quant=" not in unserved.reason  # the QuantizationArgs repr is cut


@pytest.mark.parametrize("storage, weights, inputs", [
    ("pack-quantized", INT4_GROUP, None),         # w4a16_gptq as the other families save it
    ("int-quantized", INT8_CHANNEL, INT8_TOKEN),  # w8a8
])
def test_the_formats_vllm_serves_pass(storage, weights, inputs):
    assert unserved_groups(ct_config(storage, weights, inputs)) == []


def test_a_per_group_format_overrides_the_global_one():
    """vLLM reads a group's own `format` first (get_scheme_dict), so must the check."""
    config = ct_config("pack-quantized", INT4_GROUP)
    config["config_groups"]["group_0"]["format"] = "dense"
    assert [u.group for u in unserved_groups(config)] == ["group_0"]
    config["config_groups"]["group_0"]["format"] = None
    assert unserved_groups(config) == []


def test_a_vllm_whose_scheme_matching_has_another_shape_is_not_asked(monkeypatch):
    """e.g. an older vLLM's _get_scheme_from_parts(weight_quant, input_quant): no answer, never a traceback."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig)
    monkeypatch.setattr(CompressedTensorsConfig, "_get_scheme_from_parts", lambda self, weight_quant, input_quant: 0)
    assert unserved_groups(ct_config("dense", INT4_GROUP)) is None
    fmt = classify(model_config(ct_config("dense", INT4_GROUP)))
    assert VllmEngine.supports(fmt, KNOWN_MACHINES["avx512_bf16"], {"dtype": "bfloat16"})


def test_a_recipes_plan_is_not_judged_before_it_is_saved():
    """llm-compressor decides the storage format when it saves (until then: "fakequant")."""
    planned = ct_config("fakequant", INT8_CHANNEL, INT8_TOKEN) | {"quantization_status": "initialized"}
    assert unserved_groups(planned) == []


def test_the_answer_names_the_layers_and_what_to_do():
    fmt = classify(model_config(ct_config("dense", INT4_GROUP)))
    assert fmt.scheme == W4A16
    verdict = VllmEngine.supports(fmt, KNOWN_MACHINES["avx512_bf16"], {"dtype": "bfloat16"})
    assert not verdict
    assert "group_0 (targets Linear; weights stored as 'dense')" in verdict.reason
    assert "engine=hf serves it" in verdict.reason and "ignore:" in verdict.reason
    assert "\n" not in verdict.reason


def test_the_same_question_on_a_cuda_host():
    """No platform branch in vLLM's scheme choice: the answer is the CPU's."""
    fmt = classify(model_config(ct_config("dense", INT4_GROUP)))
    assert "group_0" in VllmEngine.supports(fmt, KNOWN_MACHINES["cuda_sm90"], {"dtype": "bfloat16"}).reason
    packed = classify(model_config(ct_config("pack-quantized", INT4_GROUP)))
    assert VllmEngine.supports(packed, KNOWN_MACHINES["cuda_sm90"], {"dtype": "bfloat16"})


def test_formats_judged_alone_keep_their_identity():
    """The checkpoint's config rides along without changing what a format is (the table's keys)."""
    with_config = classify(model_config(ct_config("pack-quantized", INT4_GROUP)))
    assert with_config.quantization_config["format"] == "pack-quantized"
    assert with_config == classify(model_config(ct_config("dense", INT4_GROUP)))
    assert hash(with_config)


# ---- the root cause of a failed start ------------------------------------------------

WORKER_FAILED = """\
1790000000.100\t301\tStarting to load model /m...
1790000000.200\t301\tWorkerProc failed to start.
Traceback (most recent call last):
  File "vllm/v1/executor/multiproc_executor.py", line 920, in worker_main
    worker = WorkerProc(*args, **kwargs)
NotImplementedError: No compressed-tensors compatible scheme was found for layer_name='h.0.query_key_value'
1790000000.900\t300\tEngineCore failed to start.
Traceback (most recent call last):
  File "vllm/v1/executor/multiproc_executor.py", line 815, in wait_for_ready
    raise e from None
Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace.
"""


def test_the_first_failure_is_the_root_cause():
    assert failure_cause(WORKER_FAILED) == ("NotImplementedError: No compressed-tensors compatible scheme "
                                            "was found for layer_name='h.0.query_key_value'")


def test_a_chained_cause_comes_first_and_dotted_names_count():
    text = ("Traceback (most recent call last):\ntorch.OutOfMemoryError: CPU out of memory\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert failure_cause(text) == "torch.OutOfMemoryError: CPU out of memory"


def test_no_exception_in_the_log_is_no_cause():
    assert failure_cause("1790000000.1\t1\tEngineCore failed to start.\nTraceback: none\n") is None
    assert failure_cause("") is None


# ---- end to end -------------------------------------------------------------------------

def evaluate_cmd(model: Path, results_dir: Path) -> list[str]:
    return [sys.executable, "-m", "evaluate", f"model={model}", "engine=vllm", "runs=1", "accuracy=none",
            "scenario=interactive", "scenario.input_len=16", "scenario.output_len=4",
            "engine.args.enforce_eager=true", f"results_dir={results_dir}"]


@pytest.fixture(scope="module")
def falcon_w4a16(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny random Falcon quantized with the shipped w4a16_gptq recipe."""
    from quantize.common.tiny_model import build_tiny
    root = tmp_path_factory.mktemp("falcon")
    model = build_tiny("falcon", root / "falcon", tokenizer_dir)
    proc = run_quantize(f"model={model}", "recipe=w4a16_gptq", *SMALL_CALIB, f"artifacts_dir={root / 'artifacts'}",
                        cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "artifacts" / "falcon" / "w4a16_gptq"


@pytest.mark.extended
@pytest.mark.slow
def test_falcon_w4a16_is_saved_packed_with_its_head_left_out(falcon_w4a16):
    """Falcon's layers are FalconLinear, a subclass compressed-tensors' compressors do not
    take (they match nn.Linear exactly): saved as such, the weights were fake-quantized
    bf16 in format `dense`, full size, with no vLLM scheme. quantize saves them as the
    Linears they are, and lists the unquantized lm_head (a plain Linear) in `ignore`."""
    stored = json.loads((falcon_w4a16 / "config.json").read_text())["quantization_config"]
    assert stored["format"] == "pack-quantized" and stored["ignore"] == ["lm_head"]
    assert unserved_groups(stored) == []  # vLLM's scheme matching has a scheme for every group
    # transformers' from_pretrained cannot take it (Falcon's _init_weights reaches for the packed-away
    # weight): the checkpoint is reloaded by quantize's own loader, as the hf engine does
    from quantize import verify
    from quantize.common import moe
    assert moe.needs_own_loader(falcon_w4a16)
    checks = verify.check(falcon_w4a16, "reload", prunes=False)
    assert checks["reloads_in_transformers"] and checks["logits_finite"]


@pytest.mark.extended
@pytest.mark.slow
def test_a_failed_start_records_vllms_root_cause(tiny_model, tmp_path):
    """One real start that fails in vLLM's worker (a config.json whose MLP
    size its weights do not have): the row says why, not only that it failed."""
    import shutil
    model = tmp_path / "mismatched"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    config["intermediate_size"] += 64
    (model / "config.json").write_text(json.dumps(config))
    proc = subprocess.run(evaluate_cmd(model, tmp_path / "results"), cwd=tmp_path, env=quantize_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode != 0
    (row,) = [r for r in results.read(tmp_path / "results") if r.kind == "speed"]
    assert row.status == "failed"
    assert row.reason.startswith("engine start-up failed: vLLM failed to start: ")
    cause = row.reason.removeprefix("engine start-up failed: vLLM failed to start: ").rstrip("…")
    assert "Engine core initialization failed" not in cause
    tracebacks_end = [line for line in (proc.stderr + proc.stdout).splitlines() if cause in line]
    assert tracebacks_end, f"{cause!r} is not a line vLLM logged"
