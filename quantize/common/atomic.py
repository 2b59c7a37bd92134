"""Atomic writes: a reader sees either nothing or the complete thing.

Everything written here gets the mode a plain open() or mkdir() would give
it under the process's umask (0644 and 0755 under umask 022): the temp files
and folders it starts from (mkstemp's 0600, mkdtemp's 0700) would keep a
shared results folder, artifact store or web server from reading them."""
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from quantize.common.paths import CACHE_DIR


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it;
    elsewhere set and put back at once."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    for line in status.splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode open() gives a new file now."""
    return 0o666 & ~umask()


def dir_mode() -> int:
    """The mode mkdir() gives a new folder now."""
    return 0o777 & ~umask()


@contextmanager
def replacing(path: Path, suffix: str = ".tmp"):
    """Yield a new empty file beside `path` (mode as open() would make it) for
    the block to write; it becomes `path` in one rename when the block
    succeeds, and is removed when it fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        os.close(fd)
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Write a file via temp + fsync + rename in the same directory."""
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> None:
    """temp file + fsync + rename in the same folder: a reader sees the old file or the whole new one."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextmanager
def staging_dir(final: Path):
    """Yield a temp dir beside `final`; on success it replaces `final` in one
    rename, on any error (or kill) it never takes `final`'s name.

    Builds of the same `final` take turns (a lock file under .cache/locks/),
    so the leftover `.<name>.tmp-*` dirs of killed runs can be removed on the
    next attempt without touching a build in progress."""
    final = Path(final).absolute()
    final.parent.mkdir(parents=True, exist_ok=True)
    locks = CACHE_DIR / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{hashlib.sha256(str(final).encode()).hexdigest()[:16]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also on kill
        for stale in final.parent.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        yield from _build_and_swap(final)


def _build_and_swap(final: Path):
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        tmp.chmod(dir_mode())
        yield tmp
        modes = {True: dir_mode(), False: file_mode()}
        for p in tmp.rglob("*"):  # libraries that save through their own temp files leave 0600 ones
            p.chmod(modes[p.is_dir()])
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def append_line(path: Path, line: str) -> None:
    """Append one line with a single O_APPEND write, so concurrent writers on a
    local filesystem never interleave and a crash never leaves half a line
    followed by another record."""
    data = (line.rstrip("\n") + "\n").encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # as open(): the umask decides
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
