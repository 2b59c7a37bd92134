"""Bounds on one evaluate job's work (conf/evaluate.yaml `limits:`), checked
before any engine starts. A typo such as runs=100000 (about 12 h) or
scenario.batch_size=100000 (memory grows until the OOM killer ends it) is one
line naming the `limits.*` key that allows it on purpose."""
from dataclasses import dataclass

from evaluate.engines import parallel
from evaluate.memory import kv_bytes_per_token, rank_memory_bytes
from evaluate.precision import RunPlan
from evaluate.scenarios import Scenario
from quantize.common.errors import UserError
from quantize.common.settings import is_integer, shown

AUTO = "auto"
# The share of one rank's memory (RAM, or one GPU's) that the weights and a
# batch's KV cache may fill under limits.batch_tokens=auto: the rest is the
# engine's own (activations, allocator, the OS).
MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class Limits:
    """The most work one scenario may ask for; None: no bound."""
    runs: int | None              # timed runs (runs, max_runs) and warm-up runs (warmup_runs, max_warmup_runs)
    batch_size: int | None        # requests in one batch
    batch_tokens: int | str | None  # batch_size x (input_len + output_len); AUTO: what memory holds

    @classmethod
    def from_group(cls, values: dict | None) -> "Limits":
        values = values or {}
        return cls(runs=_bound(values, "runs"), batch_size=_bound(values, "batch_size"),
                   batch_tokens=_bound(values, "batch_tokens", auto=True))

    def check_plan(self, plan: RunPlan) -> None:
        """Every run count of `plan` within limits.runs."""
        counts = {"runs": plan.runs, "max_runs": plan.max_runs if plan.auto else None,
                  "warmup_runs": plan.warmup_runs,
                  "max_warmup_runs": plan.max_warmup_runs if plan.warmup_runs is None else None}
        for key, count in counts.items():
            if self.runs is not None and count is not None and count > self.runs:
                raise UserError(f"{key}={count} is past limits.runs={self.runs} runs per scenario; lower it, "
                                f"or pass limits.runs={count} to run that many on purpose")

    def check_batch_sizes(self, scenarios: list[Scenario]) -> None:
        """Every batch scenario within limits.batch_size."""
        for s in scenarios:
            if self.batch_size is not None and s.batch_size > self.batch_size:
                raise UserError(f"scenario {s.name}: batch_size={s.batch_size} is past limits.batch_size="
                                f"{self.batch_size}; lower its batch_size, or pass limits.batch_size="
                                f"{s.batch_size} to run it on purpose")

    def check_batch_tokens(self, scenarios: list[Scenario], target, args: dict, machine, engine) -> None:
        """Every batch scenario within limits.batch_tokens (auto: the KV cache
        that fits beside the weights in MEMORY_SHARE of one rank's memory, as
        `engine` holds both (tokens_in_memory); no bound for a remote
        engine's unknown machine)."""
        allowed = self.batch_tokens
        if allowed == AUTO:
            allowed = None if engine.remote else tokens_in_memory(target, args, machine, engine)
        for s in scenarios:
            if allowed is not None and s.kv_tokens > allowed:
                raise UserError(f"scenario {s.name}: batch_size x (input_len + output_len) = {s.kv_tokens} tokens "
                                f"is past {self._tokens_bound(allowed)}; lower its batch_size or lengths, "
                                f"or pass limits.batch_tokens={s.kv_tokens} to run it on purpose")

    def _tokens_bound(self, allowed: int) -> str:
        if self.batch_tokens != AUTO:
            return f"limits.batch_tokens={allowed}"
        return (f"limits.batch_tokens=auto ({allowed} tokens: the KV cache that fits beside the weights in "
                f"{MEMORY_SHARE:.0%} of this machine's memory)")


def tokens_in_memory(target, args: dict, machine, engine) -> int | None:
    """The tokens whose KV cache fits beside the weights in MEMORY_SHARE of
    one rank's memory (a GPU's: its share of the weights and of the KV heads;
    on a CPU every rank shares this machine's memory, so all of both), each
    as `engine` holds it computing in args["dtype"] (Engine.kv_itemsize,
    Engine.weight_bytes: not the size on disk, which a bf16 checkpoint run
    in float32 doubles); None where the model's KV layout or the memory is
    unknown."""
    per_token = kv_bytes_per_token(target.config, engine.kv_itemsize(target.format, args), args)
    cuda = bool(machine.cuda)
    memory = rank_memory_bytes(cuda)
    if not per_token or not memory:
        return None
    ranks, held = parallel.ranks(args), engine.weight_bytes(target, args)
    weights, per_token = (held / ranks, per_token) if cuda else (held, per_token * ranks)
    return max(0, int((MEMORY_SHARE * memory - weights) // per_token))


def _bound(values: dict, key: str, auto: bool = False) -> int | str | None:
    value = values.get(key)
    if value is None or (auto and value == AUTO):
        return value
    if is_integer(value) and value >= 1:
        return value
    choices = "an integer >= 1, auto (from memory)" if auto else "an integer >= 1"
    raise UserError(f"limits.{key}={shown(value)}: pass {choices}, or null for no bound")
