"""vLLM's tensor parallelism: which sizes a model can be split into, and
`engine.args.tensor_parallel_size=auto`.

`auto` is resolved once, before the engine starts (evaluate/pipeline.py
`_plan`, through `VllmEngine.resolve_args`, which vllm_server inherits), and
the number replaces it in the engine args. So every row records the size that
ran, and the setup id is made from that number, not from `auto`: `auto` and
the same size typed out are one setup and their rows compare, while the same
`auto` in a job given other GPUs (a Slurm job with 2, then one with 4) is
another setup, measured anew rather than averaged with the first.

The sizes vLLM accepts, from the CUDA build of vLLM 0.32.0:
- `tp` divides the attention heads: `ModelConfig.verify_with_parallel_config`
  (vllm/config/model.py) raises "Total number of attention heads (..) must be
  divisible by tensor parallel size (..)" at start-up;
- `tp` divides the KV heads, or the KV heads divide `tp` (each KV head then
  replicated on tp/kv ranks): `QKVParallelLinear.__init__`
  (vllm/model_executor/layers/linear.py) calls `divide(total_num_kv_heads,
  tp_size)` or `divide(tp_size, total_num_kv_heads)`, which assert;
- `tp` divides the MLP's intermediate size: `ColumnParallelLinear.__init__`
  (`divide(output_size, tp_size)`) and `RowParallelLinear.__init__`
  (`divide(input_size, tp_size)`), same file.
"""
import logging
from dataclasses import dataclass

from quantize.common.settings import is_integer, shown

log = logging.getLogger("quantbench.evaluate")

AUTO = "auto"
KEY = "tensor_parallel_size"


def ranks(args: dict) -> int:
    """The workers (GPUs on CUDA) engine args split a model across: tensor x pipeline parallel size."""
    return int(args.get(KEY) or 1) * int(args.get("pipeline_parallel_size") or 1)


@dataclass(frozen=True)
class Split:
    """The sizes of a model that tensor parallelism divides (None: unknown)."""
    heads: int | None
    kv_heads: int | None
    intermediate: int | None

    @classmethod
    def of(cls, model_config: dict) -> "Split":
        """From config.json; a multimodal model's language part (text_config)
        where the top level has no heads."""
        cfg = model_config
        if "num_attention_heads" not in cfg and isinstance(cfg.get("text_config"), dict):
            cfg = cfg["text_config"]
        heads = _count(cfg.get("num_attention_heads"))
        # No num_key_value_heads: one KV head per attention head (multi-head attention), as in HF and vLLM.
        return cls(heads, _count(cfg.get("num_key_value_heads")) or heads, _count(cfg.get("intermediate_size")))

    def problem(self, tp: int) -> str | None:
        """What vLLM would refuse a size `tp` for, or None."""
        if self.heads and self.heads % tp:
            return f"does not divide the model's {self.heads} attention heads"
        if self.kv_heads and self.kv_heads % tp and tp % self.kv_heads:
            return f"and the model's {self.kv_heads} KV heads do not divide one another"
        if self.intermediate and self.intermediate % tp:
            return f"does not divide the model's MLP size ({self.intermediate})"
        return None

    def sizes(self, most: int) -> list[int]:
        """The sizes up to `most` vLLM can split this model into."""
        return [n for n in range(1, most + 1) if self.problem(n) is None]

    def describe(self) -> str:
        return f"{self.heads} attention heads, {self.kv_heads} KV heads" if self.heads else "unknown heads"


def resolve(args: dict, model_config: dict, machine) -> dict:
    """`{"tensor_parallel_size": n}` for args asking `auto` (the count that
    runs on `machine`), else {} (an explicit size is checked by config_problem)."""
    if not _is_auto(args.get(KEY)):
        return {}
    split = Split.of(model_config)
    gpus = len(machine.cuda)
    if not gpus:
        # No accelerators to count. vLLM-CPU runs one process per rank, each bound
        # to a NUMA node of its own (rank_binding in evaluate/engines/vllm.py), so
        # its ranks share this host's cores and memory bandwidth: a larger size
        # only splits them, and each rank allocates its own KV cache (TP 2 took
        # 11.7 GB against 6.6 GB, README "Tensor parallelism on a CPU host").
        # Where several NUMA nodes make it pay, the size is asked for explicitly.
        tp = 1
    else:
        # The visible GPUs (CUDA_VISIBLE_DEVICES, a Slurm job's allocation), down
        # to the largest count the model splits into.
        tp = max(split.sizes(gpus))
        log.info("engine.args.tensor_parallel_size=auto: %d of %d visible GPU(s) (%s)",
                 tp, gpus, split.describe())
    return {KEY: tp}


def config_problem(model_config: dict, args: dict) -> str | None:
    """A one-line error for a size vLLM would refuse at start-up, naming the
    sizes that work, or None."""
    value = args.get(KEY)
    if _is_auto(value):
        return None  # resolve() makes it a size that fits
    tp = 1 if value is None else _count(value)
    if tp is None:  # int() made 2.5 a 2 and true a 1, and the error then named a size not asked for
        return f"engine.args.{KEY}={shown(value)} is not a count; use a whole number >= 1, or {AUTO}"
    split = Split.of(model_config)
    why = split.problem(tp) if tp > 1 else None
    if why is None:
        return None
    sizes = split.sizes(max(tp, split.heads or tp))
    return f"engine.args.{KEY}={tp} {why}; use one of {', '.join(map(str, sizes[:6]))}, or {AUTO}"


def _is_auto(value) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def _count(value) -> int | None:
    return value if is_integer(value) and value > 0 else None
