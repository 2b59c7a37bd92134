"""The vLLM bundle for a GPU machine whose image already has torch but no
network: which vLLM release to carry, how to trim its wheel, and how to split
the bundle into chunks that each fit one transfer and join them again,
verified by sha256.

    python3 scripts/device/bundle.py vllm-for-torch 2.11.0           # from requirements/vllm-torch-pins.tsv
    python3 scripts/device/bundle.py vllm-for-torch 2.11.0 --refresh # re-read the pins from PyPI first
    python3 scripts/device/bundle.py trim WHEEL OUT_WHEEL
    python3 scripts/device/bundle.py split DIR OUT_DIR [--max-mib 60]
    python3 scripts/device/bundle.py receive CHUNK_DIR... --stash DIR
    python3 scripts/device/bundle.py join --stash DIR --into DIR

Standard library only (and `zip` for trim, which runs where the bundle is
prepared): the GPU machine runs receive and join before anything is
installed. Every failure is one line on stderr and exit 2.
"""
import argparse
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PINS = ROOT / "requirements" / "vllm-torch-pins.tsv"
PINS_HEADER = ("vllm", "torch", "torchvision", "read_on")
SIMPLE = "https://pypi.org/simple/vllm/"
# The first release whose pins the table records: older ones pin torch 2.10 or earlier.
OLDEST = (0, 20, 0)
# Members the GPU check never loads, deleted from the wheel without recompressing
# the rest (see docs/hardware.md, "vLLM on the GPU machine"):
# FlashAttention 2 (only sm80 and ALiBi models select it; sm90 runs FlashAttention 3),
# vllm-rs (an optional Rust front end), and DeepGEMM's extension built for the
# Pythons other than the device's.
TRIM = (r"vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so", r"vllm/vllm-rs",
        r"vllm/third_party/deep_gemm/_C\.cpython-3(?!12)\d+-x86_64-linux-gnu\.so")
ARCHIVE = "bundle.tar.gz"
SUMS = "SHA256SUMS"
CHUNK_INFO = "CHUNK.json"


class BundleError(Exception):
    """A failure the user can act on: printed as one line."""


# ------------------------------------------------------------ which vLLM

def read_pins(path: Path = PINS) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if tuple(cells) == PINS_HEADER:
            continue
        rows.append(dict(zip(PINS_HEADER, cells)))
    return rows


def vllm_for_torch(torch: str, rows: list[dict]) -> str:
    """The newest vLLM release that pins exactly this torch (local builds'
    suffixes such as +cu130 ignored): it installs beside that torch and
    replaces nothing."""
    base = torch.split("+")[0]
    matching = [r["vllm"] for r in rows if r["torch"] == base]
    if not matching:
        known = sorted({r["torch"] for r in rows}, key=_version_key)
        raise BundleError(f"no vLLM release in {PINS.relative_to(ROOT)} pins torch=={base} (pinned: "
                          f"{', '.join(known)}); run 'python3 scripts/device/bundle.py vllm-for-torch "
                          f"{base} --refresh' to re-read PyPI, or install a torch from that list")
    return max(matching, key=_version_key)


def refresh_pins(path: Path = PINS) -> list[dict]:
    """Reads each release's torch and torchvision pins from its x86_64
    wheel's METADATA on PyPI, fetching only the zip's directory and that
    member (HTTP ranges), and rewrites the table."""
    index = _get_json(SIMPLE)
    wheels = {}
    for f in index["files"]:
        m = re.fullmatch(r"vllm-([\d.]+)-cp\d+-abi3-manylinux_2_\d+_x86_64\.whl", f["filename"])
        if m and not f.get("yanked") and _version_key(m.group(1)) >= OLDEST:
            wheels[m.group(1)] = f["url"]
    today = time.strftime("%Y-%m-%d")
    rows = []
    for version in sorted(wheels, key=_version_key):
        with zipfile.ZipFile(_RangeReader(wheels[version])) as wheel:
            metadata = wheel.read(f"vllm-{version}.dist-info/METADATA").decode()
        pins = dict(re.findall(r"^Requires-Dist: (torch|torchvision)==([\w.]+)\s*$", metadata, re.M))
        rows.append({"vllm": version, "torch": pins.get("torch", "-"),
                     "torchvision": pins.get("torchvision", "-"), "read_on": today})
        print(f"bundle: vllm {version}: torch=={rows[-1]['torch']}, torchvision=={rows[-1]['torchvision']}",
              file=sys.stderr)
    lines = ["# Which torch each vLLM release pins (Requires-Dist torch==, torchvision== of its",
             "# x86_64 wheel on PyPI), read by `python3 scripts/device/bundle.py vllm-for-torch T --refresh`.",
             "# scripts/setup.sh --plan and scripts/device_check.sh --prepare pick from it.",
             "\t".join(PINS_HEADER)]
    lines += ["\t".join(r[k] for k in PINS_HEADER) for r in rows]
    _write_atomic(path, ("\n".join(lines) + "\n").encode())
    return rows


