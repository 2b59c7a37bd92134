"""Can this engine serve this checkpoint on this machine, and in which dtype?

The facts come from quantize.common.machine and each engine's own probe
(`Engine.machine`; never CPU model names); the rules live with each engine
(`Engine.supports`, `Engine.choose_dtype`); the formats they judge are named
in evaluate.formats. This module holds the table and prints it, taking
Hydra overrides like the stages (conf/capabilities.yaml):

    python -m evaluate.capabilities                  # this machine, formats x engines
    python -m evaluate.capabilities probe=true       # ... and run every cell for real
    python -m evaluate.capabilities machine=avx2     # the rules for another kind
    python -m evaluate.capabilities servable=[original,w4a16_gptq] engine=hf   # what evaluate could serve
"""
import json
import sys
from dataclasses import dataclass, replace

import hydra

from evaluate.formats import (DENSE, FP8, FP8_BLOCK, FP8_PER_TENSOR, FP8_PER_TOKEN, W4A16, W8A8_INT8, W8A16, YES,
                              CheckpointFormat, Verdict)
from evaluate.engines.vllm_kernels import KERNELS_BY_CPU_KIND, VllmKernels
from quantize.common.errors import UserError
from quantize.common.hf_load import detach_stdin
from quantize.common.machine import Machine
from quantize.common.paths import CONF_DIR
from quantize.common.settings import flag

# ---- the table --------------------------------------------------------------

TABLE_FORMATS = (
    CheckpointFormat(dtype="bfloat16"), CheckpointFormat(dtype="float16"), CheckpointFormat(dtype="float32"),
    CheckpointFormat(W8A8_INT8, method="compressed-tensors"),
    CheckpointFormat(W4A16, method="compressed-tensors"),
    CheckpointFormat(W4A16, method="compressed-tensors", zero_point=True),  # as recipes/w4a16_gptq.yaml
    CheckpointFormat(W8A16, method="compressed-tensors", per_channel=True),  # as recipes/w8a16_awq.yaml
    CheckpointFormat(FP8, method="compressed-tensors", fp8=FP8_PER_TOKEN),   # as recipes/fp8_dynamic.yaml
    CheckpointFormat(FP8, method="compressed-tensors", fp8=FP8_PER_TENSOR),  # llm-compressor's FP8 preset (static)
    CheckpointFormat(FP8, method="compressed-tensors", fp8=FP8_BLOCK),       # its FP8_BLOCK preset
    CheckpointFormat(W8A8_INT8, method="compressed-tensors", sparse_24=True),
    CheckpointFormat(W8A8_INT8, method="compressed-tensors", kv_cache="fp8"),  # as recipes/w8a8_kv8.yaml
    # Mixture-of-experts: quantized experts need fused-MoE kernels of their own.
    CheckpointFormat(moe=True),
    CheckpointFormat(W8A8_INT8, method="compressed-tensors", moe=True),
    CheckpointFormat(W4A16, method="compressed-tensors", moe=True),
    CheckpointFormat(W4A16, method="compressed-tensors", moe=True, zero_point=True),  # as the shipped int4 recipes
)

CUDA_RULES_FILE = "evaluate/engines/vllm_cuda_rules.py"   # named under a CUDA machine's table

