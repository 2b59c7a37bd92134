"""engine=hf's prompt logprobs, read from the device in one piece
(evaluate.engines.hf.top_k_positions), give what element-by-element reads gave;
its thread count from engine.env."""
import pytest
import torch

from tests.conftest import run_cli
from tests.evaluate.pipeline_fixtures import scen  # noqa: F401  (fixture)
from evaluate import engines, results
from evaluate.engines.hf import HfEngine, top_k_positions
from quantize.common.errors import UserError


def element_wise(lp, targets, k):
    """The reads the engine made before: one per element (one device sync each on CUDA)."""
    top = lp.topk(k, dim=-1)
    positions = []
    for i, target in enumerate(targets):
        row = lp[i]
        d = {int(t): (float(v), r + 1) for r, (v, t) in enumerate(zip(top.values[i], top.indices[i]))}
        if target not in d:
            d[target] = (float(row[target]), int((row > row[target]).sum()) + 1)
        positions.append(d)
    return positions


@pytest.mark.parametrize("k", [1, 5, 20])
def test_one_transfer_gives_the_element_wise_values(k):
    g = torch.Generator().manual_seed(k)
    lp = torch.log_softmax(torch.randn(64, 1000, generator=g) * 3, dim=-1)
    lp[3, :] = lp[3, 0]  # a row of ties
    ranked = lp.argsort(dim=-1, descending=True)
    # targets inside the top k, just outside it, deep in the tail, and in the tied row
    targets = [int(ranked[i, [0, k - 1, k, 999][i % 4]]) for i in range(64)]
    fast, slow = top_k_positions(lp, targets, k), element_wise(lp, targets, k)
    assert fast == slow
    assert [list(d) for d in fast] == [list(d) for d in slow]  # same order: top k first, then the target
    assert all(type(v) is float and type(r) is int for d in fast for v, r in d.values())
    assert any(len(d) == k + 1 for d in fast) and any(len(d) == k for d in fast)


def test_a_one_token_prompt_has_no_positions():
    assert top_k_positions(torch.zeros(0, 10), [], 3) == []


def test_a_sweep_over_omp_threads_measures_each_count_and_says_so(tiny_model, tmp_path, scen):
    """torch read OMP_NUM_THREADS when it was imported, before the job set
    engine.env: rows labelled 1 and 2 threads were measured alike."""
    res = tmp_path / "res"
    out = run_cli("evaluate", "-m", f"model={tiny_model}", "engine=hf", scen["test_tiny_a"], "runs=1",
                  "accuracy=none", "+engine.env.OMP_NUM_THREADS=1,2", f"results_dir={res}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = results.read(res)
    assert sorted((r.engine_env["OMP_NUM_THREADS"], r.engine_env["torch_num_threads"]) for r in rows) == [
        ("1", 1), ("2", 2)]
    assert len({r.setup_id for r in rows}) == 2


def test_the_thread_count_lasts_the_engines_lifetime():
    before = torch.get_num_threads()
    count = 2 if before == 1 else 1
    with HfEngine.environment({"OMP_NUM_THREADS": count}) as recorded:
        assert torch.get_num_threads() == count and recorded["OMP_NUM_THREADS"] == str(count)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("key", ["MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"])
def test_a_variable_torch_reads_only_at_start_is_refused_not_recorded_as_applied(key):
    cfg = {**engines.config("hf"), "env": {key: "1"}}
    with pytest.raises(UserError) as e:
        engines.build(cfg)
    assert str(e.value) == (f"engine.env.{key}: engine=hf runs in this process, where torch reads {key} only "
                            f"as it starts; export it in the shell instead ({key}=... python -m evaluate ...)")


@pytest.mark.parametrize("value", [0, "two", -1])
def test_a_thread_count_that_is_no_count_is_refused(value):
    with pytest.raises(UserError, match=r"engine.env.OMP_NUM_THREADS=.*: pass a count of threads > 0"):
        engines.build({**engines.config("hf"), "env": {"OMP_NUM_THREADS": value}})
