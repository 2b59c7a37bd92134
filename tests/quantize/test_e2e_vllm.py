"""End to end on the real default model: quantize W8A8 (SmoothQuant + RTN), then
serve the artifact with real vLLM and generate greedily (minutes)."""
import json
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import check_ok, quantize_env, run_quantize, sha256_files_by_hand

RECIPE = "w8a8_smooth_ptq"
MODEL_NAME = "smollm2-135m-instruct"  # conf/model/smollm2_135m.yaml
# The tiny-model tests' calibration size: after it the W8A8 model still
# continues greedily with " Paris." (as after 16 x 256 tokens).
NUM_SAMPLES, MAX_SEQ_LEN = 8, 64

GENERATE = """\
import json, sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], enforce_eager=True, max_model_len=512, dtype="bfloat16")
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))
    print("RESULT " + json.dumps({"text": out[0].outputs[0].text,
                                  "token_ids": list(out[0].outputs[0].token_ids)}))
"""


@pytest.mark.slow
def test_default_model_w8a8_serves_in_vllm(tmp_path, tokenizer_dir):
    cwd, arts = tmp_path / "cwd", tmp_path / "artifacts"
    cwd.mkdir()
    check_ok(run_quantize(f"recipe={RECIPE}", f"calibration.num_samples={NUM_SAMPLES}",
                          f"calibration.max_seq_len={MAX_SEQ_LEN}",
                          "verify=reload", f"artifacts_dir={arts}", cwd=cwd, timeout=1800))
    art = arts / MODEL_NAME / RECIPE
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["model"]["weights_sha256"] == sha256_files_by_hand(tokenizer_dir.glob("*.safetensors"))
    assert manifest["quantization"]["format"] == "int-quantized"
    assert manifest["calibration"]["num_tokens"] == NUM_SAMPLES * MAX_SEQ_LEN  # Austen text, packed full
    # verify=reload: the whole checkpoint loaded in transformers and run.
    assert manifest["checks"]["verified_by"] == "reload" and manifest["checks"]["logits_finite"] is True

    script = tmp_path / "generate.py"
    script.write_text(GENERATE)
    # vLLM binds its sockets under TMPDIR: a short folder of its own, as a
    # socket's path must fit in 107 bytes (tmp_path does not, under xdist).
    with tempfile.TemporaryDirectory(prefix="qb-e2e-") as sockets:
        env = quantize_env({
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
            "TMPDIR": sockets,
        })
        proc = subprocess.run([sys.executable, str(script), str(art)], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=1800)
    log = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, log
    results = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert results, log
    out = json.loads(results[-1][len("RESULT "):])
    print(f"vLLM W8A8 greedy continuation: {out['text']!r}")
    assert out["token_ids"] and out["text"].strip()
    assert "Paris" in out["text"]
