"""A run's host load: CPU time of processes outside this process tree
counts as other work; this process's children (an engine core, a server)
count as its own."""
import subprocess
import sys
import time

import psutil

from evaluate.host_load import HostLoad, HostLoadMeter

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
TICK_S = 0.05  # /proc/stat and a process's times count 10 ms ticks: a few of them either way


def burner(seconds: float, outside: bool) -> psutil.Process:
    """A process that burns `seconds` of CPU: our child, or (outside=True) one
    whose parent exits at once, so it is nobody's here (re-parented to init)."""
    code = BURN.format(s=seconds)
    if outside:
        launcher = subprocess.run([sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen("
                                   f"[sys.executable, '-c', {code!r}], start_new_session=True, "
                                   "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
                                  capture_output=True, text=True, check=True)
        proc = psutil.Process(int(launcher.stdout))
    else:
        proc = psutil.Process(subprocess.Popen([sys.executable, "-c", code]).pid)
    deadline = time.monotonic() + 60
    while proc.cpu_times().user < 0.2 and time.monotonic() < deadline:  # past Python's start-up
        time.sleep(0.05)
    return proc


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def metered_second(proc: psutil.Process) -> tuple[HostLoad, float]:
    """The meter's record of one second while `proc` burns CPU, and the CPU
    seconds `proc` burned in it; `proc` is killed and waited for after."""
    try:
        before = cpu_s(proc)
        with HostLoadMeter() as meter:
            time.sleep(1.0)
        burned = cpu_s(proc) - before
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return meter.result, burned


def test_a_process_outside_the_tree_is_other_work():
    other = burner(30, outside=True)
    assert other.pid not in {c.pid for c in psutil.Process().children(recursive=True)}
    load, burned = metered_second(other)
    assert burned > 0.1  # it ran, however busy the host
    assert load.other_cpu_s >= burned - TICK_S


def test_a_child_of_this_process_is_its_own_work():
    host = psutil.cpu_times()
    load, burned = metered_second(burner(30, outside=False))
    now = psutil.cpu_times()
    busy = sum(getattr(now, f) - getattr(host, f) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
    assert burned > 0.1
    assert load.other_cpu_s <= busy - burned + TICK_S


def test_the_record_round_trips_and_gives_the_share_of_the_host():
    load = HostLoad(load_avg_1m_start=1.5, load_avg_1m_end=2.0, other_cpu_s=1.0, wall_s=5.0, cores=2)
    assert HostLoad.from_dict(load.as_dict()) == load
    assert load.other_cpu_pct == 10.0  # 1 CPU second of 2 cores x 5 s
    assert HostLoad.from_dict(None) is None and HostLoad.from_dict({"wall_s": 1}) is None
