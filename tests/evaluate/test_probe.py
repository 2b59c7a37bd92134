"""The capability probe (`python -m evaluate.capabilities probe=true`): it
builds tiny checkpoints with real llm-compressor, starts the real engine on
each, and exits 0 only when every cell ran where the rules say yes and failed
where they say no.

End to end, two of vLLM's mixture-of-experts cells on this host: dense
experts, which every host serves, and int8 experts, whose fused-MoE kernels
need AMX on x86 (a yes there, a no elsewhere: the rule a new vLLM is most
likely to change). The table, the cell texts and the exit status when a cell
disagrees are checked in-process, on the rules of a known machine, with the
cell runner scripted."""
from pathlib import Path

import pytest

from tests.conftest import run_cli, table_cells
from evaluate import capabilities, engines, probe
from evaluate.formats import DENSE, CheckpointFormat, Verdict

DENSE_MOE, ASYM_MOE, INT8_MOE = "dense bfloat16 MoE", "W4A16 asym MoE", "W8A8 int8 MoE"
TABLE_LINES = ("Machine:", "|", "fp8 KV cache", "W8A8 int8 + fp8 KV checkpoint")
RULES_OF = "avx512_bf16"  # no AMX: vLLM-CPU serves dense experts only


def cell_ids(*labels: str) -> str:
    return f"cells=[{','.join('vllm:' + label.replace(' ', '_') for label in labels)}]"


@pytest.mark.extended
@pytest.mark.slow
def test_the_probe_runs_the_moe_cells_and_they_do_what_the_rules_say(tmp_path):
    kernels = engines.get("vllm").machine().engine("vllm")
    if not kernels.installed:  # e.g. a CUDA host with torch and transformers only
        pytest.skip(f"the probe starts vLLM, which is not usable here: {kernels.missing}")
    out = run_cli("evaluate.capabilities", "probe=true", cell_ids(DENSE_MOE, INT8_MOE), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    # stdout is the table alone: the build and engine logs went to stderr
    assert all(line.startswith(TABLE_LINES) for line in out.stdout.splitlines() if line.strip()), out.stdout[:2000]
    cells = table_cells(out.stdout)
    for label in (DENSE_MOE, INT8_MOE):
        cell = cells[label, "vllm"]
        assert "≠ rules" not in cell
        assert cell.endswith("probe: ran") if cell.startswith("✅") else "probe: failed (" in cell, cell
    assert cells[DENSE_MOE, "vllm"].startswith("✅")
    # the cells not asked for are not probed
    assert "probe:" not in cells[ASYM_MOE, "vllm"] and "probe:" not in cells["dense bfloat16", "vllm"]


@pytest.fixture
def scripted_cells(monkeypatch, tmp_path):
    """The probe on the rules of machine=avx512_bf16 whatever this host is,
    each cell's engine start replaced by `outcomes[format label]`
    ((ran, detail)); the calls it got, as (label, dtype), in `calls`."""
    outcomes, calls = {}, []
    monkeypatch.setattr(capabilities, "this_machine", lambda: capabilities.KNOWN_MACHINES[RULES_OF])
    monkeypatch.setattr("quantize.common.assets.ensure_default_model", lambda: tmp_path)
    monkeypatch.setattr(probe, "checkpoint", lambda fmt, root, tokenizer: Path(root) / fmt.label)

    def run_cell(engine: str, model: Path, dtype: str) -> tuple[bool, str]:
        calls.append((model.name, dtype))
        return outcomes[model.name]
    monkeypatch.setattr(probe, "run_cell", run_cell)
    return outcomes, calls


def test_cells_that_do_what_the_rules_say_are_marked_and_exit_zero(scripted_cells, capfd):
    outcomes, calls = scripted_cells
    outcomes.update({DENSE_MOE: (True, ""), ASYM_MOE: (False, "RuntimeError: no asymmetric MoE kernel")})
    assert capabilities.main(["probe=true", cell_ids(DENSE_MOE, ASYM_MOE)]) == 0
    out = capfd.readouterr()
    cells = table_cells(out.out)
    assert cells[DENSE_MOE, "vllm"].startswith("✅ bfloat16") and cells[DENSE_MOE, "vllm"].endswith(" — probe: ran")
    assert cells[ASYM_MOE, "vllm"].startswith("✗ ")
    assert cells[ASYM_MOE, "vllm"].endswith(" — probe: failed (RuntimeError: no asymmetric MoE kernel)")
    assert "probe:" not in cells[INT8_MOE, "vllm"] and "disagree" not in out.err
    # each cell started once, in the dtype its rule chose
    asym = next(f for f in capabilities.TABLE_FORMATS if f.label == ASYM_MOE)
    _, asym_dtype = capabilities.decide("vllm", asym, capabilities.KNOWN_MACHINES[RULES_OF])
    assert calls == [(DENSE_MOE, "bfloat16"), (ASYM_MOE, asym_dtype)]


def test_a_cell_that_runs_where_the_rules_say_no_fails_the_probe(scripted_cells, capfd):
    outcomes, _ = scripted_cells
    outcomes.update({DENSE_MOE: (False, "ValueError: broken"), INT8_MOE: (True, "")})
    assert capabilities.main(["probe=true", cell_ids(DENSE_MOE, INT8_MOE)]) == 1
    out = capfd.readouterr()
    cells = table_cells(out.out)
    assert cells[DENSE_MOE, "vllm"].endswith(" — probe: failed (ValueError: broken) ≠ rules")
    assert cells[INT8_MOE, "vllm"].startswith("✗ ") and cells[INT8_MOE, "vllm"].endswith(" — probe: ran ≠ rules")
    assert out.err.strip().splitlines()[-1] == ("2 cell(s) where the rules and the probe disagree: "
                                                "vllm:dense_bfloat16_MoE, vllm:W8A8_int8_MoE")


def test_a_no_for_speed_agrees_with_a_cell_that_starts(scripted_cells):
    """A no that is about speed (Verdict.starts) expects the tiny model to
    run: a start agrees, a failure does not."""
    outcomes, _ = scripted_cells
    slow = Verdict(False, "too slow to measure", starts=True)
    dense = CheckpointFormat(DENSE, moe=True)
    for ran, disagree in ((True, []), (False, ["vllm:dense_bfloat16_MoE"])):
        outcomes[DENSE_MOE] = (ran, "" if ran else "exit 1")
        probed, found = probe.run([dense], lambda engine, fmt: (slow, "bfloat16"), ["vllm:dense_bfloat16_MoE"])
        assert found == disagree
        assert probed[DENSE_MOE, "vllm"] == ("ran" if ran else "failed (exit 1) ≠ rules")


def test_an_unknown_cell_is_one_line_naming_the_known_ones(scripted_cells):
    with pytest.raises(SystemExit, match=r"^error: unknown cell in \['vllm:W9A9_MoE'\]; known: .*vllm:W4A16_asym_MoE"):
        probe.run(capabilities.TABLE_FORMATS, lambda engine, fmt: (Verdict(True), "bfloat16"), ["vllm:W9A9_MoE"])
