"""scripts/device/rules_vs_observed.py on the GPU runs stored in
docs/device-runs (an H100's and two H200's): the rule for the machine and vLLM
the rows record, against what each start did, from the folder alone (no weights)."""
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "device-runs" / "2026-11-27-h100"
H200_RUN = ROOT / "docs" / "device-runs" / "2026-11-28-h200"
H200_SPARSE_RUN = ROOT / "docs" / "device-runs" / "2026-11-29-h200"
spec = importlib.util.spec_from_file_location("rules_vs_observed", ROOT / "scripts" / "device" / "rules_vs_observed.py")
rules_vs_observed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rules_vs_observed)


@pytest.fixture
def run(tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(RUN, copy)
    return copy


def edit_rows(run: Path, recipe: str, **changes) -> None:
    """Change every row of `recipe` in the stored results."""
    store = run / "results" / "results.jsonl"
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    store.write_text("".join(json.dumps(r | changes if r["recipe"] == recipe else r) + "\n" for r in rows))


def by_artifact(run: Path) -> dict[str, dict]:
    return {r["artifact"]: r for r in rules_vs_observed.compare(run)}


def test_the_h100_run_agrees_with_the_0_26_rules_and_names_the_kernels_vllm_picked(run):
    rows = by_artifact(run)
    assert set(rows) == {"llama-1b-random", "llama-1b-random/w8a8_smooth_gptq", "llama-1b-random/w4a16_gptq"}
    assert all(r["agree"] is True and r["rules_of"] == "0.26.0" for r in rows.values())
    assert "sm90" in rows["llama-1b-random"]["machine"] and "H100" in rows["llama-1b-random"]["machine"]
    assert rows["llama-1b-random/w4a16_gptq"]["rule"].startswith("yes, bfloat16 (Machete")
    assert rows["llama-1b-random/w4a16_gptq"]["kernels"].startswith("MacheteLinearKernel (CompressedTensorsWNA16)")
    assert "CutlassInt8ScaledMMLinearKernel" in rows["llama-1b-random/w8a8_smooth_gptq"]["kernels"]
    assert rules_vs_observed.main([str(run)]) == 0
    assert "| llama-1b-random/w8a8_smooth_gptq | W8A8 int8 | eager | yes, bfloat16 |" in (run / "rules.md").read_text()


@pytest.fixture
def h200_run(tmp_path) -> Path:
    copy = tmp_path / "h200"
    shutil.copytree(H200_RUN, copy)
    return copy


def test_the_h200_run_agrees_and_its_fp8_kv_cache_took_one_byte_per_value(h200_run):
    rows = by_artifact(h200_run)
    assert all(r["agree"] is True and "H200" in r["machine"] for r in rows.values())
    assert {a: r["kv_bytes_per_value"] for a, r in rows.items()} == {
        "llama-1b-random": 2.0, "llama-1b-random/fp8_dynamic": 2.0, "llama-1b-random/w8a16_awq": 2.0,
        "llama-1b-random/w8a8_kv8": 1.0}
    assert rows["llama-1b-random/w8a8_kv8"]["format"] == "W8A8 int8 + fp8 KV"
    assert "CutlassFP8ScaledMMLinearKernel" in rows["llama-1b-random/fp8_dynamic"]["kernels"]


def test_the_2_4_run_agrees_eager_and_with_cuda_graphs_each_from_its_own_start(tmp_path):
    """The 2:4 W8A8 checkpoint and the original, each started eager and with CUDA
    graphs: four rows, each with the kernels its own step logged (CUTLASS int8 for
    the 2:4 zeros computed dense, as 0.26.0's rule says: it has no 2:4 sparse kernel)."""
    run = tmp_path / "sparse"
    shutil.copytree(H200_SPARSE_RUN, run)
    rows = rules_vs_observed.compare(run)
    assert [(r["artifact"], r["mode"]) for r in rows] == [
        (a, m) for a in ("llama-1b-random", "llama-1b-random/w8a8_sparse_smooth_gptq") for m in ("eager", "CUDA graphs")]
    assert all(r["agree"] is True and "H200" in r["machine"] and r["kv_bytes_per_value"] == 2.0 for r in rows)
    sparse = [r for r in rows if r["format"] == "W8A8 int8 2:4"]
    assert len(sparse) == 2 and all("no 2:4 sparse kernel" in r["rule"] for r in sparse)
    assert all(r["kernels"].startswith("CutlassInt8ScaledMMLinearKernel (CompressedTensorsW8A8Int8)") for r in sparse)
    assert rules_vs_observed.main([str(run)]) == 0
    assert (run / "rules.json").read_text() == (H200_SPARSE_RUN / "rules.json").read_text()


def test_an_fp8_kv_scheme_stored_at_two_bytes_per_value_is_a_mismatch(h200_run):
    """vLLM's engine args say `kv_cache_dtype: auto` either way: only the cache's size shows the scheme was not used."""
    log = h200_run / "steps" / "vllm_1b_w8a8_kv8.log"
    log.write_text(log.read_text().replace("8,150,560 tokens", "4,075,280 tokens"))
    row = by_artifact(h200_run)["llama-1b-random/w8a8_kv8"]
    assert row["agree"] is False and row["kv_bytes_per_value"] == 2.0
    assert row["observed"].endswith("its fp8 KV cache took 2.0 bytes per value, not 1")
    assert rules_vs_observed.main([str(h200_run)]) == 1


def test_an_fp8_kv_cache_asked_for_in_the_engine_args_is_checked_too(h200_run):
    """engine.args.kv_cache_dtype=fp8 on a checkpoint without a KV scheme: its start
    must also cache one byte per value (the stored log took two)."""
    store = h200_run / "results" / "results.jsonl"
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    store.write_text("".join(json.dumps(r | {"engine_args": r["engine_args"] | {"kv_cache_dtype": "fp8_e4m3"}}
                                        if r["recipe"] == "w8a16_awq" else r) + "\n" for r in rows))
    row = by_artifact(h200_run)["llama-1b-random/w8a16_awq"]
    assert row["agree"] is False and row["observed"].endswith("its fp8_e4m3 KV cache took 2.0 bytes per value, not 1")
    assert by_artifact(h200_run)["llama-1b-random/fp8_dynamic"]["agree"] is True


def test_a_log_without_the_kv_cache_lines_leaves_the_kv_cache_unchecked(h200_run):
    log = h200_run / "steps" / "vllm_1b_w8a8_kv8.log"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines() if "KV cache" not in line))
    row = by_artifact(h200_run)["llama-1b-random/w8a8_kv8"]
    assert row["kv_bytes_per_value"] is None and row["agree"] is True


