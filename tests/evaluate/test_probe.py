"""The capability probe end to end (`python -m evaluate.capabilities probe=true`):
it builds tiny checkpoints with real llm-compressor, starts the real engine on
each, and exits 0 only when every cell ran where the rules say yes and failed
where they say no. Here: vLLM's mixture-of-experts cells on this host (its
fused-MoE kernels for quantized experts need AMX on x86 and take symmetric
weights only). One run, about 3 min on 2 busy cores."""
import pytest

from tests.conftest import run_cli, table_cells
from evaluate import engines

CELLS = ("vllm:dense_bfloat16_MoE", "vllm:W8A8_int8_MoE", "vllm:W4A16_asym_MoE")
TABLE_LINES = ("Machine:", "|", "fp8 KV cache", "W8A8 int8 + fp8 KV checkpoint")


@pytest.mark.slow
def test_the_probe_runs_the_moe_cells_and_they_do_what_the_rules_say(tmp_path):
    kernels = engines.get("vllm").machine().engine("vllm")
    if not kernels.installed:  # e.g. a CUDA host with torch and transformers only
        pytest.skip(f"the probe starts vLLM, which is not usable here: {kernels.missing}")
    out = run_cli("evaluate.capabilities", "probe=true", f"cells=[{','.join(CELLS)}]", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    # stdout is the table alone: the build and engine logs went to stderr
    assert all(line.startswith(TABLE_LINES) for line in out.stdout.splitlines() if line.strip()), out.stdout[:2000]
    cells = table_cells(out.stdout)
    for label in ("dense bfloat16 MoE", "W8A8 int8 MoE", "W4A16 asym MoE"):
        cell = cells[label, "vllm"]
        assert "≠ rules" not in cell
        assert cell.endswith("probe: ran") if cell.startswith("✅") else "probe: failed" in cell, cell
    assert cells["dense bfloat16 MoE", "vllm"].startswith("✅")
    if not engines.get("vllm").machine().cuda:  # no CPU serves asymmetric quantized experts
        assert cells["W4A16 asym MoE", "vllm"].startswith("✗")
    # the cells not asked for are not probed
    assert "probe:" not in cells["W4A16 MoE", "vllm"] and "probe:" not in cells["dense bfloat16", "vllm"]
