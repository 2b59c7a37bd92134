#!/usr/bin/env python3
"""The test suite's time budget per tier, checked against what a run took.

    python3 scripts/suite_budget.py plan all             # this host's kind, the budget, past runs
    python3 scripts/suite_budget.py check all [XML]      # after `make test`: time, slowest tests, verdict
    python3 scripts/suite_budget.py record all [XML]     # keep this run's times (tests/suite_timings.json)

Tiers: `fast` (`make test-fast`, no slow tests), `all` (`make test`, CI's)
and `extended` (`make test-extended`, the tests marked extended); each
run leaves pytest's JUnit XML at logs/suite-<tier>.xml. `check` exits 1 when
the run took more than twice its tier's budget, listing the slowest tests:
a suite that slow risks CI's limit on a slower kind of host. `record` keeps
the run's wall time for this host's kind and, for `all`, the time of each
test file, which tests/conftest.py uses to start the longest files first,
and the tests that took SLOW_FROM_S or more, which it marks slow (with
those an earlier record marked that the run still has).
Standard library only: `plan` runs before setup has built the venv."""
import argparse
import json
import os
import platform
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from quantize.common import atomic  # noqa: E402  (standard library only)
from quantize.common.machine import ISA_FLAGS, Machine, cpu_flags  # noqa: E402

# The recorded runs; QUANTBENCH_SUITE_TIMINGS names another file (tests/conftest.py reads the same).
TIMINGS = Path(os.environ.get("QUANTBENCH_SUITE_TIMINGS") or ROOT / "tests" / "suite_timings.json")
BUDGET_S = {"fast": 5 * 60, "all": 30 * 60, "extended": 45 * 60}
FAIL_FACTOR = 2  # check fails past this multiple of the budget
SLOWEST = 15
# A test that took this long in the recorded full run counts as slow (tests/conftest.py marks it), so
# `make test-fast` leaves it out: the fast tier is what runs in seconds, whatever its markers say.
SLOW_FROM_S = 8.0


@dataclass(frozen=True)
class TestTime:
    file: str       # tests/…/test_x.py
    name: str       # test_y[param], after any class: TestZ::test_y
    seconds: float  # setup + call + teardown

    @property
    def nodeid(self) -> str:
        return f"{self.file}::{self.name}"


@dataclass(frozen=True)
class SuiteRun:
    wall_s: float
    tests: int
    failed: int
    times: list[TestTime]

    def slowest(self, n: int = SLOWEST) -> list[TestTime]:
        return sorted(self.times, key=lambda t: -t.seconds)[:n]

    def seconds_per_file(self) -> dict[str, float]:
        out = defaultdict(float)
        for t in self.times:
            out[t.file] += t.seconds
        return {f: round(s, 1) for f, s in sorted(out.items(), key=lambda kv: -kv[1])}


def host_kind(machine: Machine) -> str:
    """The kind of CPU the suite's times depend on most: which instructions
    run bf16 and int8 (names as in the brief's four kinds)."""
    if not machine.x86:
        return machine.arch
    if machine.isa & {"amx_tile", "amx_bf16"}:
        return "x86 AMX"
    if "avx512_bf16" in machine.isa:
        return "x86 AVX-512 + BF16 (no AMX)"
    if "avx512f" in machine.isa:
        return "x86 AVX-512 without BF16"
    return "x86 AVX2" if "avx2" in machine.isa else "x86 without AVX2"


def this_host() -> Machine:
    """/proc/cpuinfo's flags: no torch before setup has installed it."""
    return Machine(arch=platform.machine(), isa=frozenset(cpu_flags() & set(ISA_FLAGS)))


