"""Rate levels' arrival schedule (evaluate/serving/load.py::arrival_offsets) and
how it is recorded in their rows' load (evaluate/serving/run.py::serving_row):
the n-th of n arrivals is due at n/rate, as in vllm bench serve, and rows of
the earlier schedule are not taken as this one's."""
from types import SimpleNamespace

import numpy as np
import pytest

from evaluate.results import Row
from evaluate.serving.load import Level, arrival_offsets
from evaluate.serving.profiles import Rate
from evaluate.serving.run import serving_row


@pytest.mark.parametrize("rate,burstiness,n", [(2.0, 1.0, 24), (0.5, 0.25, 10), (5.0, 4.0, 6)])
def test_the_last_arrival_is_due_at_n_over_rate_whatever_the_seed(rate, burstiness, n):
    """Raw gamma gaps spread 24 requests at 2 req/s over 8-16 s; the level offered ±25 % of its rate."""
    for seed in range(50):
        due = arrival_offsets(rate, burstiness, n, seed)
        assert due[-1] == pytest.approx(n / rate, rel=1e-12)
        assert due[0] > 0 and np.all(np.diff(due) >= 0)   # the first request waits one gap, as in vllm bench


def test_the_schedule_depends_on_the_seed_only_through_its_gaps():
    a, b = arrival_offsets(1.0, 1.0, 20, 0), arrival_offsets(1.0, 1.0, 20, 1)
    assert not np.allclose(a, b) and np.array_equal(a, arrival_offsets(1.0, 1.0, 20, 0))


OLD_LOAD = {"profile": "p", "max_requests": 24, "max_seconds": 60, "drain_seconds": 60.0}   # as rows were written


def job():
    profile = Rate(name="p", rates=[2.0], max_requests=24, max_seconds=60)
    base = Row(kind="serving", status="ok", artifact_id="a1", recipe="original", engine="openai", setup_id="s1")
    return SimpleNamespace(load=profile, base=base, slo=None)


def test_a_rate_row_records_its_schedule_and_a_concurrency_row_keeps_its_key():
    scenario = SimpleNamespace(name="chat", input_len=128, output_len=64)
    conc = serving_row(job(), scenario, Level("concurrency", 4))
    before = conc.but(load=OLD_LOAD | {"mode": "concurrency", "level": 4, "burstiness": None})
    assert conc.run_key() == before.run_key()
    rate = serving_row(job(), scenario, Level("rate", 2.0, 1.0))
    old_rate = rate.but(load=OLD_LOAD | {"mode": "rate", "level": 2.0, "burstiness": 1.0})
    assert rate.run_key() != old_rate.run_key()     # measured with raw gaps: measured anew
    assert rate.load["arrivals"] == "gamma gaps scaled to n/rate"
