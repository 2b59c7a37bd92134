"""The vocabulary every engine and the capability table share: checkpoint
formats (what an engine must know about a checkpoint to decide whether it can
serve it), how a config.json is classified into one, and the Verdict an
engine answers with. No engine, no table: engines import this, and the
capability table (evaluate.capabilities) imports the engines."""
from dataclasses import dataclass, field

from quantize.common.moe import is_moe

DENSE, W8A8_INT8, W4A16, W8A16, FP8 = "dense", "w8a8_int8", "w4a16", "w8a16", "fp8"
# An FP8 checkpoint's strategy: the scale shapes vLLM picks its FP8 kernel by
# (vllm/model_executor/kernels/linear/__init__.py, init_fp8_linear_kernel).
# per-tensor: weight and activation scales per-tensor (llm-compressor's FP8
# preset, static; vLLM's own fp8 format without blocks); per-token: any other
# scales (FP8_DYNAMIC: per-channel weights, dynamic per-token activations);
# block: block-scaled weights (FP8_BLOCK); weight-only: activations left in 16 bits.
FP8_PER_TENSOR, FP8_PER_TOKEN, FP8_BLOCK, FP8_WEIGHT_ONLY = "per-tensor", "per-token", "block", "weight-only"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""       # why not (or a caveat when ok)
    starts: bool = False   # a no that is about speed: the engine would start, too slowly to measure

    def __bool__(self) -> bool:
        return self.ok

    def with_note(self, note: str) -> "Verdict":
        """The same answer with a caveat appended to its reason."""
        return Verdict(self.ok, "; ".join(r for r in (self.reason, note) if r), self.starts)


YES = Verdict(True)


@dataclass(frozen=True)
class CheckpointFormat:
    """What an engine needs to know about a checkpoint to decide."""
    scheme: str = DENSE            # dense, w8a8_int8, w4a16, w8a16, fp8, or w{N}a{M}
    dtype: str = "bfloat16"        # the checkpoint's (activation) dtype
    method: str | None = None      # quant_method: compressed-tensors, gptq, awq, ...
    sparse_24: bool = False        # weights hold the 2:4 pattern, stored dense
    sparsity_compressed: bool = False   # a sparse-compressed format (sparsity_config)
    moe: bool = False              # mixture-of-experts: quantized experts need fused-MoE kernels
    kv_cache: str | None = None    # the checkpoint's KV-cache scheme (kv_cache_scheme): "fp8", "fp8 per-head", ...
    zero_point: bool = False       # asymmetric integer weights (a zero point per group or channel)
    per_channel: bool = False      # integer weights scaled per output channel (strategy: channel), not per group
    # FP8's strategy (FP8_* above; several joined by "+"); None: FP8_PER_TOKEN, the shipped fp8_dynamic's
    fp8: str | None = None
    # config.json's model_type (an engine may refuse a dtype for some); None for a format judged alone
    model_type: str | None = field(default=None, compare=False)
    # the attention head size (some kernels take only some sizes); None for a format judged alone (the table's)
    head_dim: int | None = field(default=None, compare=False)
    # The output sizes of the parts vLLM merges into one layer ({"q": heads x head_dim, "k/v": ...,
    # "gate/up": the MLP's width}; FP8 block loaders split them by block); None where unknown
    merged_parts: dict | None = field(default=None, compare=False, repr=False)
    # The checkpoint's compressed-tensors quantization_config as saved, for the
    # engine that matches each config group to a kernel scheme of its own
    # (evaluate/engines/vllm_schemes.py); None for a format judged alone (the table's).
    quantization_config: dict | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        name = {DENSE: f"dense {self.dtype}", W8A8_INT8: "W8A8 int8", W4A16: "W4A16",
                W8A16: "W8A16", FP8: "FP8"}.get(self.scheme, self.scheme.upper())
        if self.scheme == FP8 and self.fp8 not in (None, FP8_PER_TOKEN):
            name += f" {self.fp8}"
        if self.zero_point:
            name += " asym"
        if self.method in ("gptq", "awq"):
            name += f" ({self.method.upper()} format)"
        return (name + (" MoE" if self.moe else "") + (" 2:4" if self.sparse_24 else "")
                + (" sparse-compressed" if self.sparsity_compressed else "")
                + (f" + {self.kv_cache} KV" if self.kv_cache else ""))


