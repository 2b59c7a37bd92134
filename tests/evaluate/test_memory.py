"""Peak memory counts the engine's child processes, not just this one."""
import subprocess
import sys
import time

from evaluate.memory import PeakMemory

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
