"""Atomic writes: a reader sees either nothing or the complete thing.

Everything written here gets the mode a plain open() or mkdir() would give
it under the process's umask (0644 and 0755 under umask 022): the temp files
and folders it starts from (mkstemp's 0600, mkdtemp's 0700) would keep a
shared results folder, artifact store or web server from reading them."""
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from quantize.common import file_lock
from quantize.common.paths import CACHE_DIR

log = logging.getLogger("quantbench")


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

    Builds of the same `final` take turns (build_turn); the leftover
    `.<name>.tmp-*` and `.<name>.old-*` dirs of killed runs are removed on the
    next attempt (an old copy whose `final` is missing is put back), and
    never the dir of a build still running (one that took another lock: the
    same folder reached through another QUANTBENCH_CACHE or mount path)."""
    final = Path(final).absolute()
    made = _missing_folders(final.parent)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        with build_turn(final, str(final)):
            _remove_dead_builds(final)
            yield from _build_and_swap(final)
    except BaseException:
        _remove_if_empty(made)  # a failed build leaves no empty <artifacts_dir>/<model>/ either
        raise


def _missing_folders(folder: Path) -> list[Path]:
    """The folders mkdir(parents=True) would make for `folder`, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_if_empty(folders: list[Path]) -> None:
    """rmdir each, deepest first, stopping at the first that holds something
    (another build's output may have arrived meanwhile)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def build_lock_path(final: Path) -> Path:
    """The lock file of builds of `final`, one per real path (symlinks resolved)."""
    return CACHE_DIR / "locks" / f"{hashlib.sha256(str(Path(final).resolve()).encode()).hexdigest()[:16]}.lock"


# A staging dir's build is live while its process holds a lock on this file beside
# it (`.<name>.tmp-<random>` + LIVE): a POSIX lock, which NFS forwards and a kill drops.
LIVE = ".live"


def _remove_dead_builds(final: Path) -> None:
    """Remove the staging dirs (and their marks) of builds of `final` that no
    process holds any more, and the replaced copies a killed swap left
    (`.<name>.old-*`); a copy that a kill left in place of a missing `final`
    is put back first. A live build's old copy is its own to put back or discard."""
    for path in final.parent.glob(f".{final.name}.tmp-*"):
        staging = path.with_name(path.name.removesuffix(LIVE))
        if not _is_live(staging.with_name(staging.name + LIVE)):
            shutil.rmtree(staging, ignore_errors=True)
            staging.with_name(staging.name + LIVE).unlink(missing_ok=True)
    olds = [old for old in final.parent.glob(f".{final.name}{OLD}*") if not _is_live(_old_mark(final, old))]
    olds.sort(key=lambda p: p.lstat().st_ctime_ns)
    if olds and not final.exists():
        log.warning("%s was missing after a stopped rebuild: put back from %s", final, olds[-1].name)
        os.replace(olds.pop(), final)
    for old in olds:
        _discard(old)


def _old_name(final: Path, staging: Path) -> Path:
    """Where a build's swap puts the `final` it replaces: named after its
    staging dir, so the build's mark keeps it live until it is discarded."""
    return final.with_name(f".{final.name}{OLD}{staging.name.removeprefix(f'.{final.name}.tmp-')}")


def _old_mark(final: Path, old: Path) -> Path:
    """The mark of the build whose swap moved `old` aside (one of an older
    version, named by its pid, has none)."""
    return final.with_name(f".{final.name}.tmp-{old.name.removeprefix(f'.{final.name}{OLD}')}{LIVE}")


def _is_live(mark: Path) -> bool:
    """Another process holds `mark`'s lock. False where there is no mark (a
    killed run's, or one of an older version) or no locks on this file system."""
    try:
        fd = os.open(mark, os.O_RDWR)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # another user's build: not ours to judge
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as e:
        return e.errno in (errno.EACCES, errno.EAGAIN)
    finally:
        os.close(fd)  # releases the probe's lock


_building: set[Path] = set()  # the build locks this process holds (a POSIX lock taken twice would be lost)


@contextmanager
def build_turn(final: Path, what: str):
    """Hold the build lock of `final` for the `with` block, waiting for
    another process that builds it; yields a file_lock.Hold. The lock file is
    under .cache/locks/, keyed by `final`'s real path, not beside it: a
    run refused before it builds leaves nothing where artifacts go. Held
    already by this process (quantize holds it around staging_dir): held on."""
    final = Path(final).absolute()
    if final in _building:
        yield file_lock.Hold(waited_s=0.0, holder=None)
        return
    lock = build_lock_path(final)
    with file_lock.held(lock, what, "building it", fix="set QUANTBENCH_CACHE=<a folder of your own>") as hold:
        if not hold.locked:
            log.warning("%s: cannot lock %s (%s), so another process may build it at the same time; put "
                        "QUANTBENCH_CACHE on a file system with locks", what, lock, hold.unlocked)
        _building.add(final)
        try:
            yield hold
        finally:
            _building.discard(final)


