"""Can this engine serve this checkpoint on this machine, and in which dtype?

The facts come from quantize.common.machine (probed, never CPU model names); the
rules live with each engine (`Engine.supports`, `Engine.choose_dtype`); this
module names checkpoint formats and prints the table:

    python -m evaluate.capabilities            # this machine, formats x engines
    python -m evaluate.capabilities --probe    # ... and run every cell for real
    python -m evaluate.capabilities --machine avx2   # the rules for another kind
"""
import argparse
import json
import sys
from dataclasses import dataclass, replace

from quantize.common.machine import Machine
from quantize.common.moe import is_moe

DENSE, W8A8_INT8, W4A16, W8A16, FP8 = "dense", "w8a8_int8", "w4a16", "w8a16", "fp8"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""       # why not (or a caveat when ok)
    starts: bool = False   # a no that is about speed: the engine would start, too slowly to measure

    def __bool__(self) -> bool:
        return self.ok


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

    @property
    def label(self) -> str:
        name = {DENSE: f"dense {self.dtype}", W8A8_INT8: "W8A8 int8", W4A16: "W4A16",
                W8A16: "W8A16", FP8: "FP8"}.get(self.scheme, self.scheme.upper())
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
                  moe=is_moe(config), kv_cache=kv_cache_scheme(q.get("kv_cache_scheme")))
    if not q:
        return CheckpointFormat(**common)
    method = q.get("quant_method")
    groups = list((q.get("config_groups") or {}).values())
    zero_point = False
    if groups:
        schemes = sorted({_scheme(g.get("weights") or {}, g.get("input_activations")) for g in groups})
        scheme = schemes[0] if len(schemes) == 1 else "+".join(schemes)
        zero_point = any((g.get("weights") or {}).get("symmetric") is False for g in groups)
    elif method in ("gptq", "awq"):
        scheme = _scheme({"num_bits": q.get("bits"), "type": "int"}, None)
        zero_point = q.get("sym") is False if method == "gptq" else q.get("zero_point", True) is not False
    else:
        scheme = DENSE  # e.g. a sparsity-only compressed-tensors config
    return CheckpointFormat(scheme=scheme, method=method, zero_point=zero_point, **common)


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


# ---- the table --------------------------------------------------------------

TABLE_FORMATS = (
    CheckpointFormat(dtype="bfloat16"), CheckpointFormat(dtype="float16"), CheckpointFormat(dtype="float32"),
    CheckpointFormat(W8A8_INT8, method="compressed-tensors"),
    CheckpointFormat(W4A16, method="compressed-tensors"),
    CheckpointFormat(W8A16, method="compressed-tensors"),
    CheckpointFormat(FP8, method="compressed-tensors"),
    CheckpointFormat(W8A8_INT8, method="compressed-tensors", sparse_24=True),
    CheckpointFormat(W8A8_INT8, method="compressed-tensors", kv_cache="fp8"),  # as recipes/w8a8_kv8.yaml
    # Mixture-of-experts: quantized experts need fused-MoE kernels of their own.
    CheckpointFormat(moe=True),
    CheckpointFormat(W8A8_INT8, method="compressed-tensors", moe=True),
    CheckpointFormat(W4A16, method="compressed-tensors", moe=True),
    CheckpointFormat(W4A16, method="compressed-tensors", moe=True, zero_point=True),  # as the shipped int4 recipes
)

# Machines the rules are known for, to print the table of a kind you are not on.
# The vLLM op lists are what each kernel library was seen to hold.
KNOWN_MACHINES = {
    "avx2": Machine("x86_64", frozenset({"avx2"}), vllm_library="_C_AVX2",
                    vllm_ops=frozenset({"onednn_scaled_mm"})),
    "avx512": Machine("x86_64", frozenset({"avx2", "avx512f", "avx512_vnni"}), vllm_library="_C_AVX512",
                      vllm_ops=frozenset({"onednn_scaled_mm", "cpu_gemm_wna16"})),
    "avx512_bf16": Machine("x86_64", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}),
                           vllm_library="_C", vllm_ops=frozenset({"onednn_scaled_mm", "cpu_gemm_wna16",
                                                                  "fp8_scaled_mm_cpu"})),
    "amx": Machine("x86_64", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16",
                                        "amx_int8", "amx_tile"}), vllm_library="_C",
                   vllm_ops=frozenset({"onednn_scaled_mm", "cpu_gemm_wna16", "fp8_scaled_mm_cpu"}),
                   fp8_gemm="ref:any"),  # seen on an Intel Xeon with AMX (no AMX-FP8)
    "arm_bf16": Machine("aarch64", frozenset({"asimd", "bf16"})),
    "cuda_sm75": Machine("x86_64", frozenset({"avx2"}), cuda=((7, 5),)),
    "cuda_sm80": Machine("x86_64", frozenset({"avx2"}), cuda=((8, 0),)),
    "cuda_sm90": Machine("x86_64", frozenset({"avx2"}), cuda=((9, 0),)),
}


def engine_class(name: str):
    from evaluate import engines
    return engines.get(name)


def decide(engine: str, fmt: CheckpointFormat, machine: Machine, args: dict | None = None) -> tuple[Verdict, str]:
    """(verdict, dtype the engine would compute in) for one cell."""
    cls = engine_class(engine)
    args = dict(args or {})
    dtype = cls.choose_dtype(fmt, machine, args.get("dtype") or "auto")
    return cls.supports(fmt, machine, args | {"dtype": dtype}), dtype


