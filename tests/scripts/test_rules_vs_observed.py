"""scripts/device/rules_vs_observed.py on the H100 run stored in
docs/device-runs/2026-11-27-h100: the rule for the machine and vLLM the rows
record, against what each start did, from the folder alone (no weights)."""
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "device-runs" / "2026-11-27-h100"
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
    assert "| llama-1b-random/w8a8_smooth_gptq | W8A8 int8 | yes, bfloat16 |" in (run / "rules.md").read_text()


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
