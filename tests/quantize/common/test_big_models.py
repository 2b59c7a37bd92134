"""Big models: the memory check before loading, the streaming weight hash, and
`model=<hub owner/name>` (offline: one line; online: safetensors only)."""
import fnmatch
import hashlib
import json
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.conftest import SMALL_CALIB, last_line, quantize_cmd, quantize_env, run_quantize, sha256_files_by_hand
from quantize.common import hub, memory_check, provenance
from quantize.common.config import expand_path_shorthands
from quantize.common.errors import UserError
from quantize.common.memory_check import CPU_HEADROOM, GPU_HEADROOM, FreeMemory

GiB = 2**30
HIDDEN, MLP, LAYERS, VOCAB = 64, 256, 3, 100


def llama_tensors(bigger_layer: int | None = None) -> dict[str, np.ndarray]:
    """A Llama's tensor names and shapes in bf16-sized float16 (2 bytes each);
    `bigger_layer` gets a double-width MLP, so it is the largest."""
    out = {"model.embed_tokens.weight": np.zeros((VOCAB, HIDDEN), np.float16),
           "model.norm.weight": np.zeros((HIDDEN,), np.float16)}
    for i in range(LAYERS):
        mlp = MLP * 2 if i == bigger_layer else MLP
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": np.zeros((HIDDEN,), np.float16),
                p + "self_attn.q_proj.weight": np.zeros((HIDDEN, HIDDEN), np.float16),
                p + "mlp.up_proj.weight": np.zeros((mlp, HIDDEN), np.float16),
                p + "mlp.down_proj.weight": np.zeros((HIDDEN, mlp), np.float16)}
    return out


def write_checkpoint(d: Path, tensors: dict, shards: int = 2) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    for i in range(shards):
        save_file({n: tensors[n] for n in names[i::shards]}, str(d / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"))
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "dtype": "bfloat16"}))
    return d


def layer_params(mlp: int) -> int:
    return HIDDEN + HIDDEN * HIDDEN + 2 * mlp * HIDDEN


# --- the memory check ------------------------------------------------------

def test_footprint_sums_the_headers_at_the_held_dtype(tmp_path):
    model = write_checkpoint(tmp_path / "m", llama_tensors(bigger_layer=1))
    params = VOCAB * HIDDEN + HIDDEN + 2 * layer_params(MLP) + layer_params(2 * MLP)
    bf16 = memory_check.footprint(model, "bfloat16")
    fp32 = memory_check.footprint(model, "float32", hessians=True)
    assert (bf16.params, bf16.weight_bytes) == (params, 2 * params)
    assert fp32.weight_bytes == 4 * params  # cast for calibration on a CPU without native bf16
    assert bf16.layer == "model.layers.1" and bf16.layer_bytes == 2 * layer_params(2 * MLP)
    assert bf16.layer_hessian_bytes == 0
    # GPTQ: one float32 in x in Hessian per Linear (q and up read HIDDEN, down reads the MLP width)
    assert fp32.layer_hessian_bytes == 4 * (2 * HIDDEN**2 + (2 * MLP) ** 2)


