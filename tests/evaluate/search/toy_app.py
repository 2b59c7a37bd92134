"""A toy search job for the sweeper's tests: two objectives from an interval
and a choice parameter, after a short sleep, through the project's real job
wrapper (quantize.common.jobs.run_job). It writes its trial record as the
real trial job does, and appends its trial number to a ledger when it is
done, so a test can see which trials ran to the end and how often.

    python -m tests.evaluate.search.toy_app hydra.searchpath=[file://<repo>/conf] results_dir=... ledger=...
        [+hold_trial=N +hold_dir=<folder>]

With TOY_HUB_DOWNLOADS=<file> in the environment, the hub is reachable and
each download of a hub id (model.path=org/name) appends the id to <file>
and fails: a test sees whether the sweeper downloaded before a refusal.

With hold_trial, trial N's job writes <hold_dir>/waiting and runs on only
once <hold_dir>/go exists: a test that kills the search meanwhile knows which
trial it cut short, whatever the host's speed.
"""
import os
import signal
import time
from pathlib import Path

import hydra

from evaluate.search import study_file
from quantize.common import atomic, hub
from quantize.common.errors import UserError
from quantize.common.jobs import run_job
from quantize.common.resolvers import register_resolvers

register_resolvers()  # the launcher presets use ${qb_root:}

HOLD_GUARD_S = 600  # a held trial never released: its test has died


def _record_download(repo_id: str) -> Path:
    atomic.append_line(os.environ["TOY_HUB_DOWNLOADS"], repo_id)
    raise UserError(f"toy hub: {repo_id} not downloaded")


if os.environ.get("TOY_HUB_DOWNLOADS"):
    hub.main_commit = lambda repo_id: "b" * 40
    hub.download = _record_download


@hydra.main(config_path="conf", config_name="toy", version_base="1.3")
def main(cfg):
    return run_job(_trial, cfg)


def _trial(cfg) -> list[float]:
    started = time.monotonic()
    number = int(cfg.trial_number)
    if cfg.get("hold_trial") is not None and number == int(cfg.hold_trial):
        _hold(Path(cfg.hold_dir))
    time.sleep(float(cfg.sleep_s))
    if number in list(cfg.kill_trials):
        os.kill(os.getpid(), signal.SIGKILL)   # as a scheduler's kill or the out-of-memory killer would
    if number in list(cfg.fail_trials):
        raise UserError(f"toy trial {number} fails on purpose; drop it from fail_trials")
    x, k = float(cfg.x), int(cfg.k)
    values = [x * x + k, (x - 2) ** 2]
    study_file.write_trial_info(cfg.results_dir, cfg.study, number, {
        "recipe": f"toy-k{k}", "artifact_id": f"toy-{number:04d}", "wall_s": round(time.monotonic() - started, 2), "values": values})
    atomic.append_line(cfg.ledger, str(number))
    return values


def _hold(folder: Path) -> None:
    """Say this job is running (folder/waiting) and wait for folder/go."""
    atomic.write_text(folder / "waiting", "")
    deadline = time.monotonic() + HOLD_GUARD_S
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"held trial not released within {HOLD_GUARD_S} s: no {folder / 'go'}")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