def classify(config: dict, sparse_24: bool = False) -> CheckpointFormat:
    """A Hugging Face config.json -> format; `sparse_24`: the manifest found
    every pruned layer of the saved weights 2:4."""
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")
    q = config.get("quantization_config") or {}
    common = dict(dtype=dtype, sparse_24=sparse_24, sparsity_compressed=bool(q.get("sparsity_config")),
                  moe=is_moe(config), kv_cache=kv_cache_scheme(q.get("kv_cache_scheme")), head_dim=head_dim(config),
                  merged_parts=merged_parts(config), model_type=config.get("model_type"))
    if not q:
        return CheckpointFormat(**common)
    method = q.get("quant_method")
    groups = list((q.get("config_groups") or {}).values())
    zero_point = per_channel = False
    fp8 = None
    if groups:
        schemes = sorted({_scheme(g.get("weights") or {}, g.get("input_activations")) for g in groups})
        scheme = schemes[0] if len(schemes) == 1 else "+".join(schemes)
        weights = [g.get("weights") or {} for g in groups]
        zero_point = any(w.get("symmetric") is False for w in weights)
        per_channel = any(w.get("type", "int") == "int" and w.get("strategy") == "channel" for w in weights)
        fp8 = "+".join(sorted({_fp8_strategy(g.get("weights") or {}, g.get("input_activations")) for g in groups
                               if _scheme(g.get("weights") or {}, None) == FP8})) or None
    elif method in ("gptq", "awq"):
        scheme = _scheme({"num_bits": q.get("bits"), "type": "int"}, None)
        zero_point = q.get("sym") is False if method == "gptq" else q.get("zero_point", True) is not False
        per_channel = q.get("group_size") == -1
    elif method == "compressed-tensors":
        scheme = DENSE  # a sparsity-only config
    else:   # fp8 (vLLM's own FP8 format), bitsandbytes, modelopt ...: never dense, each judged by its own rule
        scheme = FP8 if method == "fp8" else str(method or "unknown")
        if method == "fp8":  # fp8.py (Fp8LinearMethod): per-tensor weights, activations too on a CPU, or blocks
            fp8 = FP8_BLOCK if q.get("weight_block_size") else FP8_PER_TENSOR
    saved = q if method == "compressed-tensors" else None
    return CheckpointFormat(scheme=scheme, method=method, zero_point=zero_point, per_channel=per_channel,
                            fp8=fp8, quantization_config=saved, **common)


def head_dim(config: dict) -> int | None:
    """The attention head size of a config.json (`head_dim`, else hidden_size /
    num_attention_heads, of the text model where it nests one); None when unknown."""
    text = config.get("text_config") or config
    heads = text.get("num_attention_heads")
    if not (isinstance(heads, int) and heads):
        return None
    size = text.get("head_dim") or (text.get("hidden_size") or 0) // heads
    return size if isinstance(size, int) and size > 0 else None


def merged_parts(config: dict) -> dict | None:
    """The output sizes of the layers vLLM merges (qkv_proj: q, then k and v;
    gate_up_proj: gate, then up) from a config.json's text model; a MoE's
    experts are fused otherwise, so its MLP is left out. None when unknown."""
    text = config.get("text_config") or config
    size, heads = head_dim(config), text.get("num_attention_heads")
    kv_heads = text.get("num_key_value_heads") or heads
    parts = {"q": heads * size, "k/v": kv_heads * size} if size and isinstance(kv_heads, int) else {}
    if isinstance(text.get("intermediate_size"), int) and not is_moe(config):
        parts["gate/up"] = text["intermediate_size"]
    return parts or None


def kv_cache_scheme(kv: dict | None) -> str | None:
    """compressed-tensors' `kv_cache_scheme` (QuantizationArgs of the k/v
    states) -> a short name: "fp8" (8-bit float, one static scale per layer,
    symmetric: llm-compressor's KV-cache examples), "fp8 per-head", "int8 asym", ..."""
    if not kv:
        return None
    bits, kind = kv.get("num_bits", 8), kv.get("type", "int")
    name = f"fp{bits}" if kind == "float" else f"{kind}{bits}"
    strategy = kv.get("strategy") or "tensor"
    if strategy != "tensor":
        name += " per-head" if strategy == "attn_head" else f" per-{strategy}"
    if kv.get("symmetric") is False:
        name += " asym"
    return name


def _scheme(weights: dict, activations: dict | None) -> str:
    bits, kind = weights.get("num_bits"), weights.get("type", "int")
    if kind == "float" and bits == 8:
        return FP8
    act_bits = (activations or {}).get("num_bits") or 16
    return {(8, 8): W8A8_INT8, (4, 16): W4A16, (8, 16): W8A16}.get((bits, act_bits), f"w{bits}a{act_bits}")


def _fp8_strategy(weights: dict, activations: dict | None) -> str:
    """One FP8 config group's strategy, as vLLM's compressed-tensors loader
    reads it (compressed_tensors.py: _is_fp8_w8a8, else W8A16Fp8, weight-only;
    compressed_tensors_w8a8_fp8.py: the scale keys it hands the kernel selection)."""
    acts = activations or {}
    if acts.get("type") != "float" or (not acts.get("dynamic") and acts.get("strategy", "tensor") != "tensor"):
        return FP8_WEIGHT_ONLY
    if weights.get("strategy") == "block":
        return FP8_BLOCK
    if weights.get("strategy", "tensor") == "tensor" and not acts.get("dynamic"):
        return FP8_PER_TENSOR
    return FP8_PER_TOKEN
