"""scripts/device/bundle.py: which vLLM pins a torch, the trimmed wheel, and
the chunks a bundle travels in (split, received one call at a time, joined and
verified), as the GPU machine runs them."""
import hashlib
import http.server
import json
import random
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts" / "device"))
import bundle  # noqa: E402  (a script folder, not a package)

SCRIPT = ROOT / "scripts" / "device" / "bundle.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------- which vLLM

def test_the_recorded_pins_give_the_newest_vllm_for_each_torch():
    rows = bundle.read_pins()
    assert bundle.vllm_for_torch("2.11.0", rows) == "0.26.0"
    assert bundle.vllm_for_torch("2.11.0+cu130", rows) == "0.26.0"   # the GPU image's local build suffix
    assert bundle.vllm_for_torch("2.13.0", rows) == "0.32.0"
    for row in rows:   # the table is what each wheel's METADATA said: one torch per release
        assert row["torch"] and row["vllm"] and row["read_on"]


def test_a_torch_no_release_pins_is_one_line_naming_the_pinned_ones():
    proc = run("vllm-for-torch", "2.9.9")
    assert proc.returncode == 2 and proc.stdout == ""
    line, = proc.stderr.strip().splitlines()
    assert line.startswith("bundle: no vLLM release in requirements/vllm-torch-pins.tsv pins torch==2.9.9")
    assert "2.11.0" in line and "--refresh" in line


def test_the_newest_of_several_matching_releases_wins_by_version_not_text():
    rows = [{"vllm": v, "torch": "2.11.0"} for v in ("0.9.2", "0.26.0", "0.20.1")]
    assert bundle.vllm_for_torch("2.11.0", rows) == "0.26.0"


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with HTTP Range support, as PyPI's file host does."""

    def do_GET(self):
        data = Path(self.translate_path(self.path)).read_bytes()
        start, _, end = self.headers["Range"].removeprefix("bytes=").partition("-")
        part = data[int(start):int(end) + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)

    def log_message(self, *args):
        pass


