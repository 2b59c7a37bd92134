"""Will it fit on the disk? Checked before quantize loads anything, from the
artifact's expected size (as memory is, quantize.common.memory_check), so a
full disk is one line in milliseconds instead of a SafetensorError minutes
later; and a write that finds the disk full anyway (the estimate is one, or
something else filled the disk meanwhile) is the same kind of line, with
nothing half-written kept (quantize.common.atomic)."""
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from quantize.common.errors import DiskFull, first_line, is_no_room

# Beside the estimate: the filesystem's blocks, the tokenizer files a
# transformers version writes anew, recipe.yaml and manifest.json.
MARGIN = 1.1


@dataclass(frozen=True)
class Room:
    """The free space where a folder is, or would be, made."""
    free_bytes: int
    mount: Path


def room(folder: Path) -> Room:
    """Free bytes (for this user) on the disk that holds, or will hold, `folder`."""
    here = Path(folder).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    mount = here
    while not os.path.ismount(mount):
        mount = mount.parent
    return Room(shutil.disk_usage(here).free, mount)


def check(folder: Path, expected_bytes: int, what: str) -> None:
    """DiskFull when `expected_bytes` (with MARGIN) do not fit where `folder` goes."""
    need, free = int(expected_bytes * MARGIN), room(folder)
    if need > free.free_bytes:
        raise DiskFull(f"{what} needs about {size(need)} free but {free.mount} has {size(free.free_bytes)}; free "
                       f"some space there, or pass artifacts_dir=<a disk with room>; disk_check=false skips "
                       "this check")


@contextmanager
def room_to_write(folder: Path, what: str) -> Iterator[None]:
    """A write to `folder` that finds no room (ENOSPC, a quota, a file
    size limit; safetensors' "No space left on device") as DiskFull."""
    try:
        yield
    except Exception as e:
        if not is_no_room(e):
            raise
        free = room(folder)
        raise DiskFull(f"no room to write {what} at {folder} ({first_line(e, 200)}; {size(free.free_bytes)} free on "
                       f"{free.mount}): nothing of it was kept; free some space there, or pass "
                       "artifacts_dir=<a disk with room>") from e


def size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
