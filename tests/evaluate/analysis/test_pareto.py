"""evaluate/analysis/pareto.py: the front against brute force on random
point sets, and the answer a study's front gives for an accuracy floor."""
import itertools
import random

import pytest

from evaluate.analysis.pareto import MAXIMIZE, MINIMIZE, answer, pareto_front, search_front
from evaluate.search.study_file import Objective, SearchRecord, Trial
from quantize.common.errors import UserError


def brute_force(points, directions) -> list[int]:
    """A point is on the front when no other point is >= in every objective
    (as oriented) and > in one: written out from the definition."""
    def better_or_equal(a, b, d):
        return a >= b if d == MAXIMIZE else a <= b

    def strictly_better(a, b, d):
        return a > b if d == MAXIMIZE else a < b

    front = []
    for i, p in enumerate(points):
        dominated = False
        for j, q in enumerate(points):
            if i != j and all(better_or_equal(q[k], p[k], d) for k, d in enumerate(directions)) \
                    and any(strictly_better(q[k], p[k], d) for k, d in enumerate(directions)):
                dominated = True
        if not dominated:
            front.append(i)
    return front


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_front_matches_brute_force_for_every_direction_mix(dims):
    rng = random.Random(37 + dims)
    for directions in itertools.product((MAXIMIZE, MINIMIZE), repeat=dims):
        for _ in range(60):
            n = rng.randint(0, 25)
            # few distinct values, so ties in one objective and whole duplicates are common
            points = [tuple(float(rng.randint(0, 4)) for _ in range(dims)) for _ in range(n)]
            if n and rng.random() < 0.5:
                points.append(points[rng.randrange(n)])
            assert pareto_front(points, list(directions)) == brute_force(points, directions), (directions, points)


def test_duplicates_on_the_front_are_all_kept_and_direction_matters():
    points = [(1.0, 5.0), (1.0, 5.0), (2.0, 2.0), (0.5, 6.0), (0.5, 4.0)]
    assert pareto_front(points, [MAXIMIZE, MAXIMIZE]) == [0, 1, 2, 3]
    assert pareto_front(points, [MINIMIZE, MINIMIZE]) == [2, 4]
    assert pareto_front(points, [MINIMIZE, MAXIMIZE]) == [3]


def test_bad_input_is_refused():
    with pytest.raises(UserError, match="use maximize or minimize"):
        pareto_front([(1.0,)], ["max"])
    with pytest.raises(ValueError, match="2 values for 1 objectives"):
        pareto_front([(1.0, 2.0)], [MAXIMIZE])
    with pytest.raises(ValueError, match="not a finite number"):
        pareto_front([(float("nan"),)], [MAXIMIZE])


RECOVERY = [Objective("recovery_pct", MAXIMIZE, "%"), Objective("output_throughput", MAXIMIZE, "tok/s", "interactive"),
            Objective("size_mb", MINIMIZE, "MB")]


def study(values: list, objectives=RECOVERY) -> SearchRecord:
    trials = [Trial(i, "COMPLETE", {}, list(v), recipe=f"r{i}") if v else Trial(i, "FAIL", {}, error="boom")
              for i, v in enumerate(values)]
    return SearchRecord("s", "sqlite:///s.db", objectives, "vllm", "m", "default", len(values), trials)


def test_the_answer_is_the_fastest_front_point_keeping_the_floor_ties_smaller():
    search = search_front(study([(99.0, 40.0, 270.0), (96.0, 60.0, 170.0), (95.5, 60.0, 120.0),
                                 (80.0, 90.0, 100.0), None, (95.0, 50.0, 200.0)]))
    assert [t.number for t in search.front] == [0, 1, 2, 3]   # 5 is dominated by 2; best recovery first
    assert [t.number for t in search.failed] == [4]
    pick = answer(search, 95.0)
    assert pick.pick.number == 2 and pick.meets_floor and pick.floor_pct == 95.0   # as fast as 1, smaller
    assert answer(search, 99.0).pick.number == 0
    assert answer(search, 50.0).pick.number == 3


def test_sizes_a_few_bytes_apart_tie_and_the_more_accurate_is_picked():
    """Two trials reuse one speed measurement; their sizes differ by 57 bytes
    (171.16761 and 171.167667 MB, as in a measured study): accuracy decides."""
    search = search_front(study([(97.97, 42.177, 171.16761), (99.47, 42.177, 171.167667)]))
    assert answer(search, 95.0).pick.number == 1
    apart = search_front(study([(97.97, 42.177, 171.1), (99.47, 42.177, 171.2)]))  # 0.1 MB is a real difference
    assert answer(apart, 95.0).pick.number == 0


def test_no_point_keeps_the_floor_names_the_most_accurate():
    result = answer(search_front(study([(90.0, 40.0, 270.0), (85.0, 60.0, 170.0)])), 95.0)
    assert result.pick.number == 0 and not result.meets_floor


def test_with_a_kl_objective_no_floor_applies():
    kl = [Objective("kl_divergence", MINIMIZE, "nats"), *RECOVERY[1:]]
    result = answer(search_front(study([(0.01, 40.0, 270.0), (0.3, 60.0, 170.0)], kl)), 95.0)
    assert result.pick.number == 1 and result.floor_pct is None


def test_a_study_without_complete_trials_has_no_answer():
    search = search_front(study([None, None]))
    assert search.front == [] and answer(search, 95.0).pick is None


def test_a_latency_speed_objective_is_minimized_in_the_answer():
    objectives = [Objective("top1_agreement", MAXIMIZE, "fraction"), Objective("tpot_ms_mean", MINIMIZE, "ms", "x"),
                  Objective("size_mb", MINIMIZE, "MB")]
    search = search_front(study([(0.99, 30.0, 270.0), (0.9, 12.0, 170.0), (0.8, 12.0, 120.0)], objectives))
    assert (search.roles.accuracy, search.roles.speed, search.roles.size) == (0, 1, 2)
    result = answer(search, 95.0)
    assert result.pick.number == 2 and result.floor_pct is None   # fastest (lowest TPOT), then smaller
