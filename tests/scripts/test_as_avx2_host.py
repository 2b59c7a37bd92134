"""scripts/as_avx2_host.sh: a command run through it decides as an AVX2-only
x86 host would (vLLM's _C_AVX2, no AVX-512 in the capability layer) and every
library that picks its own instructions is capped at AVX2."""
import json
import platform
import subprocess
import sys

import pytest

from tests.conftest import ROOT, quantize_env

PROBE = """
import json, torch
from torch._inductor.cpu_vec_isa import pick_vec_isa
from evaluate.engines.vllm import VllmEngine
m = VllmEngine.machine()
print(json.dumps({"aten": torch.backends.cpu.get_cpu_capability(), "inductor": str(pick_vec_isa()),
                  "isa": sorted(m.isa), "vllm_library": m.facts()["vllm_library"],
                  "native_half": sorted(m.cpu_native_half)}))
"""


@pytest.fixture(scope="module")
def seen() -> dict:
    """What a command run through the script sees (one run for the tests below)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("an x86 host is emulated")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "as_avx2_host.sh"), sys.executable, "-c", PROBE],
                         env=quantize_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_command_run_through_it_sees_and_runs_avx2_only(seen):
    assert seen["aten"] == "AVX2" and seen["inductor"] == "avx2"
    assert "avx2" in seen["isa"] and not any(f.startswith("avx512") for f in seen["isa"])
    assert seen["native_half"] == []


@pytest.mark.needs_vllm
def test_vllm_loads_its_avx2_library_there(seen):
    assert seen["vllm_library"] == "_C_AVX2"
