"""evaluate serves plain GPTQ- and AWQ-format checkpoints (no manifest) on real
vLLM, and the engine decodes their packed weights correctly: its next-token
predictions are those of a dense model holding the decoded weights, which
differ from the model before quantization."""
import json

import pytest

from tests.conftest import run_cli, serve_verdict
from evaluate import results
from tests.evaluate.legacy_formats import write_legacy
from quantize.common.tiny_model import build_tiny_llama

# The speed row only has to exist and be whole: a short prompt and answer.
OUTPUT_LEN = 16
TINY_SCENARIO = ("scenario=interactive", "scenario.name=legacy_tiny", "scenario.input_len=32",
                 f"scenario.output_len={OUTPUT_LEN}")


def top1_agreement(model_a, model_b, ids) -> float:
    """Share of positions of `ids` where both models predict the same next
    token, computed in transformers."""
    import torch
    from transformers import AutoModelForCausalLM
    top = []
    for path in (model_a, model_b):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        with torch.inference_mode():
            top.append(model(torch.tensor([ids])).logits[0].argmax(-1))
    return float((top[0] == top[1]).double().mean())


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_legacy_checkpoint_is_served_and_decoded_correctly(fmt, tmp_path, tokenizer_dir):
    from quantize.common.checkpoint import weight_files
    from quantize.common.manifest import checkpoint_id
    from quantize.common.provenance import sha256_files
    dense = build_tiny_llama(tmp_path / "tiny", tokenizer_dir, initializer_range=0.1)
    legacy, decoded = tmp_path / f"tiny-{fmt}", tmp_path / f"tiny-{fmt}-decoded"
    write_legacy(dense, fmt, legacy, decoded)
    # The fixture is meaningful: int4 rounding changes most predictions of this
    # random model, so serving the weights wrong (or dense) cannot pass below.
    assert top1_agreement(dense, decoded, list(range(1000, 1256))) < 0.8

    res = tmp_path / "results"
    verdict, _ = serve_verdict(legacy)
    if not verdict:  # this host lacks the int4 kernel: the user gets the capability answer
        out = run_cli("evaluate", f"model={legacy}", "scenario=interactive", f"accuracy.reference={decoded}",
                      f"results_dir={res}", cwd=tmp_path)
        assert out.returncode == 2 and verdict.reason in out.stderr.strip().splitlines()[-1], out.stderr[-2000:]
        assert not results.read(res)
        pytest.skip(f"capability layer: {verdict.reason}")
    out = run_cli("evaluate", f"model={legacy}", *TINY_SCENARIO, "runs=1", "accuracy.num_windows=2",
                  f"accuracy.reference={decoded}", "engine.args.enforce_eager=true", f"results_dir={res}",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r.kind: r for r in results.read(res)}
    speed, acc = rows["speed"], rows["accuracy"]
    for r in (speed, acc):
        assert r.status == "ok" and r.engine == "vllm" and r.manifest is None
        assert r.quant_format == fmt and r.recipe == "external"
        assert r.artifact_id == checkpoint_id(sha256_files(weight_files(legacy)),
                                              json.loads((legacy / "config.json").read_text()))
    assert speed.metrics["output_tokens"] == OUTPUT_LEN
    assert json.loads((legacy / "config.json").read_text())["quantization_config"]["quant_method"] == fmt
    # The engine's predictions are those of the decoded weights (fp16 kernels
    # on both sides; ties in near-uniform logits can still flip a few).
    assert acc.metrics["top1_agreement"] > 0.97, acc.metrics