# Machines the rules are known for, to print the table of a kind you are not on.
# An x86 kind carries what vLLM's kernel library was seen to hold there; the
# CUDA kinds are judged from the compute capability alone (vllm_cuda_rules.py).
_AVX512 = frozenset({"avx2", "avx512f", "avx512_vnni"})
_X86_KINDS = {"avx2": frozenset({"avx2"}), "avx512": _AVX512, "avx512_bf16": _AVX512 | {"avx512_bf16"},
              "amx": _AVX512 | {"avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}}  # amx: an Intel Xeon, no AMX-FP8
KNOWN_MACHINES = {
    **{kind: Machine("x86_64", isa, engines={"vllm": KERNELS_BY_CPU_KIND[kind]}) for kind, isa in _X86_KINDS.items()},
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
    dtype = cls.choose_dtype(fmt, machine, args)
    return cls.supports(fmt, machine, args | {"dtype": dtype}), dtype


def table(machine: Machine, probed: dict | None = None, kind: str | None = None) -> str:
    """Markdown: formats x engines, each cell ✅/✗ with the dtype or reason.
    `kind`: the KNOWN_MACHINES name printed (its rules, as if every engine were installed)."""
    from evaluate import engines
    names = engines.known()
    header = f"Machine: {machine.describe()}"
    if kind:
        header += f" (the rules for `machine={kind}`, as if every engine were installed)"
    lines = [header, "",
             "| format | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for fmt in TABLE_FORMATS:
        cells = []
        for engine in names:
            verdict, dtype = decide(engine, fmt, machine)
            text = f"✅ {dtype}" + (f" ({verdict.reason})" if verdict.reason else "") if verdict else f"✗ {verdict.reason}"
            if verdict and engine == "vllm" and machine.cuda:
                text += _seen_starting(machine, fmt)
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
    if machine.cuda:
        lines += ["", *_cuda_rules_lines(machine, kind)]
    return "\n".join(lines)


def _seen_starting(machine: Machine, fmt: CheckpointFormat) -> str:
    """A vLLM cell's mark where a start on a GPU confirmed its rule."""
    from evaluate.engines.vllm_cuda_rules import machine_release, rules_for
    seen = rules_for(machine_release(machine)).seen(machine.min_cuda_capability, fmt.label)
    return f" — seen starting on an {seen.gpu} ({seen.date})" if seen else ""


def _cuda_rules_lines(machine: Machine, kind: str | None) -> list[str]:
    """Which vLLM release's CUDA rules the vllm column applies, how they are
    known, and where starts on a GPU of this capability confirmed some."""
    from evaluate.engines.vllm_cuda_rules import RULES, machine_release, rules_for
    cc = machine.min_cuda_capability
    rules = rules_for(machine_release(machine))
    lines = [f"vllm column: vLLM {rules.release}'s CUDA rules ({CUDA_RULES_FILE}), {rules.basis}"
             + (f"; {rules.note}." if rules.note else ".")]
    for other in RULES.values():
        for seen in other.observed:
            if seen.capability != cc:
                continue
            where = f"an {seen.gpu}, {seen.date}, {seen.record}; {seen.kernels}"
            if other.release == rules.release:
                lines.append(f"Marked \"seen starting\": vLLM {other.release} started them on sm{cc[0]}{cc[1]} as "
                             f"these rules say ({where}).")
            else:
                command = f"python -m evaluate.capabilities machine={kind or 'cuda_sm%d%d' % cc} " \
                          f"vllm_release={other.release}"
                lines.append(f"Seen starting with vLLM {other.release} on sm{cc[0]}{cc[1]}: "
                             f"{', '.join(seen.labels)} ({where}); `{command}` shows its rules.")
    return lines


def servable_recipes(recipes: list[str], overrides: list[str]) -> tuple[list[str], dict[str, str]]:
    """Which recipes evaluate's engine (as `overrides` configure it) could
    serve on this machine, judged from the format each recipe will give,
    before anything is quantized; and why not, for the others. A recipe whose
    format cannot be told is kept: quantize will say what is wrong with it."""
    from hydra import compose, initialize_config_dir
    from evaluate import engines, target
    from evaluate.config import target_config
    from quantize.common import config
    from quantize.common.paths import CONF_DIR
    config.register()
    # Hydra's own keys (launcher, sweep dirs) do not change what is served.
    overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    overrides = config.open_pass_through_keys(config.expand_path_shorthands(overrides))
    servable, refused = [], {}
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for name in recipes:
            cfg = compose("evaluate", overrides + config.expand_path_shorthands([f"recipe={name}"]))  # a name or a file
            # converted at once: what the recipe would give, and the engine that would serve it
            planned, engine = target.planned(target_config(cfg), target.NotBuilt(name)), engines.build(cfg.engine)
            verdict, _ = decide(engine.name, planned.format, engine.engine.machine(),
                                engine.args) if planned else (YES, None)
            if verdict:
                servable.append(name)
            else:
                refused[name] = f"{engine.name} cannot serve {planned.format.label} here: {verdict.reason}"
    return servable, refused


# ---- the command line ----------------------------------------------------------

CONFIG_NAME = "capabilities"   # conf/capabilities.yaml: its keys, then the evaluate config
OWN_KEYS = ("machine", "probe", "cells", "json", "servable", "vllm_release")
LIST_KEYS = ("cells", "servable")
# The argparse flags of the previous release, each with the override it became;
# None: takes no value (the override sets true). Kept for one release.
LEGACY_FLAGS = {"--machine": "machine=", "--probe": None, "--cells": "cells=", "--json": None,
                "--servable": "servable="}


@dataclass(frozen=True)
class Request:
    """What one `python -m evaluate.capabilities` call asks (conf/capabilities.yaml), typed."""
    machine: str | None = None                 # a KNOWN_MACHINES kind; None: this machine
    probe: bool = False
    cells: tuple[str, ...] | None = None       # with probe: only these ENGINE:FORMAT cells
    facts_as_json: bool = False
    vllm_release: str | None = None            # a CUDA machine judged by this vLLM release's rules
    servable: tuple[str, ...] | None = None    # recipes to judge before quantizing them
    evaluate_overrides: tuple[str, ...] = ()   # the command line's evaluate overrides (servable's engine, model)

    @classmethod
    def from_cfg(cls, cfg, overrides: list[str]) -> "Request":
        """The composed config and the overrides it came from -> the request;
        a combination that asks nothing sensible is one UserError line."""
        request = cls(machine=None if cfg.machine is None else str(cfg.machine), probe=flag("probe", cfg.probe),
                      cells=_names(cfg.cells), facts_as_json=flag("json", cfg.json), servable=_names(cfg.servable),
                      vllm_release=None if cfg.vllm_release is None else str(cfg.vllm_release),
                      evaluate_overrides=tuple(o for o in overrides if _key(o) not in OWN_KEYS))
        request.check()
        return request

    def check(self) -> None:
        if self.machine is not None and self.machine not in KNOWN_MACHINES:
            raise UserError(f"unknown machine {self.machine!r}; choose from {', '.join(sorted(KNOWN_MACHINES))} "
                            "(or leave machine= out for this one)")
        if self.machine and self.probe:
            raise UserError("probe=true runs on this machine; drop machine=")
        if self.vllm_release is not None:
            self._check_vllm_release()
        asked = [o for o in self.evaluate_overrides if not _key(o).startswith("hydra")]
        if asked and self.servable is None:
            raise UserError(f"unexpected arguments {' '.join(asked)}; evaluate overrides go with "
                            "servable=[<recipe>,...]")

    def _check_vllm_release(self) -> None:
        from evaluate.engines.vllm_cuda_rules import releases_read
        read = releases_read()
        if self.vllm_release not in read:
            raise UserError(f"vllm_release={self.vllm_release} is not a release the CUDA rules were read from; "
                            f"use one of {', '.join(read)}")
        if not (self.machine or "").startswith("cuda_"):
            raise UserError("vllm_release= picks the CUDA rules: add machine=cuda_sm<NN>, e.g. machine=cuda_sm90")

    def known_machine(self) -> Machine:
        """The KNOWN_MACHINES kind asked for, judged by `vllm_release`'s rules where one is named."""
        machine = KNOWN_MACHINES[self.machine]
        if self.vllm_release:
            machine = machine.with_engine("vllm", VllmKernels(release=self.vllm_release))
        return machine


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def _names(value) -> tuple[str, ...] | None:
    """A list key as given: [a,b], or a string a,b."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return tuple(item.strip() for item in items if item.strip())


def modern_overrides(argv: list[str]) -> list[str]:
    """The command line with each flag of the previous release rewritten to
    its override, and one line on stderr giving the new spelling."""
    from quantize.common.config import warn_old_spelling
    out, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        flag, eq, inline = arg.partition("=")
        if flag not in LEGACY_FLAGS:
            out.append(arg)
            continue
        values = [inline] if eq else []
        if flag == "--cells":  # took every name after it, e.g. --cells vllm:W4A16 hf:W4A16
            while rest and not rest[0].startswith("-") and "=" not in rest[0]:
                values.append(rest.pop(0))
        elif LEGACY_FLAGS[flag] is not None and not eq and rest:
            values.append(rest.pop(0))
        if LEGACY_FLAGS[flag] is None:
            override = f"{flag[2:]}=true"
        elif flag in ("--cells", "--servable"):
            override = LEGACY_FLAGS[flag] + f"[{','.join(values)}]"
        else:
            override = LEGACY_FLAGS[flag] + "".join(values)
        warn_old_spelling(" ".join([flag, *values]), f"write {override}")
        out.append(override)
    return out


def as_lists(overrides: list[str]) -> list[str]:
    """`servable=a,b` (a sweep to Hydra) means the list [a,b], as `--servable a,b` did."""
    out = []
    for override in overrides:
        key, eq, value = override.partition("=")
        unquoted = value and value[0] not in "[\"'"
        out.append(f"{key}=[{value}]" if eq and key in LIST_KEYS and unquoted and "," in value else override)
    return out


def compose_request(overrides: list[str]) -> Request:
    """conf/capabilities.yaml composed with the command line, converted once."""
    from hydra import compose, initialize_config_dir
    from quantize.common import config
    from quantize.common.paths import CONF_DIR
    config.register()
    composed = config.open_pass_through_keys(config.expand_path_shorthands(overrides))
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(CONFIG_NAME, composed)
    return Request.from_cfg(cfg, overrides)


def answer(request: Request) -> int:
    """Print what `request` asks; the exit status."""
    if request.servable is not None:
        return print_servable(request)
    machine = request.known_machine() if request.machine else this_machine()
    if request.facts_as_json:
        print(json.dumps(machine.facts(), indent=2))
        return 0
    probed, disagreements = None, []
    if request.probe:
        from evaluate import probe
        from quantize.common.stdout import redirected_stdout
        cells = list(request.cells) if request.cells else None
        with redirected_stdout(2):  # llm-compressor and vLLM log to stdout; the table alone goes there
            probed, disagreements = probe.run(TABLE_FORMATS, lambda e, f: decide(e, f, machine), cells)
    print(table(machine, probed, kind=request.machine))
    if disagreements:
        print(f"\n{len(disagreements)} cell(s) where the rules and the probe disagree: {', '.join(disagreements)}",
              file=sys.stderr)
        return 1
    return 0


def print_servable(request: Request) -> int:
    """The servable recipes, comma-separated, alone on stdout; why not the others on stderr."""
    from quantize.common.jobs import one_line
    from quantize.common.stdout import redirected_stdout
    try:
        with redirected_stdout(2):  # llm-compressor and vLLM log to stdout; the answer alone goes there
            servable, refused = servable_recipes(list(request.servable), list(request.evaluate_overrides))
    except Exception as e:  # e.g. a recipe whose composition fails
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    for name, why in refused.items():
        print(f"{name}: {why}", file=sys.stderr)
    print(",".join(servable))
    return 0


_asked_through_hydra: list[Request] = []   # what _hydra_main's jobs asked, answered once Hydra is done


@hydra.main(config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3")
def _hydra_main(cfg) -> None:
    """Hydra's own flags (--cfg job, --config-dir ...) go through its main; --help is answered before."""
    from hydra.core.hydra_config import HydraConfig
    try:
        _asked_through_hydra.append(Request.from_cfg(cfg, list(HydraConfig.get().overrides.task)))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code) from None


def run_hydra_main(overrides: list[str]) -> int:
    """Hydra's main on these arguments (it reads sys.argv); then the answer to
    what it composed, outside Hydra's app (servable= composes configs of its own)."""
    from hydra.core.global_hydra import GlobalHydra
    from quantize.common import config
    config.register()
    argv = sys.argv
    sys.argv = [argv[0], *config.open_pass_through_keys(config.expand_path_shorthands(overrides))]
    try:
        _hydra_main()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()
    requests = list(_asked_through_hydra)
    _asked_through_hydra.clear()
    return max((answer(request) for request in requests), default=0)


def main(argv: list[str] | None = None) -> int:
    """`python -m evaluate.capabilities [key=value ...]`; the exit status (2: bad input)."""
    from quantize.common.cli_help import print_help_if_asked
    from quantize.common import hydra_errors
    from quantize.common.config import check_group_options
    from quantize.common.jobs import one_line
    overrides = as_lists(modern_overrides(list(sys.argv[1:] if argv is None else argv)))
    if print_help_if_asked(CONFIG_NAME, overrides):
        return 0
    recipes = [o.partition("=")[2].strip("[]") for o in overrides if _key(o) == "servable"]
    check_group_options([f"recipe={names}" for names in recipes if names] + overrides)  # unknown names: exit 2
    if any(arg.startswith("-") for arg in overrides):
        return run_hydra_main(overrides)
    try:
        hydra_errors.check_no_value_replaces_keys(CONFIG_NAME, overrides)
        request = compose_request(overrides)
    except Exception as e:  # an override the config does not have, a bad value: one line
        said = hydra_errors.as_user_error(e, "evaluate.capabilities", CONFIG_NAME, overrides) or e
        print(f"error: {one_line(said)}", file=sys.stderr)
        return 2
    return answer(request)


if __name__ == "__main__":
    detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    from quantize.common.jobs import run_command
    run_command(main, "evaluate.capabilities", CONFIG_NAME)
