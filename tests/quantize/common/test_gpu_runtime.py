"""What a GPU row records of the CUDA runtime, the NVIDIA driver and the GPUs'
memory (quantize.common.provenance.gpu_runtime), on a faked CUDA torch and
NVML: facts beside the row's setup, never part of its setup or machine id."""
import sys

import torch

from evaluate import results
from quantize.common import provenance
from tests import fake_nvml

GIB = 2**30


def on_a_cuda_host(monkeypatch, runtime="12.8"):
    monkeypatch.setattr(torch.version, "cuda", runtime)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)   # no name to ask a fake GPU for
    fake_nvml.install(monkeypatch, [(80 * GIB, 70 * GIB), (141 * GIB, 2 * GIB)], driver="570.124.06")


def test_a_gpu_row_records_the_cuda_runtime_the_driver_and_each_visible_gpus_memory(monkeypatch):
    on_a_cuda_host(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert provenance.gpu_runtime() == {"cuda_runtime": "12.8", "nvidia_driver": "570.124.06",
                                        "gpu_memory_bytes": [141 * GIB]}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert provenance.gpu_runtime()["gpu_memory_bytes"] == [80 * GIB, 141 * GIB]


def test_without_nvml_the_runtime_alone_and_without_a_gpu_nothing(monkeypatch):
    on_a_cuda_host(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert provenance.gpu_runtime() == {"cuda_runtime": "12.8"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert provenance.gpu_runtime() == {}


def test_the_gpu_facts_leave_setup_and_machine_ids_alone(monkeypatch):
    """Rows measured before the facts were recorded keep being reused."""
    before = provenance.hardware()
    on_a_cuda_host(monkeypatch)
    after = provenance.hardware()
    assert after == before and not set(provenance.gpu_runtime()) & set(after)
    versions = provenance.versions()
    assert results.setup_id({"name": "vllm"}, versions, after) == results.setup_id({"name": "vllm"}, versions, before)
    assert results.machine_id(after) == results.machine_id(before)


def planned(model, results_dir):
    """The row fields `python -m evaluate engine=hf model=<model>` would record, planned before the engine starts."""
    from hydra import compose, initialize_config_dir

    from evaluate import pipeline
    from evaluate.config import EvaluateConfig
    from quantize.common.config import expand_path_shorthands, register
    from quantize.common.paths import CONF_DIR
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=expand_path_shorthands([
            f"model={model}", "engine=hf", "engine.args.device=cpu", "accuracy=none", f"results_dir={results_dir}"]))
    job, _, _ = pipeline._plan(EvaluateConfig.from_cfg(cfg))
    return job.base


def test_a_row_keeps_the_gpu_facts_beside_the_engines_and_its_setup_id_stays(tiny_model, tmp_path, monkeypatch):
    cpu = planned(tiny_model, tmp_path)
    facts = {"cuda_runtime": "12.8", "nvidia_driver": "570.124.06", "gpu_memory_bytes": [141 * GIB]}
    monkeypatch.setattr(provenance, "gpu_runtime", lambda: facts)
    gpu = planned(tiny_model, tmp_path)
    assert gpu.machine == cpu.machine | facts
    assert (gpu.setup_id, gpu.comparison_id, results.machine_id(gpu.hardware)) == \
        (cpu.setup_id, cpu.comparison_id, results.machine_id(cpu.hardware))
