"""quantize/common/fingerprint.py: the weight files' fingerprint the manifest
records and evaluate checks, on real safetensors files."""
import json
import struct

import pytest

from quantize.common import fingerprint
from quantize.common.fingerprint import BLOCK_BYTES, BLOCKS, WeightsFingerprint
from quantize.common.manifest import Manifest
from tests.conftest import sha256_files_by_hand
from tests.quantize.common.test_manifest import OLD_BASELINE


def write_safetensors(path, tensors: dict[str, bytes]) -> None:
    """A real safetensors file of uint8 tensors (name -> their bytes)."""
    header, offset = {}, 0
    for name, data in tensors.items():
        header[name] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(tensors.values()))


@pytest.fixture
def shard(tmp_path):
    """A 4 MiB shard: larger than the sampled blocks together (1 MiB)."""
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"a.weight": bytes(range(256)) * (8 << 10), "b.weight": b"\x07" * (2 << 20)})
    return path


def data_start(path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def flip_byte(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_samples_span_the_data_evenly_from_first_to_last_byte():
    start, end = 100, 100 + 64 * BLOCK_BYTES
    offsets = fingerprint.sample_offsets(start, end)
    assert len(offsets) == BLOCKS and offsets[0] == start and offsets[-1] == end - BLOCK_BYTES
    gaps = {b - a for a, b in zip(offsets, offsets[1:])}
    assert max(gaps) - min(gaps) <= 1 and min(gaps) > BLOCK_BYTES  # even, and not overlapping
    assert fingerprint.sample_offsets(start, end) == offsets  # deterministic


def test_small_data_is_read_whole():
    assert fingerprint.sample_offsets(10, 10 + 3 * BLOCK_BYTES + 5) == [10 + i * BLOCK_BYTES for i in range(4)]
    assert fingerprint.sample_offsets(10, 10) == []


def test_the_fingerprint_is_reproducible_and_reads_at_most_the_blocks(shard):
    fp = fingerprint.compute([shard])
    assert fp == fingerprint.compute([shard])
    assert fp.files["model.safetensors"].bytes == shard.stat().st_size
    assert fp.full_sha256 is None
    assert BLOCKS * BLOCK_BYTES < shard.stat().st_size  # the shard is sampled, not read whole


def test_a_value_in_a_sampled_block_changes_it(shard):
    before = fingerprint.compute([shard])
    flip_byte(shard, fingerprint.sample_offsets(data_start(shard), shard.stat().st_size)[7] + 3)
    after = fingerprint.compute([shard])
    assert after.sha256 != before.sha256
    assert after.differences(before) == ["model.safetensors holds other values (its sampled blocks differ)"]


def test_a_value_between_the_samples_is_seen_only_by_the_full_hash(shard):
    start, end = data_start(shard), shard.stat().st_size
    offsets = fingerprint.sample_offsets(start, end)
    between = offsets[3] + BLOCK_BYTES + 10
    assert between < offsets[4]
    before = fingerprint.compute([shard], full=True)
    flip_byte(shard, between)
    after = fingerprint.compute([shard], full=True)
    assert after.sha256 == before.sha256
    assert after.full_sha256 != before.full_sha256


def test_the_full_hash_is_the_weight_hash_of_the_artifact_id(shard, tmp_path):
    other = tmp_path / "model-2.safetensors"
    write_safetensors(other, {"c.weight": b"\x01" * 100})
    assert fingerprint.compute([other, shard], full=True).full_sha256 == sha256_files_by_hand([shard, other])


def test_renamed_tensor_and_other_size_are_named(shard, tmp_path):
    before = fingerprint.compute([shard])
    shard.write_bytes(shard.read_bytes().replace(b'"b.weight"', b'"c.weight"', 1))
    assert fingerprint.compute([shard]).differences(before) == [
        "model.safetensors lists other tensors (its safetensors header differs)"]
    shard.write_bytes(shard.read_bytes() + b"\x00" * 8)  # same header, longer file
    assert fingerprint.compute([shard]).differences(before) == [
        "model.safetensors lists other tensors (its safetensors header differs), "
        f"holds {shard.stat().st_size} bytes, the manifest records {before.files['model.safetensors'].bytes}"]
    write_safetensors(shard, {"a.weight": bytes(range(256)) * (8 << 10), "b.weight": b"\x07" * (2 << 20)})
    shard.write_bytes(shard.read_bytes() + b"\x00" * 8)
    assert fingerprint.compute([shard]).differences(before) == [
        f"model.safetensors holds {shard.stat().st_size} bytes, the manifest records {before.files['model.safetensors'].bytes}"]
    extra = tmp_path / "model-2.safetensors"
    write_safetensors(extra, {"c.weight": b"\x01"})
    assert "model-2.safetensors was not in the manifest" in fingerprint.compute([shard, extra]).differences(before)
    assert fingerprint.compute([extra]).differences(before)[:2] == ["model-2.safetensors was not in the manifest",
                                                                    "model.safetensors is missing"]


def test_a_file_shorter_than_its_header_still_gets_a_fingerprint(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x05\x00")
    assert fingerprint.compute([path]).files["model.safetensors"].bytes == 2


def test_the_manifest_round_trips_its_fingerprint(shard):
    fp = fingerprint.compute([shard], full=True)
    m = Manifest.from_dict(OLD_BASELINE | {"weights_fingerprint": fp.to_dict()})
    assert m.weights_fingerprint == fp
    again = Manifest.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.weights_fingerprint == fp and again.to_dict() == m.to_dict()
    assert WeightsFingerprint.from_dict(fp.to_dict()) == fp


def test_a_manifest_without_a_fingerprint_writes_back_without_one():
    m = Manifest.from_dict(OLD_BASELINE)
    assert m.weights_fingerprint is None and "weights_fingerprint" not in m.to_dict()
