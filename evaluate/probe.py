"""`python -m evaluate.capabilities probe=true`: check the capability table
against reality. A tiny random Llama (a tiny Qwen3-MoE for the MoE rows) is
written in every table format (the quantized ones with llm-compressor's
data-free schemes), then each (format, engine) cell starts the engine in its
own process, in the dtype the rules choose, and generates a few tokens. A
cell that runs where the rules say no, or fails where they say yes, is a
disagreement (a no that is about speed, `Verdict.starts`, expects the tiny
model to run)."""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from typing import Callable, Sequence

from evaluate import engines
from evaluate.formats import DENSE, FP8, FP8_BLOCK, FP8_PER_TENSOR, W4A16, W8A8_INT8, W8A16, CheckpointFormat, Verdict
from quantize.common import hf_load

# (engine, format) -> (verdict, dtype): the rules to check, given by the
# capability table (evaluate.capabilities.decide on the probed machine), so
# this module does not import the table that imports it.
Rules = Callable[[str, CheckpointFormat], tuple[Verdict, str]]

CELL_TIMEOUT_S = 900
ROOT_CAUSE = re.compile(r"\b[A-Z]\w*(Error|Exception): .*")
# llm-compressor preset schemes that need no calibration data, by (scheme, zero point).
PRESET = {(W8A8_INT8, False): "W8A8", (W4A16, False): "W4A16", (W4A16, True): "W4A16_ASYM",
          (W8A16, False): "W8A16", (FP8, False): "FP8_DYNAMIC"}
# The other FP8 strategies' presets; FP8's static activation scales are calibrated, as the KV scales are.
FP8_PRESET = {FP8_PER_TENSOR: "FP8", FP8_BLOCK: "FP8_BLOCK"}
# KV-cache schemes as recipes write them (recipes/w8a8_kv8.yaml); their static
# k/v scales are calibrated, on a few random-token samples here.
# FP8 block's tiny Llama: k/v as wide as q (4 heads x 32 = 128), so each merged layer's part is a
# multiple of the block's 128 outputs, as vLLM's compressed-tensors FP8 block loader needs
# (evaluate/engines/vllm.py, _fp8_block_shape_rule); the usual 2 KV heads give k/v 64 and the start fails.
BLOCK_SIZES = {"num_key_value_heads": 4}
KV_SCHEME = {"fp8": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}}
KV_CALIBRATION_SAMPLES, KV_CALIBRATION_LEN = 4, 32


def cell_id(engine: str, fmt: CheckpointFormat) -> str:
    return f"{engine}:{fmt.label.replace(' ', '_')}"


def run(formats: Sequence[CheckpointFormat], rules: Rules, only: list[str] | None = None
        ) -> tuple[dict, list[str]]:
    """{(format label, engine): text} and the cells that disagree with the rules."""
    from quantize.common.assets import ensure_default_model
    cells = [(e, f) for f in formats for e in engines.known() if not only or cell_id(e, f) in only]
    if only and len(cells) != len(only):
        known = [cell_id(e, f) for f in formats for e in engines.known()]
        raise SystemExit(f"error: unknown cell in {only}; known: {', '.join(known)}")
    probed, disagree = {}, []
    with tempfile.TemporaryDirectory(prefix="quantbench-probe-") as tmp:
        tokenizer = ensure_default_model()
        for i, (engine, fmt) in enumerate(cells, 1):
            verdict, dtype = rules(engine, fmt)
            model = checkpoint(fmt, Path(tmp), tokenizer)
            print(f"probe {i}/{len(cells)}: {engine} × {fmt.label} in {dtype} …", file=sys.stderr, flush=True)
            ran, detail = run_cell(engine, model, dtype)
            agrees = ran == (bool(verdict) or verdict.starts)  # a no for speed still starts
            probed[(fmt.label, engine)] = ("ran" if ran else f"failed ({detail})") + ("" if agrees else " ≠ rules")
            if not agrees:
                disagree.append(cell_id(engine, fmt))
    return probed, disagree