class _RangeReader(io.RawIOBase):
    """A seekable read-only file over HTTP range requests, enough for
    zipfile to read one member of a remote wheel."""

    def __init__(self, url: str):
        self.url, self.pos = url, 0
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=60) as response:
            self.size = int(response.headers["Content-Length"])

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def read(self, n=-1):
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            data = response.read()
        self.pos += len(data)
        return data

    def readinto(self, buffer):
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _get_json(url: str) -> dict:
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+]", version))


# ------------------------------------------------------------ trimming

def trim_wheel(wheel: Path, out: Path, patterns=TRIM) -> list[str]:
    """Copies `wheel` to `out` without the members matching `patterns`
    (`zip -d`: the other members keep their compressed bytes) and drops them
    from the wheel's RECORD, so pip installs what remains as usual."""
    if shutil.which("zip") is None:
        raise BundleError("trimming a wheel needs Info-ZIP's zip: apt-get install zip")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        record = z.read(record_name).decode()
    removed = [n for n in names if any(re.fullmatch(p, n) for p in patterns)]
    if not removed:
        raise BundleError(f"{wheel.name} has none of the members to trim ({', '.join(patterns)}): "
                          "its layout changed; update TRIM in scripts/device/bundle.py")
    kept_record = "".join(line for line in record.splitlines(keepends=True)
                          if line.split(",", 1)[0] not in removed)
    tmp = out.with_name(out.name + ".tmp")
    shutil.copyfile(wheel, tmp)
    _run(["zip", "-q", "-d", str(tmp), *removed])
    with tempfile.TemporaryDirectory() as staging:
        (Path(staging) / record_name).parent.mkdir(parents=True)
        (Path(staging) / record_name).write_text(kept_record)
        _run(["zip", "-q", str(tmp.resolve()), record_name], cwd=staging)
    tmp.replace(out)
    return removed


