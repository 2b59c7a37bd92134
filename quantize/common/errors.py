"""How a command ends when it cannot do what was asked: one line on stderr,
`error: <what happened>; <the fix>`, and an exit status that tells the kinds
apart (scripts and sweeps branch on it). The trace, where there is one, goes
to the job's log file only (or to stderr as well with -v): quantize.common.jobs.

This is the one list of exit statuses (docs/robustness.md repeats it)."""
import difflib
import errno
from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1           # anything not foreseen below (a bug, most likely): the trace is in the log
    BAD_INPUT = 2        # bad input, answered before any work; nothing written
    ENGINE_DIED = 3      # the engine (vLLM's engine core, a server) died, or the GPU was lost under engine=hf
                         # (a CUDA error such as an illegal memory access), mid-run; owed runs recorded failed
    RUNS_FAILED = 4      # runs that failed on their own (a server's HTTP errors or stalled streams, a CUDA OOM
                         # at one batch size); the others measured
    DISK_FULL = 5        # no room for the artifact or the rows; nothing half-written kept
    INTERRUPTED = 130    # Ctrl-C (SIGINT), 128 + 2 as shells report it; what was complete is kept


class OneLineError(Exception):
    """A failure the user can act on: its text is the one line, naming the fix."""

    exit_code = ExitCode.FAILED


class UserError(OneLineError):
    """Bad input the user can fix; printed as a single line, never a traceback."""

    exit_code = ExitCode.BAD_INPUT


class EngineDied(OneLineError):
    """The engine's process died while it measured: what it owed is recorded
    as failed, and nothing more can run in it."""

    exit_code = ExitCode.ENGINE_DIED


class RunsFailed(OneLineError):
    """Runs failed at the server (after their retries) while the job went on
    to the next: said once, at the end of the job."""

    exit_code = ExitCode.RUNS_FAILED


class DiskFull(OneLineError):
    """No room where the command writes, found before writing or on a write."""

    exit_code = ExitCode.DISK_FULL


class Interrupted(OneLineError):
    """Ctrl-C: the job stopped where it was."""

    exit_code = ExitCode.INTERRUPTED


# A write refused for want of room: the disk (ENOSPC), the user's quota
# (EDQUOT), or the largest file this process may write (EFBIG, RLIMIT_FSIZE).
NO_ROOM_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# safetensors' Rust writer reports the same as text (SafetensorError is no OSError).
NO_ROOM_TEXT = ("No space left on device", "Disk quota exceeded", "File too large")


def is_no_room(e: BaseException) -> bool:
    """Whether `e`, or an exception it was raised from, is a write refused for want of room."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_ROOM_ERRNOS or any(text in str(e) for text in NO_ROOM_TEXT):
            return True
        e = e.__cause__ or e.__context__
    return False


def first_line(e: BaseException, limit: int = 300) -> str:
    """The first non-empty line of what `e` says (libraries raise screenfuls)."""
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "") or type(e).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


# difflib's similarity a misspelt name must reach to be suggested, one for
# every "did you mean": "out_dir" finds results_dir (0.67), "forse" force (0.8),
# "gpu_util" gpu_memory_utilization (0.53, which difflib's default 0.6 missed).
NEAREST_CUTOFF = 0.5


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The choice a misspelt `name` most likely meant, for a "did you mean" hint."""
    found = difflib.get_close_matches(name, list(choices), n=1, cutoff=NEAREST_CUTOFF)
    return found[0] if found else None
