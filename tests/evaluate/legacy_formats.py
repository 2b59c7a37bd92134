"""Legacy int4 checkpoints (AutoGPTQ and AutoAWQ layouts) written from a dense
model by round-to-nearest, plus the dense model holding exactly the weights
those checkpoints decode to. evaluate must serve such checkpoints (many on the
hub are in these formats); the two auto-* quantizers themselves need CUDA or
an old transformers, so the tests write the layouts directly.

Both store 4-bit values packed eight to an int32 and fp16 group scales:
- GPTQ (checkpoint_format "gptq", symmetric): qweight [in/8, out] packed along
  the input dim, value i of a word in bits 4i..4i+3; qzeros [groups, out/8]
  hold zero - 1 (the v1 convention) = 7; g_idx [in] = group of each input.
- AWQ (version "gemm", with zero points): qweight [in, out/8] and qzeros
  [groups, out/8] packed along the output dim in AWQ's interleaved order:
  word bits 4i..4i+3 hold column AWQ_ORDER[i] of the eight.
Decoded weight = (q - zero) * scale.
"""
import json
from pathlib import Path

BITS = 4
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _quantize(w, group_size: int, sym: bool):
    """w [out, in] float -> (q [out, in] ints in 0..15, scale [out, groups], zero [out, groups])."""
    import torch
    out_f, in_f = w.shape
    g = w.float().reshape(out_f, in_f // group_size, group_size)
    if sym:
        scale = (g.abs().amax(-1) / 7.5).clamp(min=1e-8)
        zero = torch.full_like(scale, 8)
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15).clamp(min=1e-8)
        zero = torch.round(-lo / scale).clamp(0, 15)
    scale = scale.half().float()  # the checkpoint stores fp16 scales: decode with those
    q = torch.clamp(torch.round(g / scale[..., None]) + zero[..., None], 0, 15)
    return q.reshape(out_f, in_f).int(), scale, zero.int()


def _pack_rows(values, order=tuple(range(8))):
    """Pack along dim 0: [n, m] ints -> [n/8, m] int32, word bits 4i.. = row order[i]."""
    import torch
    v = values.to(torch.int64).reshape(-1, 8, values.shape[1])
    word = sum(v[:, order[i]] << (BITS * i) for i in range(8))
    return (word - ((word >> 31) << 32)).to(torch.int32)  # reinterpret uint32 as int32


def _pack_cols(values, order=tuple(range(8))):
    return _pack_rows(values.t().contiguous(), order).t().contiguous()


def _gptq_tensors(q, scale, zero, group_size: int) -> dict:
    import torch
    in_f = q.shape[1]
    return {"qweight": _pack_rows(q.t().contiguous()),
            "qzeros": _pack_cols((zero - 1).t().contiguous()),
            "scales": scale.t().contiguous().half(),
            "g_idx": (torch.arange(in_f) // group_size).to(torch.int32)}


def _awq_tensors(q, scale, zero, group_size: int) -> dict:
    return {"qweight": _pack_cols(q.t().contiguous(), AWQ_ORDER),
            "qzeros": _pack_cols(zero.t().contiguous(), AWQ_ORDER),
            "scales": scale.t().contiguous().half()}


def write_legacy(dense_dir: Path, fmt: str, out: Path, decoded_out: Path, group_size: int = 64) -> None:
    """Write `fmt` ("gptq" | "awq") of the dense checkpoint to `out`, and the
    dense checkpoint of the weights it decodes to (fp16) to `decoded_out`."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    state = load_file(str(dense_dir / "model.safetensors"))
    quantized, decoded = {}, {}
    for name, w in state.items():
        layer = name.removesuffix(".weight")
        if not layer.endswith(LINEAR_SUFFIXES):
            quantized[name] = decoded[name] = w.half()
            continue
        q, scale, zero = _quantize(w, group_size, sym=(fmt == "gptq"))
        pack = _gptq_tensors if fmt == "gptq" else _awq_tensors
        quantized |= {f"{layer}.{k}": v for k, v in pack(q, scale, zero, group_size).items()}
        decoded[name] = ((q - zero.repeat_interleave(group_size, 1)) *
                         scale.repeat_interleave(group_size, 1)).half()
    config = json.loads((dense_dir / "config.json").read_text()) | {"dtype": "float16"}
    quant = ({"quant_method": "gptq", "bits": BITS, "group_size": group_size, "desc_act": False,
              "sym": True, "checkpoint_format": "gptq"} if fmt == "gptq" else
             {"quant_method": "awq", "bits": BITS, "group_size": group_size, "zero_point": True,
              "version": "gemm"})
    tokenizer = AutoTokenizer.from_pretrained(dense_dir)
    for folder, tensors, cfg in ((out, quantized, config | {"quantization_config": quant}),
                                 (decoded_out, decoded, config)):
        folder.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        tokenizer.save_pretrained(folder)