def _run(cmd: list[str], cwd=None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise BundleError(f"{' '.join(cmd[:3])} failed: {done.stderr.strip().splitlines()[-1:]}")


# ------------------------------------------------------------ chunks

def split_bundle(src: Path, out: Path, max_mib: float) -> dict:
    """Packs `src` into one gzip'd tar and cuts it into parts of at most
    `max_mib` MiB, one folder per part (`out/chunk-1/`, ...): each folder is
    what one transfer carries, with the sha256 of every part and of the
    whole archive, so any one of them can be checked on arrival."""
    if not src.is_dir():
        raise BundleError(f"{src} is not a folder: run 'bash scripts/device_check.sh --prepare' first")
    limit = int(max_mib * 2**20)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = tmp / ARCHIVE
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(src, arcname=".")
    size = archive.stat().st_size
    count = -(-size // limit)
    parts, whole = [], hashlib.sha256()
    with archive.open("rb") as f:
        for index in range(1, count + 1):
            data = f.read(limit)
            whole.update(data)
            name = f"{ARCHIVE}.part{index}of{count}"
            (tmp / f"chunk-{index}").mkdir()
            (tmp / f"chunk-{index}" / name).write_bytes(data)
            parts.append({"index": index, "name": name, "bytes": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()})
    archive.unlink()
    info = {"archive": ARCHIVE, "bytes": size, "sha256": whole.hexdigest(), "parts": parts,
            "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for part in parts:
        folder = tmp / f"chunk-{part['index']}"
        (folder / CHUNK_INFO).write_text(json.dumps(dict(info, this=part["index"]), indent=1) + "\n")
        (folder / SUMS).write_text("".join(f"{p['sha256']}  {p['name']}\n" for p in parts)
                                   + f"{info['sha256']}  {ARCHIVE}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return info


def receive(chunk_dirs: list[Path], stash: Path) -> dict:
    """Checks each carried chunk against its sha256 and moves it into
    `stash` (outside the work tree, so it outlives the next transfer on a
    warm machine). Returns the stash's state: which parts it holds."""
    stash.mkdir(parents=True, exist_ok=True)
    for folder in chunk_dirs:
        info, part = _chunk_info(folder)
        data_path = folder / part["name"]
        if not data_path.is_file():
            raise BundleError(f"{folder} lacks its part {part['name']} (a broken transfer): carry "
                              f"{folder.name} again")
        if _sha256(data_path) != part["sha256"]:
            raise BundleError(f"{data_path} does not match its sha256 (a broken transfer): carry "
                              f"{folder.name} again")
        _check_same_bundle(stash, info)
        shutil.move(str(data_path), stash / part["name"])
        (stash / CHUNK_INFO).write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
    return stash_state(stash)


def stash_state(stash: Path) -> dict:
    info_path = stash / CHUNK_INFO
    if not info_path.is_file():
        return {"parts": 0, "held": [], "missing": "all"}
    info = json.loads(info_path.read_text())
    held = [p["index"] for p in info["parts"] if (stash / p["name"]).is_file()]
    missing = [p["index"] for p in info["parts"] if p["index"] not in held]
    return {"parts": len(info["parts"]), "held": held, "missing": missing, "sha256": info["sha256"]}


def join(stash: Path, into: Path) -> dict:
    """Concatenates the stash's parts in order, checks every part's and the
    whole archive's sha256 and unpacks it into `into` (replaced whole)."""
    state = stash_state(stash)
    if state["missing"]:
        names = "all chunks" if state["missing"] == "all" else \
            ", ".join(f"chunk-{i}" for i in state["missing"])
        raise BundleError(f"the bundle in {stash} lacks {names} (a machine given back loses what "
                          "earlier calls carried): carry them again, one call after another")
    info = json.loads((stash / CHUNK_INFO).read_text())
    whole = hashlib.sha256()
    tmp = into.with_name(into.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = tmp.parent / (into.name + "." + ARCHIVE)
    with archive.open("wb") as out:
        for part in info["parts"]:
            data = (stash / part["name"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != part["sha256"]:
                raise BundleError(f"{stash / part['name']} does not match its sha256: carry "
                                  f"chunk-{part['index']} again")
            whole.update(data)
            out.write(data)
    if whole.hexdigest() != info["sha256"]:
        raise BundleError(f"the joined archive does not match its sha256 (parts from two "
                          f"preparations?): empty {stash} and carry every chunk again")
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(tmp, filter="data")
    archive.unlink()
    shutil.rmtree(into, ignore_errors=True)
    tmp.replace(into)
    return {"bytes": info["bytes"], "sha256": info["sha256"], "parts": len(info["parts"])}


def _chunk_info(folder: Path) -> tuple[dict, dict]:
    """The chunk's info and the entry of the part it carries."""
    path = folder / CHUNK_INFO
    if not path.is_file():
        raise BundleError(f"{folder} holds no {CHUNK_INFO}: it is not a chunk made by "
                          "'python3 scripts/device/bundle.py split'")
    try:   # a transfer cut short leaves a truncated file
        info = json.loads(path.read_text())
        part = info["parts"][info["this"] - 1]
        if not {"name", "sha256"} <= part.keys() or "sha256" not in info:
            raise KeyError("sha256")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise BundleError(f"{path} is truncated or damaged (a broken transfer): carry {folder.name} again") from None
    return info, part


def _check_same_bundle(stash: Path, info: dict) -> None:
    """Parts of an older preparation in the stash are dropped, not mixed in."""
    old = stash / CHUNK_INFO
    if old.is_file() and json.loads(old.read_text())["sha256"] != info["sha256"]:
        for stale in stash.glob(f"{ARCHIVE}.part*"):
            stale.unlink()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


# ------------------------------------------------------------ command line

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pick = sub.add_parser("vllm-for-torch", help="the newest vLLM release that pins this torch")
    pick.add_argument("torch")
    pick.add_argument("--refresh", action="store_true", help="re-read every release's pins from PyPI first")
    trim = sub.add_parser("trim", help="a copy of a vLLM wheel without what the GPU check never loads")
    trim.add_argument("wheel", type=Path)
    trim.add_argument("out", type=Path)
    split = sub.add_parser("split", help="pack a folder into chunks of at most --max-mib MiB")
    split.add_argument("src", type=Path)
    split.add_argument("out", type=Path)
    split.add_argument("--max-mib", type=float, default=60)
    rec = sub.add_parser("receive", help="check carried chunks and move them into the stash")
    rec.add_argument("chunks", type=Path, nargs="*")
    rec.add_argument("--stash", type=Path, required=True)
    joiner = sub.add_parser("join", help="check the stash's chunks and unpack the bundle")
    joiner.add_argument("--stash", type=Path, required=True)
    joiner.add_argument("--into", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "vllm-for-torch":
            rows = refresh_pins() if args.refresh else read_pins()
            print(vllm_for_torch(args.torch, rows))
        elif args.command == "trim":
            removed = trim_wheel(args.wheel, args.out)
            print(f"bundle: {args.out.name}: {args.wheel.stat().st_size / 2**20:.1f} -> "
                  f"{args.out.stat().st_size / 2**20:.1f} MiB without {len(removed)} members: "
                  f"{', '.join(Path(n).name for n in removed)}")
        elif args.command == "split":
            info = split_bundle(args.src, args.out, args.max_mib)
            sizes = ", ".join(f"{p['bytes'] / 2**20:.1f}" for p in info["parts"])
            print(f"bundle: {args.out}: {len(info['parts'])} chunks ({sizes} MiB), "
                  f"sha256 {info['sha256'][:16]}")
        elif args.command == "receive":
            state = receive(args.chunks, args.stash)
            print(f"bundle: {args.stash} holds part(s) {state['held'] or 'none'} of {state['parts'] or '?'}; "
                  f"missing: {state['missing'] or 'none'}")
        else:
            info = join(args.stash, args.into)
            print(f"bundle: joined {info['parts']} parts ({info['bytes'] / 2**20:.1f} MiB, sha256 "
                  f"{info['sha256'][:16]} verified) into {args.into}")
    except BundleError as e:
        print(f"bundle: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
