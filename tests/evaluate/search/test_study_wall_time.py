"""A study's wall time is the time trials ran: parallel trials count once,
the pause between two runs of a resumed study does not, nor the trial a
stopped sweeper interrupted (its end is when the rerun settled it)."""
from datetime import datetime, timedelta

from optuna.trial import FrozenTrial, TrialState

from evaluate.search.sweeper import INTERRUPTED_ATTR, _study_wall_s

T0 = datetime(2026, 11, 27, 2, 0, 0)


def trial(number: int, start_s: float, end_s: float, state=TrialState.COMPLETE, interrupted=False) -> FrozenTrial:
    return FrozenTrial(number=number, state=state, value=None, values=[1.0] if state == TrialState.COMPLETE else None,
                       datetime_start=T0 + timedelta(seconds=start_s), datetime_complete=T0 + timedelta(seconds=end_s),
                       params={}, distributions={}, user_attrs={INTERRUPTED_ATTR: True} if interrupted else {},
                       system_attrs={}, intermediate_values={}, trial_id=number)


def test_parallel_trials_count_once_and_a_pause_between_runs_not_at_all():
    trials = [trial(0, 0, 100), trial(1, 50, 120), trial(2, 1000, 1060)]  # 0 and 1 in parallel; a pause; then 2
    assert _study_wall_s(trials) == 180.0


def test_an_interrupted_trial_does_not_stretch_the_time_over_the_pause():
    trials = [trial(0, 0, 100), trial(1, 100, 2700, TrialState.FAIL, interrupted=True), trial(2, 2700, 2760),
              trial(3, 2760, 2800, TrialState.FAIL)]  # 3 failed on its own: it ran, it counts
    assert _study_wall_s(trials) == 200.0


def test_no_finished_trial_has_no_wall_time():
    running = trial(0, 0, 10)
    running.datetime_complete = None
    assert _study_wall_s([running]) is None
