"""Peak memory counts the engine's child processes, not just this one."""
import subprocess
import sys
import time

from evaluate.memory import Baseline, PeakMemory

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
