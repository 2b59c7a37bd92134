"""A lock file held by one process at a time while it does work another
process may want to do too: evaluate's measurement locks
(evaluate.store_lock) and quantize's build lock (atomic.build_turn). The
second process waits, logging who it waits for, and once it holds the lock
looks again at what is left to do.

The lock is a POSIX record lock (`fcntl.lockf`): NFS forwards these to the
server (NFSv4 natively, NFSv3 through lockd), where `flock` may be local to
one client. The kernel drops it when the holder exits, also on a kill, so a
dead job does not block the next (on NFS, the locks of a node that died go
when the server's lease on them expires). Two caveats of POSIX locks shape
the code: they exclude other processes only (never the holder's own), and
closing any descriptor of the file releases them, so the file is opened once
per hold and read only through that descriptor. The file holds the holder's
"<host> pid <n>", for the line a waiting process logs."""
import errno
import fcntl
import logging
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from quantize.common.errors import UserError

log = logging.getLogger("quantbench")

# errnos that say the file system offers no locks at all (as opposed to "held by another")
UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


@dataclass(frozen=True)
class Hold:
    """How this process came to hold a lock."""
    waited_s: float        # seconds spent waiting for another process (0: it was free)
    holder: str | None     # after a wait, the process that held it last ("<host> pid <n>"); None: no wait
    # None: held; else why the file system refused to lock (held by no one, the work goes on unguarded)
    unlocked: str | None = None

    @property
    def waited(self) -> bool:
        return self.holder is not None

    @property
    def locked(self) -> bool:
        return self.unlocked is None


@contextmanager
def held(path: Path, what: str, doing: str, fix: str, logger: logging.Logger = log):
    """Hold the lock file at `path` for the `with` block, waiting for another
    process that holds it; yields a Hold. While waiting, one line on the
    stage's `logger`: "<what>: waiting for <holder>, which is <doing> (lock
    <path>)". A lock file that cannot be made is one line naming `fix`."""
    path = Path(path)
    fd = _open(path, fix)
    if fd is None:
        yield Hold(waited_s=0.0, holder=None, unlocked="another user's lock file that this user cannot write; "
                                                       "`chmod g+w` it so that every user can lock it")
        return
    try:
        hold = _acquire(fd, path, what, doing, logger)
        if hold.locked:
            _write_holder(fd)
        yield hold
    finally:
        os.close(fd)  # releases the lock


def _open(path: Path, fix: str) -> int | None:
    """A writable descriptor of the lock file (an exclusive lock needs one);
    None where it is another user's file this one may not write (the work
    goes on unlocked, as where the file system has no locks)."""
    try:
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
            _share_folder_like_parent(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM) and path.is_file():
            return None
        raise UserError(f"cannot open the lock file {path} ({e.strerror or e}); make {path.parent} writable "
                        f"for this user, or {fix}") from None
    _share_like_folder(fd, path.parent)
    return fd


def _share_folder_like_parent(folder: Path) -> None:
    """A lock folder made here writable by whoever may write its parent (a
    shared store's group), whatever the umask (022 makes it 0755): else only
    its first user could make lock files in it."""
    try:
        own, parent = os.stat(folder), os.stat(folder.parent).st_mode
        share = (0o070 if parent & 0o020 else 0) | (0o007 if parent & 0o002 else 0)
        if own.st_uid == os.geteuid() and own.st_mode & share != share:
            os.chmod(folder, (own.st_mode | share) & 0o7777)
    except OSError as e:  # the folder still works for this user
        log.debug("cannot share the lock folder %s: %s", folder, e)


def _share_like_folder(fd: int, folder: Path) -> None:
    """Let whoever may write the lock folder (its group, others) write a lock
    file this user owns, whatever the umask (022 makes it 0644): every user of
    a shared store must be able to lock it, not only the first to get there."""
    try:
        own = os.fstat(fd)
        if own.st_uid != os.geteuid():
            return
        folder_mode = os.stat(folder).st_mode
        share = (0o060 if folder_mode & 0o020 else 0) | (0o006 if folder_mode & 0o002 else 0)
        if own.st_mode & share != share:
            os.fchmod(fd, (own.st_mode | share) & 0o7777)
    except OSError as e:  # the lock still works for this user
        log.debug("cannot share the lock file in %s: %s", folder, e)


def _acquire(fd: int, path: Path, what: str, doing: str, logger: logging.Logger) -> Hold:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return Hold(waited_s=0.0, holder=None)
    except OSError as e:
        if e.errno in UNSUPPORTED:
            return Hold(waited_s=0.0, holder=None, unlocked=e.strerror or str(e))
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise
    holder = _read_holder(fd) or "another process"
    logger.info("%s: waiting for %s, which is %s (lock %s)", what, holder, doing, path)
    start = time.monotonic()
    fcntl.lockf(fd, fcntl.LOCK_EX)
    # the file still names the last holder (this process writes itself in next): the one whose work it finds
    return Hold(waited_s=time.monotonic() - start, holder=_read_holder(fd) or holder)


def _write_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{socket.gethostname()} pid {os.getpid()}".encode(), 0)


def _read_holder(fd: int) -> str | None:
    text = os.pread(fd, 256, 0).decode(errors="replace").strip()
    return text or None