def test_a_remote_wheels_metadata_is_read_through_http_ranges_alone(tmp_path):
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/big.so", bytes(2_000_000))
        z.writestr("vllm-9.9.9.dist-info/METADATA", "Requires-Dist: torch==2.11.0\n")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: _RangeHandler(*a, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reader = bundle._RangeReader(f"http://127.0.0.1:{server.server_port}/{wheel.name}")
        with zipfile.ZipFile(reader) as z:
            assert z.read("vllm-9.9.9.dist-info/METADATA") == b"Requires-Dist: torch==2.11.0\n"
    finally:
        server.shutdown()
    assert reader.size == wheel.stat().st_size


# ---------------------------------------------------------------- trimming

def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    dist = "vllm-9.9.9.dist-info"
    files = dict(members, **{f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n",
                             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-linux_x86_64\n"})
    record = "".join(f"{name},sha256={hashlib.sha256(data).hexdigest()},{len(data)}\n" for name, data in files.items())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/RECORD", record + f"{dist}/RECORD,,\n")
    return path


def test_trimming_drops_the_unloaded_libraries_and_their_record_lines_and_pip_installs_the_rest(tmp_path):
    wheel = make_wheel(tmp_path / "vllm-9.9.9-cp38-abi3-linux_x86_64.whl", {
        "vllm/__init__.py": b"VERSION = 1\n", "vllm/_C_stable_libtorch.abi3.so": b"kept" * 1000,
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2" * 1000, "vllm/vllm-rs": b"rust",
        "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": b"312",
        "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so": b"313"})
    out = tmp_path / "trimmed" / wheel.name
    out.parent.mkdir()
    proc = run("trim", str(wheel), str(out))
    assert proc.returncode == 0, proc.stderr
    assert "without 3 members: " in proc.stdout
    with zipfile.ZipFile(out) as z, zipfile.ZipFile(wheel) as original:
        names = set(z.namelist())
        assert names == set(original.namelist()) - {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs",
                                                    "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so"}
        record = z.read("vllm-9.9.9.dist-info/RECORD").decode()
        assert "fa2" not in record and "vllm-rs" not in record and "cpython-313" not in record
        assert "cpython-312" in record
        for name in names - {"vllm-9.9.9.dist-info/RECORD"}:   # the rest byte for byte
            assert z.read(name) == original.read(name)
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                          "--target", str(site), str(out)], capture_output=True, text=True, timeout=120)
    assert pip.returncode == 0, pip.stderr
    assert (site / "vllm" / "_C_stable_libtorch.abi3.so").read_bytes() == b"kept" * 1000
    assert not (site / "vllm" / "vllm-rs").exists()


def test_a_wheel_without_the_members_to_trim_is_one_line_saying_its_layout_changed(tmp_path):
    wheel = make_wheel(tmp_path / "vllm-9.9.9-cp38-abi3-linux_x86_64.whl", {"vllm/__init__.py": b""})
    proc = run("trim", str(wheel), str(tmp_path / "out.whl"))
    assert proc.returncode == 2
    assert "its layout changed; update TRIM in scripts/device/bundle.py" in proc.stderr
    assert not (tmp_path / "out.whl").exists()


# ---------------------------------------------------------------- chunks

@pytest.fixture
def chunks(tmp_path) -> tuple[Path, Path]:
    """A 2.5 MiB bundle (incompressible wheels, a compressible text) cut at 1 MiB."""
    src = tmp_path / "bundle"
    (src / "wheels").mkdir(parents=True)
    noise = random.Random(0)   # wheels are compressed already: gzip leaves them as they are
    (src / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(noise.randbytes(1_300_000))
    (src / "wheels" / "b-2.0-py3-none-any.whl").write_bytes(noise.randbytes(1_000_000))
    (src / "cache").mkdir()
    (src / "cache" / "novel.txt").write_text("It is a truth universally acknowledged. " * 2000)
    proc = run("split", str(src), str(tmp_path / "chunks"), "--max-mib", "1")
    assert proc.returncode == 0, proc.stderr
    return src, tmp_path / "chunks"


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_bundle_travels_in_chunks_received_one_call_at_a_time_and_joins_to_the_same_files(chunks, tmp_path):
    src, out = chunks
    folders = sorted(out.iterdir())
    assert [f.name for f in folders] == ["chunk-1", "chunk-2", "chunk-3"]
    for folder in folders:   # what one transfer carries: a part, its info and every part's sha256
        part, = folder.glob("bundle.tar.gz.part*")
        assert part.stat().st_size <= 2**20
        assert {p.name for p in folder.iterdir()} == {part.name, "CHUNK.json", "SHA256SUMS"}
    stash = tmp_path / "stash"
    for folder in reversed(folders):   # any order, one call each
        proc = run("receive", str(folder), "--stash", str(stash))
        assert proc.returncode == 0, proc.stderr
        assert not folder.exists()
    assert "holds part(s) [1, 2, 3] of 3; missing: none" in proc.stdout
    proc = run("join", "--stash", str(stash), "--into", str(tmp_path / "joined"))
    assert proc.returncode == 0, proc.stderr
    assert tree(tmp_path / "joined") == tree(src)


def test_joining_with_a_chunk_missing_names_the_chunks_to_carry_again(chunks, tmp_path):
    _, out = chunks
    stash = tmp_path / "stash"
    assert run("receive", str(out / "chunk-2"), "--stash", str(stash)).returncode == 0
    proc = run("join", "--stash", str(stash), "--into", str(tmp_path / "joined"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"bundle: the bundle in {stash} lacks chunk-1, chunk-3 (a machine given back loses what earlier calls "
        "carried): carry them again, one call after another"]
    assert not (tmp_path / "joined").exists()


def test_a_chunk_damaged_in_transfer_is_refused_on_arrival(chunks, tmp_path):
    _, out = chunks
    part, = (out / "chunk-2").glob("bundle.tar.gz.part*")
    data = bytearray(part.read_bytes())
    data[1000] ^= 0xFF
    part.write_bytes(bytes(data))
    proc = run("receive", str(out / "chunk-2"), "--stash", str(tmp_path / "stash"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"bundle: {part} does not match its sha256 (a broken transfer): carry chunk-2 again"
    assert not list((tmp_path / "stash").glob("bundle.tar.gz.part*"))


@pytest.mark.parametrize("damage", ["part-missing", "info-truncated"])
def test_a_chunk_cut_short_in_transfer_is_one_line_naming_the_chunk_to_carry_again(chunks, tmp_path, damage):
    _, out = chunks
    folder = out / "chunk-2"
    if damage == "part-missing":
        part, = folder.glob("bundle.tar.gz.part*")
        part.unlink()
    else:
        info = folder / "CHUNK.json"
        info.write_text(info.read_text()[:40])
    proc = run("receive", str(folder), "--stash", str(tmp_path / "stash"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bundle: ") and lines[0].endswith("carry chunk-2 again")
    assert not list((tmp_path / "stash").glob("bundle.tar.gz.part*"))


def test_parts_of_an_older_preparation_are_dropped_not_mixed_in(chunks, tmp_path):
    src, out = chunks
    stash = tmp_path / "stash"
    assert run("receive", str(out / "chunk-1"), "--stash", str(stash)).returncode == 0
    (src / "cache" / "novel.txt").write_text("Another bundle altogether. " * 3000)
    assert run("split", str(src), str(tmp_path / "new"), "--max-mib", "1").returncode == 0
    proc = run("receive", str(tmp_path / "new" / "chunk-2"), "--stash", str(stash))
    assert proc.returncode == 0, proc.stderr
    assert "holds part(s) [2] of 3; missing: [1, 3]" in proc.stdout
    info = json.loads((stash / "CHUNK.json").read_text())
    assert info["sha256"] == json.loads((tmp_path / "new" / "chunk-1" / "CHUNK.json").read_text())["sha256"]