def table(machine: Machine, probed: dict | None = None) -> str:
    """Markdown: formats x engines, each cell ✅/✗ with the dtype or reason."""
    from evaluate import engines
    names = engines.known()
    lines = [f"Machine: {machine.describe()}", "",
             "| format | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for fmt in TABLE_FORMATS:
        cells = []
        for engine in names:
            verdict, dtype = decide(engine, fmt, machine)
            text = f"✅ {dtype}" + (f" ({verdict.reason})" if verdict.reason else "") if verdict else f"✗ {verdict.reason}"
            if probed and (fmt.label, engine) in probed:
                text += " — probe: " + probed[(fmt.label, engine)]
            cells.append(text)
        lines.append(f"| {fmt.label} | " + " | ".join(cells) + " |")
    kv = replace(TABLE_FORMATS[0])
    verdict = engine_class("vllm").supports(kv, machine, {"kv_cache_dtype": "fp8"})
    lines += ["", "fp8 KV cache (`engine.args.kv_cache_dtype=fp8`) on vllm: "
              + ("✅" if verdict else f"✗ {verdict.reason}")]
    kv_fmt = CheckpointFormat(W8A8_INT8, method="compressed-tensors", kv_cache="fp8")
    cells = []
    for engine in names:
        verdict, dtype = decide(engine, kv_fmt, machine)
        kv_quant = engine_class(engine).kv_quant(kv_fmt, {"dtype": dtype})
        cells.append(f"{engine} " + (f"✅ KV {kv_quant}" if verdict else f"✗ {verdict.reason}"))
    lines.append(f"{kv_fmt.label} checkpoint (`kv_cache_dtype=auto`): " + "; ".join(cells))
    return "\n".join(lines)


def servable_recipes(recipes: list[str], overrides: list[str]) -> tuple[list[str], dict[str, str]]:
    """Which recipes evaluate's engine (as `overrides` configure it) could
    serve on this machine, judged from the format each recipe will give,
    before anything is quantized; and why not, for the others. A recipe whose
    format cannot be told is kept: quantize will say what is wrong with it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from evaluate import engines, target as target_mod
    from quantize.common import config
    from quantize.common.paths import CONF_DIR
    config.register()
    # Hydra's own keys (launcher, sweep dirs) do not change what is served.
    overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    overrides = config.open_pass_through_keys(config.expand_path_shorthands(overrides))
    servable, refused = [], {}
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for name in recipes:
            cfg = compose("evaluate", overrides + [f"recipe={name}"])
            target = target_mod.planned(cfg, target_mod.NotBuilt(name))
            engine_cfg = OmegaConf.to_container(cfg.engine, resolve=True)
            engine = engines.get(engine_cfg)
            verdict, _ = decide(engine_cfg["name"], target.format, engine.machine(),
                                engine_cfg.get("args")) if target else (YES, None)
            if verdict:
                servable.append(name)
            else:
                refused[name] = f"{engine_cfg['name']} cannot serve {target.format.label} here: {verdict.reason}"
    return servable, refused


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluate.capabilities", description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", choices=sorted(KNOWN_MACHINES),
                        help="print the rules for a known machine kind instead of this one")
    parser.add_argument("--probe", action="store_true",
                        help="build a tiny model in each format and run every cell for real "
                             "(a few minutes: one engine start per cell)")
    parser.add_argument("--cells", nargs="*", default=None, metavar="ENGINE:FORMAT",
                        help="with --probe, only these cells, e.g. vllm:w4a16 hf:dense_bfloat16")
    parser.add_argument("--json", action="store_true", help="print the machine facts as JSON")
    parser.add_argument("--servable", metavar="RECIPES",
                        help="print which of these recipes (a,b,c) evaluate's engine could serve here, "
                             "before quantizing them; the others go to stderr with the reason")
    parser.add_argument("overrides", nargs="*", help="with --servable, evaluate overrides (engine=..., model=...)")
    args = parser.parse_args(argv)
    if args.overrides and not args.servable:
        parser.error(f"unexpected arguments {' '.join(args.overrides)}; overrides go with --servable")
    if args.servable:
        from quantize.common.config import check_group_options
        from quantize.common.jobs import one_line
        from quantize.common.stdout import redirected_stdout
        check_group_options([f"recipe={args.servable}", *args.overrides])  # unknown names: one line, exit 2
        try:
            with redirected_stdout(2):  # llm-compressor and vLLM log to stdout; the answer alone goes there
                servable, refused = servable_recipes([r for r in args.servable.split(",") if r], args.overrides)
        except Exception as e:  # e.g. an override the evaluate config does not have
            print(f"error: {one_line(e)}", file=sys.stderr)
            return 2
        for name, why in refused.items():
            print(f"{name}: {why}", file=sys.stderr)
        print(",".join(servable))
        return 0
    if args.machine and args.probe:
        parser.error("--probe runs on this machine; drop --machine")
    if args.machine:
        machine = KNOWN_MACHINES[args.machine]
    else:
        from quantize.common.machine import detect
        machine = detect(vllm=True)
    if args.json:
        print(json.dumps(machine.facts(), indent=2))
        return 0
    probed = None
    if args.probe:
        from evaluate import probe
        from quantize.common.stdout import redirected_stdout
        with redirected_stdout(2):  # llm-compressor and vLLM log to stdout; the table alone goes there
            probed, disagreements = probe.run(machine, args.cells)
    print(table(machine, probed))
    if args.probe and disagreements:
        print(f"\n{len(disagreements)} cell(s) where the rules and the probe disagree: {', '.join(disagreements)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
