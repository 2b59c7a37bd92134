"""bf16 and fp16 are native apart: an AMD EPYC (Zen 4/5) multiplies bf16 in
hardware (AVX512-BF16) but not fp16 (no AVX512-FP16), so `dtype: auto`
computes an fp16 checkpoint in float32 there and keeps a bf16 one. Machines
are injected fact sets, or this host's torch queries faked as tests/hosts do."""
import pytest
import torch
from hydra import compose, initialize_config_dir

from evaluate import pipeline
from evaluate.config import EvaluateConfig
from evaluate.engines.hf import HfEngine
from evaluate.engines.vllm import VllmEngine
from evaluate.formats import CheckpointFormat
from evaluate.report.markdown import capability_text
import quantize.common.machine
from quantize.common import dtypes, machine
from quantize.common.config import expand_path_shorthands, register
from quantize.common.machine import Machine
from quantize.common.paths import CONF_DIR
from quantize.common.tiny_model import build_tiny_llama

AVX512 = frozenset({"avx2", "avx512f", "avx512_vnni"})
EPYC = Machine("x86_64", AVX512 | {"avx512_bf16"})                        # Zen 4/5: no AVX512-FP16
SAPPHIRE = Machine("x86_64", AVX512 | {"avx512_bf16", "avx512_fp16"})
AMX = Machine("x86_64", AVX512 | {"avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"})  # AMX: fp16 too
AVX2 = Machine("x86_64", frozenset({"avx2"}))
BOTH = {"bfloat16", "float16"}


@pytest.mark.parametrize("host, native", [(EPYC, {"bfloat16"}), (SAPPHIRE, BOTH), (AMX, BOTH), (AVX2, set()),
                                          (Machine("aarch64", frozenset({"asimd", "bf16"})), BOTH),
                                          (Machine("riscv64"), BOTH)])
def test_native_bf16_and_fp16_are_told_apart(host, native):
    assert host.cpu_native_half == native


@pytest.mark.parametrize("onednn_fp16, native", [(False, {"bfloat16"}), (True, BOTH)])
def test_this_host_asks_torch_and_onednn_for_fp16(monkeypatch, onednn_fp16, native):
    for query, answer in (("_is_avx2_supported", True), ("_is_avx512_supported", True),
                          ("_is_vnni_supported", True), ("_is_avx512_bf16_supported", True),
                          ("_is_amx_tile_supported", False), ("_is_amx_fp16_supported", False)):
        monkeypatch.setattr(torch.cpu, query, lambda answer=answer: answer)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: onednn_fp16)
    assert Machine("x86_64", machine._torch_x86_isa()).cpu_native_half == native
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)  # tests/hosts/avx512_no_bf16_host
    assert Machine("x86_64", machine._torch_x86_isa()).cpu_native_half == set()


@pytest.mark.parametrize("host, fp16_dtype, bf16_dtype", [(EPYC, "float32", "bfloat16"),
                                                         (SAPPHIRE, "float16", "bfloat16"),
                                                         (AVX2, "float32", "float32")])
def test_auto_computes_fp16_in_float32_where_only_bf16_is_native(monkeypatch, host, fp16_dtype, bf16_dtype):
    for checkpoint, expect in (("float16", fp16_dtype), ("bfloat16", bf16_dtype)):
        fmt = CheckpointFormat(dtype=checkpoint)
        assert HfEngine.choose_dtype(fmt, host, {"device": "cpu"}) == expect
        assert VllmEngine.choose_dtype(fmt, host, {}) == expect
    monkeypatch.setattr(dtypes, "detect", lambda: host)  # calibration and the accuracy reference
    assert dtypes.compute_dtype(torch.float16, "auto", "cpu") == getattr(torch, fp16_dtype)
    assert dtypes.compute_dtype(torch.float16, "float16", "cpu") == torch.float16  # asked for: obeyed


def test_the_machine_line_and_the_report_say_which_half_is_native():
    assert "; bf16 native, fp16 emulated (float32 is faster)" in EPYC.describe()
    assert "; bf16/fp16 native" in AMX.describe() and "; bf16/fp16 emulated" in AVX2.describe()
    assert EPYC.facts()["cpu_native_half"] is True and EPYC.facts()["cpu_native_fp16"] is False
    assert capability_text(EPYC.facts()) == "bf16 native, fp16 emulated (float32 is faster)"
    assert capability_text({"cpu_native_half": True}) == "bf16 native"  # a row written before fp16 was told apart


def planned(model, results_dir):
    """The row fields `python -m evaluate engine=hf model=<model>` would record, planned before the engine starts."""
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=expand_path_shorthands([
            f"model={model}", "engine=hf", "engine.args.device=cpu", "accuracy=none",
            f"results_dir={results_dir}"]))
    job, _, _ = pipeline._plan(EvaluateConfig.from_cfg(cfg))
    return job.base


def test_rows_record_the_dtype_that_runs_and_the_new_fact_leaves_setup_ids_alone(tiny_model, tokenizer_dir,
                                                                                  tmp_path, monkeypatch):
    fp16_model = build_tiny_llama(tmp_path / "fp16", tokenizer_dir, dtype="float16")
    seen = {}
    monkeypatch.setattr(quantize.common.machine, "detect", lambda *a, **k: seen["host"])
    for host in (EPYC, SAPPHIRE):
        seen["host"] = host
        seen[host] = planned(tiny_model, tmp_path / "results"), planned(fp16_model, tmp_path / "results")
    (bf16_epyc, fp16_epyc), (bf16_sapphire, fp16_sapphire) = seen[EPYC], seen[SAPPHIRE]
    assert fp16_epyc.engine_args["dtype"] == "float32" and fp16_sapphire.engine_args["dtype"] == "float16"
    # machine facts are recorded beside the setup, not hashed into it: a bf16 model's rows keep their setup id
    assert bf16_epyc.engine_args["dtype"] == bf16_sapphire.engine_args["dtype"] == "bfloat16"
    assert bf16_epyc.machine["cpu_native_fp16"] is False and bf16_sapphire.machine["cpu_native_fp16"] is True
    assert bf16_epyc.setup_id == bf16_sapphire.setup_id and bf16_epyc.run_key() == bf16_sapphire.run_key()