def test_integer_tensors_keep_their_stored_width(tmp_path):
    tensors = llama_tensors() | {"model.layers.0.mlp.up_proj.weight_packed": np.zeros((MLP, HIDDEN // 8), np.int32)}
    model = write_checkpoint(tmp_path / "m", tensors)
    plain = memory_check.footprint(write_checkpoint(tmp_path / "p", llama_tensors()), "float32")
    assert memory_check.footprint(model, "float32").weight_bytes == plain.weight_bytes + MLP * HIDDEN // 8 * 4


def one_line_error(fn) -> str:
    with pytest.raises(UserError) as e:
        fn()
    message = str(e.value)
    assert "\n" not in message and len(message) < 600
    return message


def test_too_little_ram_is_one_line_naming_size_free_and_fix(tmp_path):
    model = write_checkpoint(tmp_path / "big-llama", llama_tensors())
    need = memory_check.footprint(model, "bfloat16").weight_bytes + CPU_HEADROOM
    message = one_line_error(lambda: memory_check.check(
        model, "bfloat16", on_gpu=False, hessians=False, free=FreeMemory(ram_bytes=need - 1)))
    for words in ("big-llama", "B parameters", "in bfloat16", f"{need / GiB:.1f} GiB of memory",
                  f"{(need - 1) / GiB:.1f} GiB is free", "more memory", "fewer jobs", "memory_check=false"):
        assert words in message, message
    assert memory_check.check(model, "bfloat16", on_gpu=False, hessians=False,
                              free=FreeMemory(ram_bytes=need)).weight_bytes == need - CPU_HEADROOM


def test_hessians_count_in_ram_on_the_cpu_and_on_the_gpu_there(tmp_path):
    model = write_checkpoint(tmp_path / "m", llama_tensors())
    need = memory_check.footprint(model, "float32", hessians=True)
    just_weights = FreeMemory(ram_bytes=need.weight_bytes + CPU_HEADROOM, gpu_bytes=100 * GiB)
    one_line_error(lambda: memory_check.check(model, "float32", on_gpu=False, hessians=True, free=just_weights))
    memory_check.check(model, "float32", on_gpu=True, hessians=True, free=just_weights)


def test_too_little_gpu_memory_names_the_largest_layer_and_the_gpu(tmp_path):
    model = write_checkpoint(tmp_path / "m", llama_tensors(bigger_layer=2))
    need = memory_check.footprint(model, "bfloat16", hessians=True)
    assert need.gpu_need == need.layer_bytes + need.layer_hessian_bytes + GPU_HEADROOM
    free = FreeMemory(ram_bytes=100 * GiB, gpu_bytes=need.gpu_need - 1, gpu_name="NVIDIA H200")
    message = one_line_error(lambda: memory_check.check(model, "bfloat16", on_gpu=True, hessians=True, free=free))
    for words in ("largest layer model.layers.2", "of Hessians", "NVIDIA H200", "free", "GPU with more memory"):
        assert words in message, message
    # the same free GPU memory is not asked when calibration runs on the CPU
    memory_check.check(model, "bfloat16", on_gpu=False, hessians=True, free=free)


def test_the_cgroup_limit_caps_free_ram(tmp_path, monkeypatch):
    limit, usage, stat = tmp_path / "memory.max", tmp_path / "memory.current", tmp_path / "memory.stat"
    limit.write_text(str(8 * GiB))
    usage.write_text(str(5 * GiB))
    stat.write_text(f"anon 1\ninactive_file {1 * GiB}\n")  # page cache the kernel reclaims first
    monkeypatch.setattr(memory_check, "CGROUP_FILES", ((str(limit), str(usage), str(stat), "inactive_file"),))
    assert memory_check._cgroup_room() == 4 * GiB
    limit.write_text("max")
    assert memory_check._cgroup_room() is None


def test_quantize_refuses_before_loading_anything(tiny_model, tmp_path, monkeypatch):
    """The pipeline checks right after the cheap input checks: no tokenizer,
    no calibration set, no weight hash, nothing written."""
    from hydra import compose, initialize_config_dir

    from quantize import pipeline
    from quantize.common.config import register
    from quantize.common.extensions import plain
    from quantize.config import QuantizeConfig
    from quantize.common.paths import CONF_DIR
    register()
    arts = tmp_path / "artifacts"
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("quantize", overrides=["recipe=w4a16_gptq", "model=local", f"model.path={tiny_model}",
                                             *SMALL_CALIB, f"artifacts_dir={arts}"])
    monkeypatch.setattr(memory_check, "free_memory", lambda gpu: FreeMemory(ram_bytes=1 * GiB, gpu_bytes=GiB))
    for late in ("_load_tokenizer", "_load_model", "sha256_files"):
        monkeypatch.setattr(pipeline, late, lambda *a, late=late: pytest.fail(f"{late} ran before the memory check"))
    config = QuantizeConfig.from_config(plain(cfg))  # as the CLI's entry converts it
    message = one_line_error(lambda: pipeline.run(config))
    assert "tiny-llama" in message and "1.0 GiB is free" in message
    assert not arts.exists()


def test_the_tiny_model_quantizes_with_the_check_on(tiny_model, tmp_path, workdir):
    """The real free memory of this machine, the default memory_check=true: the
    normal path runs as before, and the log says what was checked."""
    arts = tmp_path / "artifacts"
    proc = run_quantize("recipe=w4a16_gptq", f"model={tiny_model}", *SMALL_CALIB, f"artifacts_dir={arts}",
                        cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (arts / "tiny-llama" / "w4a16_gptq" / "manifest.json").is_file()
    assert "memory: " in proc.stdout + proc.stderr and "fits" in proc.stdout + proc.stderr


# --- the weight hash -------------------------------------------------------

def test_the_weight_hash_streams_with_the_same_digest(tmp_path, monkeypatch):
    files = []
    for name, size in (("b.safetensors", 5 * 2**20 + 3), ("a.safetensors", 7), ("c.safetensors", 0)):
        (tmp_path / name).write_bytes(np.random.default_rng(len(name) + size).bytes(size))
        files.append(tmp_path / name)
    want = sha256_files_by_hand(files)
    assert provenance.sha256_files(reversed(files)) == want
    monkeypatch.setattr(provenance, "HASH_BLOCK", 4096 + 1)  # blocks that straddle the files' ends
    assert provenance.sha256_files(files) == want


def test_the_weight_hash_holds_one_block_not_the_file(tmp_path):
    big = tmp_path / "model.safetensors"
    with open(big, "wb") as f:
        for _ in range(8):
            f.write(b"\x01" * (8 * 2**20))  # 64 MiB
    tracemalloc.start()
    try:
        digest = provenance.sha256_files([big])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < provenance.HASH_BLOCK + 2**20 < big.stat().st_size
    h = hashlib.sha256(b"model.safetensors\0")
    h.update(b"\x01" * (64 * 2**20))
    assert digest == h.hexdigest()


# --- model=<hub owner/name> --------------------------------------------------

@pytest.mark.parametrize("value, repo", [
    ("meta-llama/Llama-3.1-8B", True), ("Qwen/Qwen3-0.6B", True), ("org/name.v2", True),
    ("/abs/org/name", False), ("./org/name", False), ("~/org/name", False), ("a/b/c", False),
    ("smollm2_135m", False), ("../name", False)])
def test_hub_ids_are_owner_slash_name(value, repo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.is_repo_id(value) is repo


def test_a_local_dir_wins_over_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert expand_path_shorthands(["model=org/name"]) == ["model=local", "model.path=org/name"]
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert expand_path_shorthands(["model=org/name"]) == ["model=local", f"model.path={tmp_path / 'org' / 'name'}"]


class FakeHub:
    """snapshot_download's stand-in: records each call and lays out a snapshot
    dir holding the repo's files that match the patterns."""

    REPO_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                  "model-00002-of-00002.safetensors", "consolidated.safetensors", "pytorch_model.bin",
                  "model.gguf", "training_args.pt", "modeling_custom.py", "README.md"]

    def __init__(self, root: Path, sharded: bool = True):
        self.snapshot, self.calls = root / "snapshots" / "0123abcd", []
        self.files = self.REPO_FILES if sharded else [f for f in self.REPO_FILES if "-of-" not in f and
                                                         "index" not in f] + ["model.safetensors"]

    def __call__(self, repo_id, revision, patterns):
        self.calls.append((repo_id, revision, list(patterns)))
        self.snapshot.mkdir(parents=True, exist_ok=True)
        for name in self.files:
            if any(fnmatch.fnmatch(name, p) for p in patterns):
                text = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                  "b": "model-00002-of-00002.safetensors"}}) if "index" in name else ""
                (self.snapshot / name).write_text(text)
        return str(self.snapshot)


@pytest.mark.parametrize("sharded", [True, False])
def test_the_download_takes_the_checkpoints_safetensors_only(sharded, tmp_path, monkeypatch):
    fake = FakeHub(tmp_path, sharded)
    monkeypatch.setattr(hub, "_snapshot", fake)
    assert hub.download("org/name") == fake.snapshot
    got = sorted(p.name for p in fake.snapshot.iterdir())
    weights = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] if sharded \
        else ["model.safetensors"]
    assert [n for n in got if n.endswith(".safetensors")] == weights  # no second consolidated copy
    assert not [n for n in got if n.endswith((".bin", ".pt", ".gguf", ".py", ".md"))]
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(got)
    (_, first_revision, _), (_, revision, patterns) = fake.calls
    assert first_revision is None and revision == "0123abcd" and patterns == weights  # the weights at the same commit