def test_each_checkpoint_names_the_kernels_of_its_own_shapes_start(run):
    """An 8B run beside the 1B one in the same folder: each artifact reads its own step's log."""
    (run / "steps" / "vllm_8b_w4a16_gptq.log").write_text(
        "INFO [__init__.py:231] Using MarlinLinearKernel for CompressedTensorsWNA16\n")
    assert by_artifact(run)["llama-1b-random/w4a16_gptq"]["kernels"].startswith("MacheteLinearKernel")
    assert "Marlin" not in by_artifact(run)["llama-1b-random/w4a16_gptq"]["kernels"]


def test_a_start_the_rule_refuses_is_a_mismatch(run):
    """The same rows, recorded on an sm75 GPU: vLLM runs bfloat16 from sm80, so a bf16 start there contradicts the rule."""
    store = run / "results" / "results.jsonl"
    machine = json.loads(store.read_text().splitlines()[0])["machine"] | {"cuda": [[7, 5]]}
    edit_rows(run, "w4a16_gptq", machine=machine)
    row = by_artifact(run)["llama-1b-random/w4a16_gptq"]
    assert row["rule"].startswith("no: vLLM runs bfloat16 only from compute capability 8.0 (sm75 here)") and row["agree"] is False
    assert rules_vs_observed.main([str(run)]) == 1
    assert "**MISMATCH**" in (run / "rules.md").read_text()


def test_a_failed_start_the_rule_allowed_is_a_mismatch(run):
    edit_rows(run, "w8a8_smooth_gptq", status="failed", reason="engine: CUDA error: no kernel image")
    row = by_artifact(run)["llama-1b-random/w8a8_smooth_gptq"]
    assert row["observed"] == "failed: engine: CUDA error: no kernel image" and row["agree"] is False


