"""One writer per measurement: an advisory lock per (store, setup, artifact,
scenario), held for the whole measurement, not only for the appends.

Two evaluate processes on one results store (two sweeps started together, a
Slurm requeue while the first attempt still writes) would otherwise both
measure what neither had stored when they planned. The second to reach a
measurement waits here; once it holds the lock it re-reads the store and
measures only what the first left (evaluate.pipeline).

The lock is a file_lock (a POSIX record lock, which NFS forwards to the
server and the kernel drops when its holder dies) on
`<results_dir>/locks/<hash of the measurement key>.lock`."""
import hashlib
import json
import logging
import tempfile
from contextlib import contextmanager
from pathlib import Path

from quantize.common import file_lock
from quantize.common.errors import UserError
from quantize.common.file_lock import Hold  # noqa: F401  (what `measurement` yields)

log = logging.getLogger("quantbench.evaluate")

LOCKS_DIR = "locks"


def lock_path(results_dir: Path, key: tuple) -> Path:
    """The lock file of measurement `key` in the store at `results_dir`. The
    folder is left out of the hash: nodes may mount one shared store at
    different paths, and must still meet at one lock file."""
    digest = hashlib.sha256(json.dumps(list(key), default=str).encode()).hexdigest()[:32]
    return Path(results_dir) / LOCKS_DIR / f"{digest}.lock"


@contextmanager
def measurement(results_dir: Path, key: tuple, what: str):
    """Hold measurement `key`'s lock in the store at `results_dir` for the
    `with` block, waiting for another process that holds it; yields a Hold.
    `what` names the measurement in the line logged while waiting."""
    path = lock_path(results_dir, key)
    with file_lock.held(path, what, "measuring it in this store",
                        fix="pass results_dir=<a directory of your own>", logger=log) as hold:
        if not hold.locked:
            log.warning("%s: cannot lock %s (%s), so another process on this store may measure it too; mount "
                        "the store with locks (NFS: lockd running; Lustre: -o flock) or give each job its own "
                        "results_dir", what, path, hold.unlocked)
        yield hold


def check_writable(results_dir: Path) -> None:
    """Fail before any engine starts where the store's lock folder exists but
    no lock file can be made in it (another user's folder, or not a folder)."""
    locks = Path(results_dir) / LOCKS_DIR
    if not locks.exists():
        return  # made at the first measurement, in a store already found writable
    problem = lock_problem(results_dir)
    if problem:
        raise UserError(f"cannot create lock files in {locks} ({problem}); make it a folder this user "
                        "can write, or pass results_dir=<a directory of your own>")


def lock_problem(results_dir: Path, make: bool = False) -> str | None:
    """Why this user cannot make lock files in the store's lock folder (made
    first when `make`), or None: a probe file, which leaves nothing behind."""
    locks = Path(results_dir) / LOCKS_DIR
    try:
        if make:
            locks.mkdir(exist_ok=True)
        tempfile.TemporaryFile(dir=locks).close()
    except OSError as e:
        return e.strerror or str(e)
    return None
