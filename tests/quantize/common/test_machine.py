"""quantize.common.machine: the facts a capability decision starts from."""
import subprocess
import sys

import pytest

from quantize.common import machine


@pytest.mark.parametrize("text, cpus", [("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", [])])
def test_linux_cpu_lists_parse(text, cpus):
    assert machine.parse_cpu_list(text) == cpus


def test_numa_nodes_count_only_nodes_with_allowed_cpus(tmp_path, monkeypatch):
    for node, cpus in (("node0", "0-1"), ("node1", "2-3"), ("node2", "")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus + "\n")
    real_path = machine.Path
    monkeypatch.setattr(machine, "Path", lambda p: tmp_path if p == "/sys/devices/system/node" else real_path(p))
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert machine.numa_nodes() == 2
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {1})
    assert machine.numa_nodes() == 1


def test_no_numa_information_means_one_node(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "Path", lambda p: tmp_path / "missing")
    assert machine.numa_nodes() == 1
    assert machine.detect().numa_nodes >= 1 and "numa_nodes" in machine.detect().facts()


def test_the_machine_holds_isa_cuda_and_numa_facts_and_each_engine_adds_its_own():
    bare = machine.Machine("x86_64", frozenset({"avx2"}), cuda=((9, 0),), gpu_names=("H200",))
    assert set(bare.facts()) == {"arch", "isa", "cuda", "cpu_native_half", "cpu_native_fp16", "numa_nodes"}
    assert bare.describe() == "CUDA: H200 (sm90)"

    class Probed:
        def facts(self):
            return {"dummy_kernels": "k1"}

        def describe(self):
            return "dummy kernels k1"
    probed = bare.with_engine("dummy", Probed())
    assert probed.engine("dummy").facts() == {"dummy_kernels": "k1"} and bare.engine("dummy") is None
    assert probed.facts()["dummy_kernels"] == "k1" and probed.describe() == "CUDA: H200 (sm90); dummy kernels k1"


def test_detecting_the_machine_imports_no_engine():
    loaded = subprocess.run([sys.executable, "-c", "import sys; from quantize.common import machine; "
                             "machine.detect(); print(sorted(m for m in sys.modules "
                             "if m.split('.')[0] in ('vllm', 'evaluate')))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