def test_a_checkpoint_without_vllm_rows_is_not_checked(run):
    edit_rows(run, "w4a16_gptq", engine="hf")
    row = by_artifact(run)["llama-1b-random/w4a16_gptq"]
    assert row["agree"] is None and row["observed"] == "not served in this check (no vLLM rows)"


def test_cpu_rows_are_judged_with_the_kernel_library_they_record(run):
    """Rows from a CPU record which vLLM-CPU kernels it had: an AVX2 build has no int4 kernel, so W4A16 rows
    that ran there would contradict the rule (and the refusal rows such a host writes would not)."""
    avx2 = {"arch": "x86_64", "isa": ["avx2"], "cuda": [], "vllm_installed": True, "vllm_library": "_C_AVX2",
            "vllm_ops": ["onednn_scaled_mm"], "fp8_gemm": None, "numa_nodes": 1}
    edit_rows(run, "w4a16_gptq", machine=avx2, hardware={"accelerators": []}, engine_args={"dtype": "bfloat16"})
    row = by_artifact(run)["llama-1b-random/w4a16_gptq"]
    assert row["rule"].startswith("no: vLLM-CPU's kernel library here (_C_AVX2) has no int4") and row["agree"] is False
    edit_rows(run, "w4a16_gptq", status="unsupported", reason=row["rule"].removeprefix("no: "), engine_version=None)
    row = by_artifact(run)["llama-1b-random/w4a16_gptq"]
    assert row["observed"] == "refused before a start (no runs)" and row["agree"] is None
    assert row["engine_version"] == "0.26.0"   # from the row's versions: a refusal starts no engine


def add_compiled_rows(run: Path, recipe: str, **changes) -> None:
    """`recipe`'s rows again, as a continuing call with DEVICE_CHECK_EAGER=false writes them: another setup."""
    store = run / "results" / "results.jsonl"
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    compiled = [r | {"engine_args": r["engine_args"] | {"enforce_eager": False}, "setup_id": "compiled"} | changes
                for r in rows if r["recipe"] == recipe]
    store.write_text("".join(json.dumps(r) + "\n" for r in rows + compiled))


def test_eager_and_cuda_graph_starts_of_one_checkpoint_are_judged_apart_each_from_its_own_log(h200_run):
    eager_log = h200_run / "steps" / "vllm_1b_w8a16_awq.log"
    (h200_run / "steps" / "vllm_1b_w8a16_awq_compiled.log").write_text(
        eager_log.read_text().replace("MacheteLinearKernel", "MarlinLinearKernel"))
    add_compiled_rows(h200_run, "w8a16_awq")
    rows = [r for r in rules_vs_observed.compare(h200_run) if r["artifact"] == "llama-1b-random/w8a16_awq"]
    assert [r["mode"] for r in rows] == ["eager", "CUDA graphs"]
    assert [r["kernels"].split(" ")[0] for r in rows] == ["MacheteLinearKernel", "MarlinLinearKernel"]
    assert all(r["agree"] is True for r in rows)
    assert rules_vs_observed.main([str(h200_run)]) == 0
    assert "| llama-1b-random/w8a16_awq | W8A16 | CUDA graphs | yes, bfloat16" in (h200_run / "rules.md").read_text()


def test_a_cuda_graph_start_that_fails_is_a_mismatch_beside_its_eager_start_that_ran(h200_run):
    """Merged per checkpoint, the eager runs would have hidden which mode failed."""
    add_compiled_rows(h200_run, "fp8_dynamic", status="failed", reason="engine: CUDA graph capture failed")
    rows = {r["mode"]: r for r in rules_vs_observed.compare(h200_run) if r["artifact"] == "llama-1b-random/fp8_dynamic"}
    assert rows["eager"]["agree"] is True and rows["eager"]["observed"].startswith("started")
    assert rows["CUDA graphs"]["agree"] is False
    assert rows["CUDA graphs"]["observed"] == "failed: engine: CUDA graph capture failed"
    assert rows["CUDA graphs"]["kernels"] == ""   # no compiled step log: nothing borrowed from the eager one's