def _build_and_swap(final: Path):
    # The mark first, locked, then the dir of its name: no live build's dir is ever without one.
    fd, mark = tempfile.mkstemp(prefix=f".{final.name}.tmp-", suffix=LIVE, dir=final.parent)
    tmp = Path(mark.removesuffix(LIVE))
    try:
        os.fchmod(fd, file_mode())
        _lock_if_possible(fd)
        tmp.mkdir(mode=0o700)
        yield from _fill_and_swap(final, tmp)
    finally:
        os.unlink(mark)
        os.close(fd)


def _lock_if_possible(fd: int) -> None:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in NO_LOCKS:  # no locks here: other builds cannot tell, as before
            raise


def _fill_and_swap(final: Path, tmp: Path):
    try:
        tmp.chmod(dir_mode())
        yield tmp
        modes = {True: dir_mode(), False: file_mode()}
        for p in tmp.rglob("*"):  # libraries that save through their own temp files leave 0600 ones
            p.chmod(modes[p.is_dir()])
        _swap_in(final, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


OLD = ".old-"  # .<name>.old-<random>: the artifact a forced rebuild replaces, for the moment between renames


def _swap_in(final: Path, tmp: Path) -> None:
    """Rename `tmp` to `final`. An existing `final` is moved aside first
    (under a name as unique as `tmp`'s, live while its build is) and put
    back when anything, a SIGTERM included, stops the swap halfway."""
    if not final.exists():
        os.replace(tmp, final)
        return
    old = _old_name(final, tmp)
    try:
        os.replace(final, old)
        os.replace(tmp, final)
    except BaseException:
        if old.exists() and not final.exists():
            os.replace(old, final)
        raise
    _discard(old)


def _discard(old: Path) -> None:
    """Delete a replaced artifact under a dead staging dir's name, so that a
    kill halfway leaves nothing that could pass for the whole old artifact."""
    doomed = old.with_name(old.name.replace(OLD, ".tmp-", 1))
    try:
        os.replace(old, doomed)
    except OSError:
        doomed = old
    shutil.rmtree(doomed, ignore_errors=True)


def append_line(path: Path, line: str) -> None:
    """Append one line to a JSON Lines file with a single O_APPEND write, so
    concurrent writers on a local filesystem never interleave. The file's
    writers take turns (an exclusive flock of the file itself, held for
    milliseconds) so that the tail can be mended first: a last line without
    its newline (a writer killed mid-write, a hand edit) would glue this line
    onto it, and both would be lost (see `mend_tail`)."""
    data = (line.rstrip("\n") + "\n").encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)  # as open(): the umask decides
    try:
        _take_turn(fd)
        payload = mend_tail(fd, path) + data
        start = os.fstat(fd).st_size
        written = os.write(fd, payload)
        if written != len(payload):  # a disk that filled, a file size limit: no error, fewer bytes
            os.ftruncate(fd, start)
            raise OSError(errno.ENOSPC, f"only {written} of the line's {len(payload)} bytes fit; "
                                        "nothing of it was kept", str(path))
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the flock


def _take_turn(fd: int) -> None:
    """Wait for the file's other writers. A file system without locks (NFS
    without lockd) appends unguarded, as O_APPEND alone does: jobs on other
    hosts write shards of their own there (evaluate.results.shard_path)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
        if e.errno not in NO_LOCKS:
            raise


TORN_MARK = ".torn-"  # <file>.torn-<UTC time>: a torn tail moved aside
NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}  # "no locks here", not "held"
TAIL_CHUNK = 1 << 16


def mend_tail(fd: int, path: Path) -> bytes:
    """What to write before the next line so that it starts a line of its
    own: nothing when the file is empty or ends in a newline; a newline after
    a last line that is whole JSON; after a torn last line (not JSON), nothing,
    once that line is moved to `<name>.torn-<UTC time>` beside the file and cut
    off, with one WARNING naming both files and its line number."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return b""
    start = _last_line_start(fd, size)
    tail = os.pread(fd, size - start, start)
    try:
        json.loads(tail)
        return b"\n"
    except ValueError:  # also a UnicodeDecodeError
        pass
    aside = path.with_name(f"{path.name}{TORN_MARK}{datetime.now(timezone.utc):%Y%m%dT%H%M%S.%fZ}")
    write_bytes(aside, tail)
    os.ftruncate(fd, start)
    log.warning("%s: line %d was torn (%d bytes that are not JSON, no newline): moved to %s before appending",
                path, _count_lines(fd, start) + 1, len(tail), aside)
    return b""


def _last_line_start(fd: int, size: int) -> int:
    """Offset of the first byte after the last newline (0: the file is one line)."""
    end = size
    while end > 0:
        start = max(0, end - TAIL_CHUNK)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _count_lines(fd: int, end: int) -> int:
    """Newlines in the first `end` bytes."""
    return sum(os.pread(fd, min(TAIL_CHUNK, end - at), at).count(b"\n") for at in range(0, end, TAIL_CHUNK))
