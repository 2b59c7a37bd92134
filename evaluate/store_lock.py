"""One writer per measurement: an advisory lock per (store, setup, artifact,
scenario), held for the whole measurement, not only for the appends.

Two evaluate processes on one results store (two sweeps started together, a
Slurm requeue while the first attempt still writes) would otherwise both
measure what neither had stored when they planned. The second to reach a
measurement waits here; once it holds the lock it re-reads the store and
measures only what the first left (evaluate.pipeline).

The lock is a POSIX record lock (`fcntl.lockf`) on
`<results_dir>/locks/<hash of the measurement key>.lock`: NFS forwards these
to the server (NFSv4 natively, NFSv3 through lockd), where `flock` may be
local to one client. The kernel drops it when the holder exits, also on a
kill, so a dead job does not block the next (on NFS, the locks of a node that
died go when the server's lease on them expires). Two caveats of
POSIX locks shape the code: they exclude other processes only (never the
holder's own), and closing any descriptor of the file releases them, so the
file is opened once per hold and read only through that descriptor."""
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from quantize.common.errors import UserError

log = logging.getLogger("quantbench.evaluate")

LOCKS_DIR = "locks"
# errnos that say the file system offers no locks at all (as opposed to "held by another")
UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


@dataclass(frozen=True)
class Hold:
    """How this process came to hold a measurement's lock."""
    waited_s: float        # seconds spent waiting for another process (0: it was free)
    holder: str | None     # after a wait, the process that held it last ("<host> pid <n>"); None: no wait
    locked: bool = True    # False: the file system refused locks; held by no one

    @property
    def waited(self) -> bool:
        return self.holder is not None


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
    fd = _open(path)
    try:
        hold = _acquire(fd, path, what)
        if hold.locked:
            _write_holder(fd)
        yield hold
    finally:
        os.close(fd)  # releases the lock


def _open(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # an exclusive lock needs a writable descriptor
    except OSError as e:
        raise UserError(f"cannot open the lock file {path} ({e.strerror or e}); make {path.parent} writable "
                        "for this user, or pass results_dir=<a directory of your own>") from None


def check_writable(results_dir: Path) -> None:
    """Fail before any engine starts where the store's lock folder exists but
    no lock file can be made in it (another user's folder, or not a folder)."""
    locks = Path(results_dir) / LOCKS_DIR
    if not locks.exists():
        return  # made at the first measurement, in a store already found writable
    try:
        tempfile.TemporaryFile(dir=locks).close()  # leaves nothing behind
    except OSError as e:
        raise UserError(f"cannot create lock files in {locks} ({e.strerror or e}); make it a folder this user "
                        "can write, or pass results_dir=<a directory of your own>") from None


def _acquire(fd: int, path: Path, what: str) -> Hold:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return Hold(waited_s=0.0, holder=None)
    except OSError as e:
        if e.errno in UNSUPPORTED:
            return _unlocked(path, what, e)
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise
    holder = _read_holder(fd) or "another process"
    log.info("%s: waiting for %s, which is measuring it in this store (lock %s)", what, holder, path)
    start = time.monotonic()
    fcntl.lockf(fd, fcntl.LOCK_EX)
    # the file still names the last holder (this process writes itself in next): the one whose work it finds
    return Hold(waited_s=time.monotonic() - start, holder=_read_holder(fd) or holder)


def _unlocked(path: Path, what: str, e: OSError) -> Hold:
    log.warning("%s: cannot lock %s (%s), so another process on this store may measure it too; mount the "
                "store with locks (NFS: lockd running; Lustre: -o flock) or give each job its own results_dir",
                what, path, e.strerror or e)
    return Hold(waited_s=0.0, holder=None, locked=False)


def _write_holder(fd: int) -> None:
    """Who holds the lock, for the line a waiting process logs."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{socket.gethostname()} pid {os.getpid()}".encode(), 0)


def _read_holder(fd: int) -> str | None:
    text = os.pread(fd, 256, 0).decode(errors="replace").strip()
    return text or None
