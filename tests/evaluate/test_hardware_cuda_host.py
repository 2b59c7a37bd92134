"""`python -m evaluate` on a CUDA machine, emulated on any host by its facts
(tests/hosts/cuda_host): the entry point adds hardware=cuda where the command line
names no profile, and a sweep keeps all of its overrides."""
from tests.conftest import ROOT, tail
from evaluate import results
from tests.evaluate.engines.test_base import evaluate_with_dummy

CUDA_HOST = ROOT / "tests" / "hosts" / "cuda_host"


def test_a_sweep_on_a_cuda_machine_gets_the_gpu_defaults_and_runs_every_job(tiny_model, tmp_path):
    res = tmp_path / "res"
    out = evaluate_with_dummy("-m", f"model={tiny_model}", "accuracy=none", "scenario=interactive", "runs=1",
                              "+engine.env.QUANTBENCH_DUMMY_EXTRA=on,null", f"results_dir={res}", cwd=tmp_path,
                              host=CUDA_HOST)
    assert out.returncode == 0, tail(out)
    rows = results.read(res)
    assert sorted(r.engine_env.get("QUANTBENCH_DUMMY_EXTRA", "-") for r in rows) == ["-", "on"]
    assert {r.hardware_defaults for r in rows} == {"cuda"} and {r.scenario for r in rows} == {"interactive"}
    assert all(" hardware=cuda " in r.repro for r in rows)  # the repro line reproduces it from any machine
