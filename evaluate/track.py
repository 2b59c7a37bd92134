"""`python -m evaluate.track [results_dir=results] [tracking.uri=<uri>] [tracking.experiment=quantbench]`

Back-fills an existing results store into the tracker (conf/track.yaml:
tracking=mlflow): each artifact's run, from its manifest where the artifact is
at hand, and each row into its measurement's run. Runs are found by their
key and steps already logged are skipped, so a second back-fill, or one after
a sweep that logged live, adds nothing. Unlike a job, whose measurements come
first, a back-fill that cannot log fails: one line, exit 1."""
import logging
import sys
from pathlib import Path

import hydra

from evaluate import results, store_lock, tracking
from quantize.common.cli_help import print_help_if_asked
from quantize.common.config import prepare_argv
from quantize.common.errors import UserError
from quantize.common.extensions import plain
from quantize.common.hf_load import detach_stdin
from quantize.common.jobs import one_line, run_command
from quantize.common.paths import CONF_DIR, folder_setting, resolve
from quantize.common.tracking import Tracker, from_group

log = logging.getLogger("quantbench.tracking")


def backfill(results_dir: Path, tracker: Tracker) -> str:
    """Log every row of the store; returns the line saying what was sent."""
    rows = results.read_stores([results_dir]).rows
    _bind_locks(tracker, results_dir)
    records = tracking.measurement_records(rows)
    tracker.prepare(records)   # the runs missing created at once: a wait for other jobs' runs per batch, not per run
    for record in records:
        tracker.write(record)
    artifacts = {r.artifact_id for r in rows if r.artifact_id}
    measurements = {r.measurement_key() for r in rows}
    return (f"{len(rows)} rows of {len(artifacts)} artifact(s), {len(measurements)} measurement run(s), "
            f"from {results_dir} logged to {tracker.describe()}: {tracker.steps_sent} new step(s), "
            "the rest logged before")


def _bind_locks(tracker: Tracker, results_dir: Path) -> None:
    """The store's run locks where this user can make them; else none, with a
    note: a store this user may only read (another user's, a snapshot) is
    still back-filled, where every lock file failed the back-fill."""
    problem = store_lock.lock_problem(results_dir, make=True)
    if problem:
        log.warning("note: cannot make lock files in %s (%s), so this back-fill runs without them: run no other "
                    "job or back-fill of this store into the same experiment meanwhile",
                    Path(results_dir) / store_lock.LOCKS_DIR, problem)
        return
    tracking.bind(tracker, results_dir)


@hydra.main(config_path=str(CONF_DIR), config_name="track", version_base="1.3")
def _hydra_main(cfg) -> None:
    tracker = None
    try:
        tracker = from_group(plain(cfg.tracking))
        if tracker is None:
            raise UserError("tracking=none logs nothing; pass tracking=mlflow tracking.uri=<uri>")
        print(backfill(resolve(folder_setting("results_dir", cfg.results_dir)), tracker))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code) from None
    except Exception as e:  # the tracker's own (a server that does not answer, a bad URI)
        shown = tracker.error_line(e, limit=400) if tracker else one_line(e)   # a URI's password redacted
        print(f"error: cannot log to the tracker: {shown}", file=sys.stderr)
        raise SystemExit(1) from None


def main() -> None:
    if print_help_if_asked("track", sys.argv[1:]):
        return
    prepare_argv("track")
    _hydra_main()


if __name__ == "__main__":
    detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    run_command(main, "evaluate.track", "track")
