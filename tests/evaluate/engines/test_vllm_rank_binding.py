"""evaluate.engines.vllm.rank_binding: tensor parallelism on a CPU host with
fewer NUMA nodes than ranks gets vLLM's even split of the CPUs instead of a
start-up refusal; everything else is left to vLLM."""
from dataclasses import replace

import pytest

from evaluate.engines import vllm as vllm_engine
import quantize.common.machine
from quantize.common.machine import Machine

ONE_NODE = Machine("x86_64", frozenset({"avx2"}), numa_nodes=1)


@pytest.fixture
def host(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_SIM_MULTI_NUMA", raising=False)

    def use(machine):
        monkeypatch.setattr(quantize.common.machine, "detect", lambda vllm=False: machine)
    use(ONE_NODE)
    return use


AUTO = {"VLLM_CPU_OMP_THREADS_BIND": "auto"}


def test_more_ranks_than_nodes_splits_the_cpus(host):
    assert vllm_engine.rank_binding(AUTO, {"tensor_parallel_size": 2}) == {"VLLM_CPU_SIM_MULTI_NUMA": 1}
    assert vllm_engine.rank_binding({}, {"tensor_parallel_size": 1, "pipeline_parallel_size": 2}) == \
        {"VLLM_CPU_SIM_MULTI_NUMA": 1}
    assert vllm_engine.VllmEngine.prepare_env(AUTO, {"tensor_parallel_size": 2})["VLLM_CPU_SIM_MULTI_NUMA"] == 1


@pytest.mark.parametrize("env, args", [
    (AUTO, {"tensor_parallel_size": 1}),                                    # one rank: vLLM's own binding
    ({"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, {"tensor_parallel_size": 2}),    # the user bound the ranks
    (AUTO | {"VLLM_CPU_SIM_MULTI_NUMA": 0}, {"tensor_parallel_size": 2}),   # the user decided
])
def test_left_alone(host, env, args):
    assert vllm_engine.rank_binding(env, args) == {}


def test_enough_nodes_or_cuda_left_alone(host):
    host(replace(ONE_NODE, numa_nodes=2))
    assert vllm_engine.rank_binding(AUTO, {"tensor_parallel_size": 2}) == {}
    host(replace(ONE_NODE, cuda=((8, 0),)))
    assert vllm_engine.rank_binding(AUTO, {"tensor_parallel_size": 2}) == {}


def test_a_variable_set_outside_wins(host, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_SIM_MULTI_NUMA", "0")
    assert vllm_engine.rank_binding(AUTO, {"tensor_parallel_size": 2}) == {}


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_named_before_start():
    problem = vllm_engine.VllmEngine.config_problem({"num_attention_heads": 9}, {"tensor_parallel_size": 2})
    assert problem == ("engine.args.tensor_parallel_size=2 does not divide the model's 9 attention heads; "
                       "use one of 1, 3, 9, or auto")
    assert vllm_engine.VllmEngine.config_problem({"num_attention_heads": 4}, {"tensor_parallel_size": 2}) is None
    assert vllm_engine.VllmEngine.config_problem({}, {"tensor_parallel_size": 2}) is None
