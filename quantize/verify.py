"""Checks on a freshly quantized artifact, made on the *saved* checkpoint.

Two ways, chosen by `verify` in conf/quantize.yaml:
- `tensors` (default): the layout a loader expects, built without weights:
  the architecture in config.json on the meta device, given the checkpoint's
  quantization config by compressed-tensors, one module of each shape and
  scheme compressed for real (so packed shapes and dtypes are the library's
  own). Every tensor the checkpoint must hold is there at that shape and
  dtype (tied ones aside), nothing else is; every floating-point tensor
  (dense weights, scales) is finite and every scale positive (integer weights
  are finite by construction, so they are not read); for a pruning recipe the
  Linear weights are dequantized and must hold 2:4. Only the safetensors
  headers and the floating-point tensors are read. Checkpoint names are
  compared as transformers' loader renames them (GPT-NeoX stores lm_head as
  embed_out); where the loader merges stored tensors into one (per-expert
  weights into a fused tensor), the names cannot be compared one to one and
  the checkpoint is reloaded instead.
- `reload`: load the whole checkpoint in transformers, decompressed, and run
  a forward pass (slower, more memory; always used for a quantized MoE).
  transformers' loading report decides: a missing, unexpected or
  mismatched tensor is a RuntimeError (tied parameters, as the config ties
  them, and the names its conversion mapping renames are not). A quantized
  MoE is reloaded linearized, its names mapped the same way
  (quantize.common.moe.reload_dense).
Weight-file format checks: quantize.common.checkpoint."""
import copy
import json
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from quantize.common import hf_load
from quantize.common.checkpoint import load_renames, quantization_summary, raise_if_mismatched
from quantize.common.settings import shown

MODES = ("tensors", "reload")
# safetensors header dtype -> torch dtype name
DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
          "F8_E5M2": "float8_e5m2", "I8": "int8", "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64",
          "BOOL": "bool"}
FLOATS = {"bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"}


def mode(value) -> str | None:
    """The `verify` setting as a mode name, or None for no check; `true` is the default mode."""
    from quantize.common.errors import UserError
    if value is False or value is None or value == "none":
        return None
    if value is True:
        return MODES[0]
    if value in MODES:
        return value
    raise UserError(f"verify={shown(value)}: pass verify=tensors (check the saved tensors), verify=reload "
                    "(load in transformers and run it) or verify=false")


def check(artifact_dir: Path, how: str, prunes: bool) -> dict:
    """The checks of one mode on a saved artifact, for the manifest (its
    `verified_by` says which ran); a broken checkpoint raises RuntimeError
    naming what is wrong. A quantized MoE checkpoint is always reloaded: its
    per-expert layout comes from llm-compressor's linearization, which needs
    real tensors, not the meta device."""
    from quantize.common import moe
    artifact_dir = Path(artifact_dir)
    config = json.loads((artifact_dir / "config.json").read_text())
    if how == "reload" or (moe.is_moe(config) and config.get("quantization_config")):
        return check_reload(artifact_dir, prunes)
    return check_tensors(artifact_dir, prunes)


@dataclass(frozen=True)
class Layout:
    """What a loader expects the checkpoint to hold."""
    tensors: dict[str, tuple]  # name -> (shape, torch dtype name)
    schemes: dict[str, object]  # quantized module -> its compressed-tensors QuantizationScheme
    linears: set[str]          # Linear modules but lm_head (where 2:4 is checked)
    tied: set[str]             # tensors a checkpoint may leave out (tied to another)
    renames: tuple = ((), ())  # checkpoint.load_renames: stored names -> the model's


def check_tensors(artifact_dir: Path, prunes: bool) -> dict:
    layout = expected_layout(artifact_dir)
    headers = as_loaded(read_headers(artifact_dir), *layout.renames)
    if headers is None:
        return check_reload(artifact_dir, prunes)
    return _check_layout_and_values(artifact_dir, headers, layout, prunes)


def _check_layout_and_values(artifact_dir: Path, headers: dict, layout: Layout, prunes: bool) -> dict:
    problems = _layout_problems(headers, layout)
    floats = [n for n in headers if headers[n][1] in FLOATS]
    problems += _value_problems(headers, floats)
    raise_if_mismatched(artifact_dir, problems, what="saved checkpoint")
    checks = {"verified_by": "tensors", "layout_matches_model": True, "values_finite": True,
              "tensors_checked": len(headers), "tensors_read": len(floats)}
    if prunes:
        checks["sparsity"] = sparsity_report(_dense_linear_weights(headers, layout))
    return checks


