"""engine=hf's prompt logprobs, read from the device in one piece
(evaluate.engines.hf.top_k_positions), give what element-by-element reads gave."""
import pytest
import torch

from evaluate.engines.hf import top_k_positions


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