def test_a_missing_repo_is_one_line(tmp_path, monkeypatch):
    from huggingface_hub.errors import RepositoryNotFoundError

    import httpx
    url = "https://huggingface.co/api/models/org/nope/revision/main"

    def missing(*_):
        raise RepositoryNotFoundError("404 Client Error: Repository Not Found",
                                      response=httpx.Response(404, request=httpx.Request("GET", url)))
    monkeypatch.setattr(hub, "_snapshot", missing)
    message = one_line_error(lambda: hub.download("org/nope"))
    assert "no repo org/nope" in message and "hf auth login" in message


def quantize_offline(*overrides: str, hf_home: Path, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI with the hub offline and its cache at `hf_home`."""
    return subprocess.run(quantize_cmd(*overrides), cwd=cwd, capture_output=True, text=True,
                          env=quantize_env({"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}), timeout=600)


def test_a_hub_id_offline_is_one_line_naming_the_fix(tmp_path, workdir):
    arts = tmp_path / "artifacts"
    proc = quantize_offline("recipe=original", "model=some-org/some-model", f"artifacts_dir={arts}",
                            hf_home=tmp_path / "empty-hf-cache", cwd=workdir)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    line = last_line(proc.stderr)
    assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [line]
    for words in ("some-org/some-model", "no local dir", "HF_HUB_OFFLINE=1", "hf download some-org/some-model",
                  "model=DIR"):
        assert words in line, line
    assert not arts.exists()


def test_a_hub_model_in_the_cache_quantizes_offline(tiny_model, tmp_path, workdir):
    """Downloaded once (here: laid out as the hub cache does), a hub id works
    without the hub, and the manifest points at the snapshot it used."""
    commit = "0" * 40
    repo = tmp_path / "hf" / "hub" / "models--some-org--tiny"
    shutil.copytree(tiny_model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    arts = tmp_path / "artifacts"
    proc = quantize_offline("recipe=original", "model=some-org/tiny", f"artifacts_dir={arts}",
                            hf_home=tmp_path / "hf", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((arts / "tiny" / "original" / "manifest.json").read_text())
    assert manifest["model"]["path"] == str(repo / "snapshots" / commit)
    assert manifest["model"]["weights_sha256"] == sha256_files_by_hand(tiny_model.glob("*.safetensors"))
