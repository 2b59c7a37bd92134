"""Peak memory counts the engine's child processes, not just this one."""
import subprocess
import sys
import time

import pytest

from evaluate import memory
from evaluate.memory import Baseline, PeakMemory
from tests import fake_nvml

CHILD_MB = 400
# The child allocates and touches CHILD_MB, says so, then waits to be killed.
CHILD = f"import sys, time; b = bytearray({CHILD_MB} << 20); print('ready', flush=True); time.sleep(60)"


def test_peak_includes_a_child_process():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with PeakMemory(interval_s=0.01) as with_child:
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    with PeakMemory(interval_s=0.01) as alone:
        time.sleep(0.1)
    assert with_child.peak_rss_bytes - alone.peak_rss_bytes > 0.9 * (CHILD_MB << 20)
    assert alone.as_metrics()["peak_memory_bytes"] == alone.peak_rss_bytes


def test_a_child_that_exits_mid_run_is_not_an_error():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    with PeakMemory(interval_s=0.01) as mem:
        child.wait()
        time.sleep(0.05)
    assert mem.peak_rss_bytes > 0


def test_an_engine_counts_what_grew_since_its_baseline_not_what_the_process_held():
    """What the process held before (an earlier job's accuracy reference) is
    left out; what grew since, and a process started since, are counted."""
    held = bytearray(300 << 20)  # touched: resident before the engine starts
    baseline = Baseline.now()
    grown = bytearray(100 << 20)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with PeakMemory(interval_s=0.01, baseline=baseline) as engine:
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    expected = (100 << 20) + (CHILD_MB << 20)
    assert 0.9 * expected < engine.peak_rss_bytes < expected + (80 << 20)  # + the child's Python
    del held, grown


def test_a_process_started_before_the_engine_is_not_the_engines():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        baseline = Baseline.now()
        with PeakMemory(interval_s=0.01, baseline=baseline) as engine:
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    assert engine.peak_rss_bytes < (20 << 20)


def test_a_remote_engine_has_no_peak_memory():
    with PeakMemory(remote=True) as mem:
        pass
    assert mem.as_metrics() == {"peak_memory_bytes": None}


# NVML sees every GPU of the node; CUDA_VISIBLE_DEVICES says which are this job's.

GIB = 2**30
NODE = [(80 * GIB, 70 * GIB), (80 * GIB, 5 * GIB), (40 * GIB, 30 * GIB), (80 * GIB, 1 * GIB)]


@pytest.mark.parametrize("visible, used, rank", [
    (None, 106, 40), ("", 106, 40), ("1", 5, 80), ("3,1", 6, 80), ("1,2", 35, 40),
    ("GPU-00000001-aaaa-bbbb-cccc-000000000001", 5, 80), ("GPU-00000003", 1, 80),   # a whole UUID, a prefix
    ("MIG-00000002-aaaa-bbbb-cccc-000000000002", 15, 20),                           # a MIG slice: its own memory
    ("1,7,0", 5, 80), ("1,GPU-ffff,0", 5, 80)])                                      # ends at an unknown entry
def test_gpu_memory_is_that_of_the_gpus_this_job_may_use(monkeypatch, visible, used, rank):
    """A 1-GPU job on a shared node (Ray num_gpus=1, Slurm without
    ConstrainDevices) recorded every job's memory, and was bounded by the
    node's smallest GPU."""
    fake_nvml.install(monkeypatch, NODE)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert memory._gpu_used_bytes() == used * GIB
    assert memory.rank_memory_bytes(cuda=True) == rank * GIB


def test_without_nvml_there_is_no_gpu_figure(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert memory._gpu_used_bytes() is None and memory.rank_memory_bytes(cuda=True) is None
