"""Peak memory on a real multi-artifact sweep: evaluate measures a sweep's
artifacts one after another in one process, which by then holds the earlier
jobs' accuracy reference; each artifact's peak is still its engine's alone,
the same whether it is measured first (as alone, in a fresh process) or last.
engine=hf in float32 (the same sizes on every host), on a random Llama
whose weights (645 MB) dwarf what an engine's Python objects may find
already allocated by earlier jobs (measured 2-10 MB)."""
import pytest

from tests.conftest import SMALL_CALIB, check_ok, run_cli, run_quantize
from evaluate import results

RECIPES = ("original", "w4a16_rtn")
# Linear layers (111M parameters) that outweigh the tokenizer's 49152 x 1024 embedding; few layers, so
# few Python objects; widths a multiple of every group size
SIZES = dict(hidden_size=1024, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=4, head_dim=64)
SCENARIO = "name: mem\nbatch_size: 1\ninput_len: 32\noutput_len: 8\n"
# the reference's log-probs the process keeps between jobs: 1 window x 511 positions x 49152 x 4 B = 100 MB
ACCURACY = ("accuracy.num_windows=1", "accuracy.window_len=512", "accuracy.lastword.num_items=2")
SAME_PCT = 2.0


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, tokenizer_dir):
    from quantize.common.tiny_model import build_tiny_llama
    root = tmp_path_factory.mktemp("memory-sweep")
    model = build_tiny_llama(root / "mid-llama", tokenizer_dir, **SIZES)
    check_ok(run_quantize("-m", f"recipe={','.join(RECIPES)}", f"model={model}", *SMALL_CALIB,
                          f"artifacts_dir={root / 'artifacts'}", cwd=root))
    return root, model


def sweep(root, model, order: tuple[str, ...]) -> dict[str, list]:
    """One evaluate process over the artifacts in `order`: each recipe's speed rows."""
    store = root / "-".join(order)
    scenario = root / "mem.yaml"
    scenario.write_text(SCENARIO)
    out = run_cli("evaluate", "-m", f"recipe={','.join(order)}", f"model={model}",
                  f"artifacts_dir={root / 'artifacts'}", "engine=hf", "engine.args.dtype=float32",
                  f"scenario={scenario}", "runs=1", *ACCURACY, f"results_dir={store}", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r for r in results.read(store) if r.kind == "speed" and r.ok]
    return {recipe: [r for r in rows if r.recipe == recipe] for recipe in order}


@pytest.mark.slow  # a 161M-parameter model quantized, then two evaluate sweeps with accuracy on engine=hf
def test_an_artifact_has_the_same_peak_first_last_or_alone(artifacts):
    root, model = artifacts
    first = sweep(root, model, RECIPES)            # original first (as alone), w4a16_rtn last
    last = sweep(root, model, RECIPES[::-1])       # w4a16_rtn first (as alone), original last
    for recipe in RECIPES:
        a, b = first[recipe][0].metrics["peak_memory_bytes"], last[recipe][0].metrics["peak_memory_bytes"]
        assert abs(a - b) <= SAME_PCT / 100 * min(a, b), f"{recipe}: {a / 2**20:.1f} vs {b / 2**20:.1f} MiB"
    # right, not only steady: the original's peak is its weights as it ran them, plus activations
    original = first["original"][0]
    weights = original.model_bytes * 2  # float32 of bf16 on disk
    assert 0.98 * weights <= original.metrics["peak_memory_bytes"] <= 1.25 * weights
    # transformers runs W4A16 decompressed to dense: its peak holds the dense weights too
    assert first["w4a16_rtn"][0].metrics["peak_memory_bytes"] >= 0.98 * weights