def checkpoint(fmt: CheckpointFormat, root: Path, tokenizer_dir: Path) -> Path:
    """The tiny model in `fmt`, written once per probe."""
    from quantize.common import moe
    from quantize.common.tiny_model import build_tiny_llama, build_tiny_qwen3_moe
    out = root / cell_id("model", fmt).split(":", 1)[1]
    if (out / "config.json").is_file():
        return out
    block = fmt.scheme == FP8 and fmt.fp8 == FP8_BLOCK and not fmt.moe
    dense = root / f"dense-{fmt.dtype}{'-moe' if fmt.moe else ''}{'-block' if block else ''}"
    if not (dense / "config.json").is_file() and fmt.moe:
        build_tiny_qwen3_moe(dense, tokenizer_dir, dtype=fmt.dtype)
    elif not (dense / "config.json").is_file():
        build_tiny_llama(dense, tokenizer_dir, dtype=fmt.dtype, **(BLOCK_SIZES if block else {}))
    if fmt.scheme == DENSE:
        return dense
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    model = hf_load.causal_lm(dense, dtype=getattr(torch, fmt.dtype))
    if fmt.moe:
        moe.linearize(model)  # one Linear per expert, as quantize does
    if fmt.sparse_24:
        _prune_2_4(model)
    scheme = (fmt.scheme == FP8 and FP8_PRESET.get(fmt.fp8)) or PRESET[fmt.scheme, fmt.zero_point]
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"],
                                  kv_cache_scheme=KV_SCHEME[fmt.kv_cache] if fmt.kv_cache else None)
    calibrate = fmt.kv_cache or scheme == "FP8"
    oneshot(model=model, recipe=recipe, **(_random_calibration(model) if calibrate else {}))
    model.save_pretrained(out, save_compressed=True)
    hf_load.tokenizer(dense).save_pretrained(out)
    return out


def _random_calibration(model) -> dict:
    """oneshot's dataset arguments for a few random-token samples (static
    KV scales need activations to observe; their values do not matter here)."""
    import torch
    from datasets import Dataset
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (KV_CALIBRATION_SAMPLES, KV_CALIBRATION_LEN), generator=g)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})
    return {"dataset": data, "num_calibration_samples": KV_CALIBRATION_SAMPLES,
            "max_seq_length": KV_CALIBRATION_LEN}


def _prune_2_4(model) -> None:
    """Keep the 2 largest of every 4 consecutive input weights of each Linear."""
    import torch
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and "lm_head" not in name:
                w = module.weight.view(-1, 4)
                drop = w.abs().argsort(dim=1)[:, :2]
                w.scatter_(1, drop, 0)


def run_cell(engine: str, model: Path, dtype: str) -> tuple[bool, str]:
    """Start `engine` on `model` in a fresh process; (ran, one-line detail)."""
    cmd = [sys.executable, "-m", "evaluate.probe", engine, str(model), dtype]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CELL_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return False, f"no answer in {CELL_TIMEOUT_S} s"
    if proc.returncode == 0:
        return True, ""
    # The root cause is the first `SomeError: ...` line (a worker's), not the
    # engine's closing "initialization failed".
    output = (proc.stdout + proc.stderr).splitlines()  # vLLM logs its workers' errors to stdout
    causes = [m.group(0) for m in map(ROOT_CAUSE.search, output) if m and "initialization failed" not in m.group(0)]
    return False, (causes[0] if causes else f"exit {proc.returncode}")[:200]


def _cell_main(engine: str, model: str, dtype: str) -> None:
    """In the cell's own process: the engine itself, bypassing the rules."""
    from evaluate.target import from_path
    cls = engines.get(engine)
    args, env = cls.quick_start()
    with cls(from_path(Path(model)), {**args, "dtype": dtype}, env, max_model_len=64) as eng:
        _, timings = eng.run([[1000 + i for i in range(8)]], 4)
        assert timings[0].output_tokens == 4, timings


if __name__ == "__main__":
    hf_load.detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    _cell_main(*sys.argv[1:4])