def read_headers(artifact_dir: Path) -> dict[str, tuple]:
    """Stored tensor name -> (shape, torch dtype name, file, stored name), from the safetensors headers."""
    from safetensors import safe_open
    headers = {}
    for path in sorted(Path(artifact_dir).glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                info = f.get_slice(name)
                dtype = DTYPES.get(info.get_dtype(), info.get_dtype())
                headers[name] = (tuple(info.get_shape()), dtype, path, name)
    return headers


def as_loaded(headers: dict[str, tuple], renamings: list, converters: list) -> dict[str, tuple] | None:
    """`headers` keyed by the names transformers' loader gives the stored
    tensors (its renamings, in its order); None where a stored tensor is one
    the loader merges with others (a WeightConverter matches it)."""
    from transformers.core_model_loading import rename_source_key
    loaded = {}
    for stored, header in headers.items():
        name, merged_by = rename_source_key(stored, renamings, converters)
        if merged_by is not None:
            return None
        loaded[name] = header
    return loaded


def expected_layout(artifact_dir: Path) -> Layout:
    import torch
    config = hf_load.config(artifact_dir)
    q = getattr(config, "quantization_config", None)
    if q is not None:
        del config.quantization_config
    with torch.device("meta"):
        model = hf_load.causal_lm_from_config(config, dtype=getattr(config, "dtype", None))
    schemes = _apply_quantization(model, q) if q and q.get("quant_method") == "compressed-tensors" else {}
    persistent = set(model.state_dict())
    tensors, compressed = {}, {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if name in schemes:
            local = _compressed_layout(module, compressed)
        else:
            local = {k: v for k, v in _shapes(module).items() if prefix + k in persistent}
        tensors |= {prefix + k: v for k, v in local.items()}
    tied = {n for n in tensors if n.endswith("lm_head.weight")} if config.get_text_config().tie_word_embeddings else set()
    return Layout(tensors, schemes, {name for name, _ in linear_weights(model)}, tied, load_renames(model))


def _apply_quantization(model, q: dict) -> dict:
    """Attach the checkpoint's schemes to the meta model as a loader does; -> module -> scheme."""
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    apply_quantization_config(model, QuantizationConfig.model_validate(q), run_compressed=False)
    return {name: m.quantization_scheme for name, m in model.named_modules()
            if getattr(m, "quantization_scheme", None) is not None and hasattr(m, "weight")}


def _compressed_layout(module, seen: dict) -> dict:
    """The (shape, dtype) of each tensor compressed-tensors saves for this
    module: one module per (type, scheme, shapes) is materialized and compressed."""
    import torch
    from compressed_tensors.compressors.base import compress_module
    key = (type(module), module.quantization_scheme.model_dump_json(), tuple(sorted(_shapes(module).items())))
    if key not in seen:
        real = copy.deepcopy(module).to_empty(device="cpu")
        for name, t in _tensors(real).items():  # copy_: float8 has no fill_
            t.copy_(torch.full(t.shape, 1 if name.endswith("scale") else 0))
        compress_module(real)
        seen[key] = _shapes(real)
    return seen[key]


def _tensors(module) -> dict:
    from compressed_tensors.utils import get_direct_state_dict
    return {k: t for k, t in get_direct_state_dict(module).items() if t is not None}


def _shapes(module) -> dict:
    return {k: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for k, t in _tensors(module).items()}


def _layout_problems(headers: dict, layout: Layout) -> list[str]:
    problems = [f"missing tensor {n}" for n in sorted(set(layout.tensors) - set(headers) - layout.tied)]
    problems += [f"unexpected tensor {n}" for n in sorted(set(headers) - set(layout.tensors))]
    for name in sorted(set(headers) & set(layout.tensors)):
        (shape, dtype), (want_shape, want_dtype) = headers[name][:2], layout.tensors[name]
        if (shape, dtype) != (want_shape, want_dtype):
            problems.append(f"{name} is {dtype} {shape}, the model needs {want_dtype} {want_shape}")
    return problems


def _value_problems(headers: dict, names: list[str]) -> list[str]:
    """Floating-point tensors must be finite, scales also positive."""
    import torch
    problems = []
    with _reader(headers) as read:
        for name in names:
            t = read(name)
            t = t.float() if t.element_size() == 1 else t  # float8 has no isfinite / comparisons
            if not bool(torch.isfinite(t).all()):
                problems.append(f"{name} holds non-finite values")
            elif name.endswith("scale") and not bool((t > 0).all()):
                problems.append(f"{name} holds a scale <= 0")
    return problems


@contextmanager
def _reader(headers: dict):
    """read(name) -> the tensor, from whichever file holds it under its stored name."""
    from safetensors import safe_open
    with ExitStack() as stack:
        files = {path: stack.enter_context(safe_open(path, "pt")) for _, _, path, _ in headers.values()}
        yield lambda name: files[headers[name][2]].get_tensor(headers[name][3])


def _dense_linear_weights(headers: dict, layout: Layout):
    """(name, dense weight) of every Linear but lm_head, quantized ones
    decompressed by compressed-tensors: the 2:4 check's input, one at a time."""
    import torch
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.compressors.format import infer_module_format
    with _reader(headers) as read:
        for module in sorted(layout.linears):
            tensors = {n.rpartition(".")[2]: read(n) for n in headers if n.rpartition(".")[0] == module}
            scheme = layout.schemes.get(module)
            if scheme is not None:
                fmt = scheme.format or infer_module_format(torch.nn.Linear, scheme)
                compressor = BaseCompressor.get_value_from_registry(getattr(fmt, "value", fmt))
                tensors = compressor.decompress(tensors, scheme)
            yield module, tensors["weight"]


def check_reload(artifact_dir: Path, prunes: bool) -> dict:
    import torch
    model = reload_dense(artifact_dir)
    checks = {"verified_by": "reload", "reloads_in_transformers": True}
    with torch.no_grad():
        logits = model(input_ids=torch.arange(1, 17).unsqueeze(0)).logits
    checks["logits_finite"] = bool(torch.isfinite(logits).all())
    if not checks["logits_finite"]:
        raise RuntimeError(f"reloaded checkpoint in {artifact_dir} produces non-finite logits")
    if prunes:
        checks["sparsity"] = sparsity_report(linear_weights(model))
    return checks


def reload_dense(artifact_dir: Path):
    """Load the checkpoint with transformers, decompressed to dense weights."""
    from quantize.common import moe
    if moe.needs_own_loader(artifact_dir):  # per-expert tensors, nn.Linear subclasses: see quantize/common/moe.py
        return moe.reload_dense(artifact_dir)
    kwargs = {}
    if quantization_summary(artifact_dir).method == "compressed-tensors":
        from transformers import CompressedTensorsConfig
        kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    model, report = hf_load.causal_lm(artifact_dir, dtype="auto", output_loading_info=True, **kwargs)
    _raise_on_loading_problems(artifact_dir, report)
    return model


def _raise_on_loading_problems(artifact_dir: Path, report: dict) -> None:
    """transformers' loading report (its renamings and converters applied,
    tied parameters not counted as missing) as a RuntimeError naming what
    does not fit: a tensor left out would be initialised at random."""
    problems = [f"missing tensor {n}" for n in sorted(report.get("missing_keys") or ())]
    problems += [f"unexpected tensor {n}" for n in sorted(report.get("unexpected_keys") or ())]
    problems += [f"{m[0]} is {tuple(m[1])}, the model needs {tuple(m[2])}" if len(m) == 3 else f"mismatched {m}"
                 for m in sorted(report.get("mismatched_keys") or (), key=str)]
    raise_if_mismatched(artifact_dir, problems)


def linear_weights(model):
    """(name, weight) of every Linear of a loaded model but lm_head."""
    import torch
    return [(name, module.weight.detach()) for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head")]


def sparsity_report(weights, n: int = 2, m: int = 4) -> dict:
    """Measured sparsity of pruned Linear weights and whether each holds n:m.

    `weights`: (layer name, 2-D weight) pairs. A layer counts as pruned when at
    least a third of its weights are exactly zero (dense trained weights have
    almost none); every group of m consecutive input weights in a pruned layer
    must hold at least n zeros."""
    zeros = total = 0
    pruned, broken = [], []
    worst = 1.0
    for name, w in weights:
        is_zero = w == 0
        if is_zero.float().mean().item() < 1 / 3 or w.shape[1] % m:
            continue
        pruned.append(name)
        zeros += int(is_zero.sum())
        total += w.numel()
        groups_ok = (is_zero.reshape(w.shape[0], -1, m).sum(-1) >= n).float().mean().item()
        worst = min(worst, groups_ok)
        if groups_ok < 1.0:
            broken.append(name)
    return {
        "pattern": f"{n}:{m}",
        "pruned_layers": len(pruned),
        "measured_sparsity": round(zeros / total, 6) if total else 0.0,
        "all_layers_hold_pattern": bool(pruned) and not broken,
        "layers_breaking_pattern": broken,
        "worst_layer_groups_ok": round(worst, 6) if pruned else None,
    }
