"""How busy the host was while a run executed. Every timed run and serving
level records it in its row (`host_load`), so the report can say which runs
shared the machine with other work: an interval captures the noise within
one sweep, not a host that is busier today than yesterday.

- load_avg_1m_start, load_avg_1m_end: the 1-minute load average (tasks
  running or waiting for a core, this run's own included) when the run
  started and ended;
- other_cpu_s: CPU seconds used during the run by everything outside this
  process and its descendants (the harness and the engine): the host's busy
  CPU time from /proc/stat (user, nice, system, irq, softirq, and steal: time
  the hypervisor gave other guests) minus this process tree's CPU time. A
  descendant that ends during the run and is not yet reaped counts as other;
- wall_s, cores: the run's wall time (s) and the logical CPUs /proc/stat
  counts, so `other_cpu_pct` = other_cpu_s / (wall_s x cores) x 100 is the
  share of the host's CPU time other processes took.

Both are read from the kernel's counters (10 ms ticks) at the run's start
and end, so a run costs two reads of /proc and nothing while it runs."""
import os
import time
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

import psutil


@dataclass(frozen=True)
class HostLoad:
    """One run's host load (the module docstring defines each field)."""
    load_avg_1m_start: float
    load_avg_1m_end: float
    other_cpu_s: float
    wall_s: float
    cores: int

    @property
    def other_cpu_pct(self) -> float | None:
        """Other processes' share of the host's CPU time during the run (%)."""
        capacity_s = self.wall_s * self.cores
        return 100 * self.other_cpu_s / capacity_s if capacity_s > 0 else None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict | None) -> "HostLoad | None":
        """A row's `host_load`; None where it has none (rows written before it was recorded)."""
        names = [f.name for f in fields(cls)]
        if not isinstance(values, dict) or any(not isinstance(values.get(n), (int, float)) for n in names):
            return None
        return cls(**{n: values[n] for n in names})


class _Reading(NamedTuple):
    wall_s: float
    load_avg_1m: float
    host_busy_s: float
    own_cpu_s: float


def _read() -> _Reading:
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)
    return _Reading(time.monotonic(), os.getloadavg()[0], busy, _tree_cpu_s())


def _tree_cpu_s() -> float:
    """CPU seconds of this process and its descendants, live and reaped."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:  # ended between listing and reading: its parent counts it once reaped
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class HostLoadMeter:
    """`with HostLoadMeter() as meter: <the run>`, then `meter.result`."""
    result: HostLoad | None = None

    def __enter__(self) -> "HostLoadMeter":
        self._start = _read()
        return self

    def __exit__(self, *exc) -> None:
        end = _read()
        own_s = end.own_cpu_s - self._start.own_cpu_s
        other_s = max(0.0, end.host_busy_s - self._start.host_busy_s - own_s)  # ticks can round below 0
        self.result = HostLoad(round(self._start.load_avg_1m, 2), round(end.load_avg_1m, 2), round(other_s, 3),
                               round(end.wall_s - self._start.wall_s, 3), psutil.cpu_count() or 1)
