"""Atomic writes: a reader sees either nothing or the complete thing."""
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from quantize.common.paths import CACHE_DIR


def write_text(path: Path, text: str) -> None:
    """Write a file via temp + fsync + rename in the same directory."""
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> None:
    """temp file + fsync + rename in the same folder: a reader sees the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    tmp.chmod(0o755)  # mkdtemp makes 0700; artifacts are meant to be shared
    try:
        yield tmp
        for p in tmp.rglob("*"):  # mkstemp (manifest) and safetensors write 0600 files
            p.chmod(0o755 if p.is_dir() else 0o644)
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
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
