"""A cheap fingerprint of a checkpoint's weight files, recorded in the
manifest by `python -m quantize` and recomputed by `python -m evaluate`
before any engine starts, so a manifest is never trusted for weights that
are not the ones it describes.

Per safetensors file: its size, the SHA-256 of its whole header (every
tensor's name, dtype, shape and offsets) and the SHA-256 of BLOCKS blocks of
BLOCK_BYTES at evenly spaced offsets of its data (the whole data when it is
smaller). That is at most 1 MiB read per file whatever its size, so a 14 GB
checkpoint is checked in well under a second from a warm cache
(docs/benchmarks.md). A different model, recipe, calibration or seed changes
the headers or every block; an edit of a few bytes between the samples does
not show: `full` (verify=full) hashes every byte."""
import hashlib
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from quantize.common.provenance import sha256_files

ALGORITHM = "safetensors-sampled-v1"
BLOCKS = 16
BLOCK_BYTES = 64 << 10


@dataclass(frozen=True)
class FileFingerprint:
    bytes: int
    header_sha256: str
    sampled_sha256: str   # the sampled data blocks


@dataclass(frozen=True)
class WeightsFingerprint:
    """The manifest's `weights_fingerprint`."""
    sha256: str                              # over every file's name and FileFingerprint
    files: dict[str, FileFingerprint] = field(default_factory=dict)  # file name -> its part
    full_sha256: str | None = None           # provenance.sha256_files of the weights; None: not computed
    algorithm: str = ALGORITHM

    @property
    def short(self) -> str:
        return self.sha256[:16]

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "sha256": self.sha256, "full_sha256": self.full_sha256,
                "files": {name: vars(f) for name, f in self.files.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "WeightsFingerprint":
        files = {name: FileFingerprint(**f) for name, f in (data.get("files") or {}).items()}
        return cls(sha256=data["sha256"], files=files, full_sha256=data.get("full_sha256"),
                   algorithm=data.get("algorithm", ALGORITHM))

    def differences(self, recorded: "WeightsFingerprint") -> list[str]:
        """What differs in these files from `recorded`, file by file, in words."""
        out = [f"{n} {'is missing' if n not in self.files else 'was not in the manifest'}"
               for n in sorted(set(self.files) ^ set(recorded.files))]
        for name in sorted(set(self.files) & set(recorded.files)):
            mine, theirs = self.files[name], recorded.files[name]
            what = []
            if mine.header_sha256 != theirs.header_sha256:
                what.append("lists other tensors (its safetensors header differs)")
            if mine.bytes != theirs.bytes:
                what.append(f"holds {mine.bytes} bytes, the manifest records {theirs.bytes}")
            elif not what and mine.sampled_sha256 != theirs.sampled_sha256:
                what.append("holds other values (its sampled blocks differ)")
            if what:
                out.append(f"{name} {', '.join(what)}")
        return out


def compute(paths, full: bool = False) -> WeightsFingerprint:
    """The fingerprint of these weight files; `full` adds the SHA-256 of every
    byte (as the artifact id of a plain checkpoint is computed)."""
    files = {Path(p).name: file_fingerprint(Path(p)) for p in sorted(paths, key=lambda p: Path(p).name)}
    h = hashlib.sha256()
    for name, f in files.items():
        h.update(f"{name}\0{f.bytes}\0{f.header_sha256}\0{f.sampled_sha256}\n".encode())
    return WeightsFingerprint(sha256=h.hexdigest(), files=files,
                              full_sha256=sha256_files(paths) if full else None)


def file_fingerprint(path: Path) -> FileFingerprint:
    size = path.stat().st_size
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        head = os.pread(fd, 8, 0)
        # A file too short for its header still gets a fingerprint: the header
        # check (checkpoint.check_weight_files) is what names that problem.
        header_len = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        header_end = min(8 + header_len, size)
        header = hashlib.sha256(os.pread(fd, header_end, 0)).hexdigest()
        sampled = hashlib.sha256()
        for offset in sample_offsets(header_end, size):
            sampled.update(os.pread(fd, min(BLOCK_BYTES, size - offset), offset))
    return FileFingerprint(bytes=size, header_sha256=header, sampled_sha256=sampled.hexdigest())


def sample_offsets(start: int, end: int, blocks: int = BLOCKS, block: int = BLOCK_BYTES) -> list[int]:
    """Where the sampled blocks of the data [start, end) begin: BLOCKS blocks
    from the first byte to the last, evenly spaced; the whole data, block by
    block, when it is no larger than the blocks together."""
    size = end - start
    if size <= 0:
        return []
    if size <= blocks * block:
        return list(range(start, end, block))
    last = end - block
    return [start + (last - start) * i // (blocks - 1) for i in range(blocks)]
