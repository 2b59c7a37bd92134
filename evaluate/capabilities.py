"""Can this engine serve this checkpoint on this machine, and in which dtype?

The facts come from quantize.common.machine and each engine's own probe
(`Engine.machine`; never CPU model names); the rules live with each engine
(`Engine.supports`, `Engine.choose_dtype`); the formats they judge are named
in evaluate.formats. This module prints the table:

    python -m evaluate.capabilities            # this machine, formats x engines
    python -m evaluate.capabilities --probe    # ... and run every cell for real
    python -m evaluate.capabilities --machine avx2   # the rules for another kind
"""
import argparse
import json
import sys
from dataclasses import replace

from evaluate.formats import DENSE, FP8, W4A16, W8A8_INT8, W8A16, YES, CheckpointFormat, Verdict
from evaluate.engines.vllm_kernels import VllmKernels
from quantize.common.machine import Machine

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
# The vLLM op lists are what each CPU kernel library was seen to hold; the
# CUDA kinds are judged from the compute capability alone (vllm.py, _cuda_rule).
_CPU_OPS = frozenset({"onednn_scaled_mm", "cpu_gemm_wna16", "fp8_scaled_mm_cpu"})
_AVX512 = frozenset({"avx2", "avx512f", "avx512_vnni"})
KNOWN_MACHINES = {
    "avx2": Machine("x86_64", frozenset({"avx2"}), engines={
        "vllm": VllmKernels(library="_C_AVX2", ops=frozenset({"onednn_scaled_mm"}))}),
    "avx512": Machine("x86_64", _AVX512, engines={
        "vllm": VllmKernels(library="_C_AVX512", ops=frozenset({"onednn_scaled_mm", "cpu_gemm_wna16"}))}),
    "avx512_bf16": Machine("x86_64", _AVX512 | {"avx512_bf16"}, engines={
        "vllm": VllmKernels(library="_C", ops=_CPU_OPS)}),
    "amx": Machine("x86_64", _AVX512 | {"avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}, engines={
        "vllm": VllmKernels(library="_C", ops=_CPU_OPS, fp8_gemm="ref:any")}),  # an Intel Xeon with AMX, no AMX-FP8
    "arm_bf16": Machine("aarch64", frozenset({"asimd", "bf16"})),
    **{f"cuda_sm{a}{b}": Machine("x86_64", frozenset({"avx2"}), cuda=((a, b),))
       for a, b in ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0))},
}


def this_machine() -> Machine:
    """This machine, with what each engine of the table found out about
    itself here (vLLM: whether it imports, and its kernels)."""
    from evaluate import engines
    from quantize.common.machine import detect
    machine = detect()
    for name in engines.known():
        for key, facts in engine_class(name).machine().engines.items():
            machine = machine.with_engine(key, facts)
    return machine


def engine_class(name: str):
    from evaluate import engines
    return engines.get(name)


def decide(engine: str, fmt: CheckpointFormat, machine: Machine, args: dict | None = None) -> tuple[Verdict, str]:
    """(verdict, dtype the engine would compute in) for one cell."""
    cls = engine_class(engine)
    args = dict(args or {})
    dtype = cls.choose_dtype(fmt, machine, args.get("dtype") or "auto")
    return cls.supports(fmt, machine, args | {"dtype": dtype}), dtype


def table(machine: Machine, probed: dict | None = None, kind: str | None = None) -> str:
    """Markdown: formats x engines, each cell ✅/✗ with the dtype or reason.
    `kind`: the KNOWN_MACHINES name printed (its rules, as if every engine were installed)."""
    from evaluate import engines
    names = engines.known()
    header = f"Machine: {machine.describe()}"
    if kind:
        header += f" (the rules for `--machine {kind}`, as if every engine were installed)"
    lines = [header, "",
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
              + (("✅" + (f" ({verdict.reason})" if verdict.reason else "")) if verdict else f"✗ {verdict.reason}")]
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
        machine = this_machine()
    if args.json:
        print(json.dumps(machine.facts(), indent=2))
        return 0
    probed = None
    if args.probe:
        from evaluate import probe
        from quantize.common.stdout import redirected_stdout
        with redirected_stdout(2):  # llm-compressor and vLLM log to stdout; the table alone goes there
            probed, disagreements = probe.run(TABLE_FORMATS, lambda e, f: decide(e, f, machine), args.cells)
    print(table(machine, probed, kind=args.machine))
    if args.probe and disagreements:
        print(f"\n{len(disagreements)} cell(s) where the rules and the probe disagree: {', '.join(disagreements)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