def test_id(classname: str, name: str) -> tuple[str, str]:
    """JUnit's dotted classname (module, then any class) and name as pytest's
    (file path, rest of the node id)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = Path(*parts[:end]).with_suffix(".py")
        if (ROOT / path).is_file():
            return path.as_posix(), "::".join([*parts[end:], name])
    return classname, name


def read_run(xml_path: Path) -> SuiteRun:
    root = ET.parse(xml_path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    times = [TestTime(*test_id(case.get("classname", ""), case.get("name", "")), float(case.get("time") or 0))
             for case in suite.iter("testcase")]
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return SuiteRun(float(suite.get("time", 0)), int(suite.get("tests", len(times))), failed, times)


def load_timings() -> dict:
    try:
        return json.loads(TIMINGS.read_text())
    except FileNotFoundError:
        return {"runs": {}, "files": {}}


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def describe(run: dict) -> str:
    return f"{run['tests']} tests on {run['date']}" + (f"; {run['note']}" if run.get("note") else "")


def plan(tier: str) -> int:
    kind = host_kind(this_host())
    runs = load_timings()["runs"]
    print(f"suite {tier}: host {kind}, {platform.machine()}; budget {minutes(BUDGET_S[tier])} of pytest, "
          f"fails past {minutes(FAIL_FACTOR * BUDGET_S[tier])}")
    past = runs.get(tier, {})
    if kind in past:
        run = past[kind]
        print(f"suite {tier}: expect about {minutes(run['wall_s'])} of pytest here plus setup "
              f"({describe(run)})")
    else:
        print(f"suite {tier}: no run recorded on this kind of host yet")
    for other, run in sorted(past.items()):
        if other != kind:
            print(f"suite {tier}:   on {other}: {minutes(run['wall_s'])} ({describe(run)})")
    return 0


def check(tier: str, xml_path: Path) -> int:
    if not xml_path.is_file():
        print(f"suite_budget: no test report at {xml_path}; run `make test` (tier all) or `make test-fast` first")
        return 2
    run, budget = read_run(xml_path), BUDGET_S[tier]
    kind = host_kind(this_host())
    print(f"suite {tier}: {run.tests} tests, {run.failed} failed, {minutes(run.wall_s)} of pytest on {kind} "
          f"(budget {minutes(budget)})")
    if run.wall_s <= budget:
        return 0
    print(f"suite {tier}: over its budget by {run.wall_s / budget:.2f}x; slowest tests (s):")
    for t in run.slowest():
        print(f"  {t.seconds:8.1f}  {t.file}::{t.name}")
    if run.wall_s > FAIL_FACTOR * budget:
        print(f"suite {tier}: more than {FAIL_FACTOR}x its budget: share engines or models among the tests above, "
              "or move them to engine=hf (docs/benchmarks.md, test-suite timings)")
        return 1
    return 0


def record(tier: str, xml_path: Path) -> int:
    run, timings = read_run(xml_path), load_timings()
    kind = host_kind(this_host())
    timings["runs"].setdefault(tier, {})[kind] = {"wall_s": round(run.wall_s), "tests": run.tests,
                                                   "date": date.today().isoformat()}
    if tier == "all":
        timings["files"] = run.seconds_per_file()
        timings["slow_from_s"] = SLOW_FROM_S
        # A test slow in an earlier run (on a slower host, say) stays slow while it is in the suite:
        # a faster host's run must not move it into the fast tier of the others.
        ran = {t.nodeid for t in run.times}
        slow = {t.nodeid for t in run.times if t.seconds >= SLOW_FROM_S}
        timings["slow_tests"] = sorted(slow | (set(timings.get("slow_tests", ())) & ran))
    atomic.write_text(TIMINGS, json.dumps(timings, indent=1) + "\n")
    print(f"suite {tier}: recorded {minutes(run.wall_s)} for {kind} in {TIMINGS}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("plan", "check", "record"))
    ap.add_argument("tier", choices=sorted(BUDGET_S))
    ap.add_argument("xml", nargs="?", type=Path, help="pytest's JUnit XML (default: logs/suite-<tier>.xml)")
    args = ap.parse_args(argv)
    xml_path = args.xml or ROOT / "logs" / f"suite-{args.tier}.xml"
    if args.action == "plan":
        return plan(args.tier)
    if args.action == "record" and not xml_path.is_file():
        print(f"suite_budget: no test report at {xml_path}; run the tier first")
        return 2
    return check(args.tier, xml_path) if args.action == "check" else record(args.tier, xml_path)


if __name__ == "__main__":
    sys.exit(main())
