"""Accuracy sanity gates: is a quantized artifact still its base model?

One home for the rules that quantize and the report both apply
(conf/sanity/default.yaml holds the thresholds and why):

- the format family of an artifact (`family`): w8a8 (8-bit weights and
  activations, int8 or FP8), w8a16, w4 (4-bit or fewer weights), sparse_2of4
  (a 2:4-pruned checkpoint, whatever its scheme), other;
- the floor of top-1 agreement with the base each family is expected to keep;
- the report's second rule: an accuracy recovery above 100 % by more than its
  measurement interval (a quantized model does not beat its base).

Quantize's check (`Measure`, then `judge`) runs the base and the quantized
model *in memory*: the base's logits on a few held-out windows right before
oneshot, the quantized model's right after it, before it is compressed and
saved. Why not reload the saved checkpoint: that costs a second model load
and decompression, and the in-memory model is the one oneshot made, with
its activation quantization in the forward pass (so W8A8 is judged as it
serves); the saved bytes are checked apart by `verify` (layout, finite
values) and, served, by evaluate's accuracy pass, which the report gates
again. KL is sensitivity's full-vocabulary KL (quantize.sensitivity.measure.KL);
the windows are heldout.windows of novels kept out of calibration."""
import logging
from dataclasses import dataclass, field

from quantize.common.errors import UserError

log = logging.getLogger("quantbench.quantize")

FAMILIES = ("w8a8", "w8a16", "w4", "sparse_2of4", "other")


@dataclass(frozen=True)
class SanityConfig:
    """conf/sanity/default.yaml (the `sanity` group of quantize and the report)."""
    floors: dict[str, float]           # family -> minimum top-1 agreement with the base
    recovery_tolerance_pct: float = 2.0  # a single accuracy run's allowance above 100 % (no interval)
    enabled: bool = True               # quantize: measure against the base after oneshot
    strict: bool = False               # quantize: a suspect artifact fails the job instead of a WARNING
    text: str = "austen"
    books: tuple[str, ...] = ("prideprejudice", "persuasion")
    num_windows: int = 4
    window_len: int = 64

    @classmethod
    def from_config(cls, values: dict | None) -> "SanityConfig":
        values = dict(values or default_values())
        floors = {str(k): float(v) for k, v in (values.pop("floors", None) or {}).items()}
        unknown = sorted(set(floors) - set(FAMILIES))
        if unknown:
            raise UserError(f"sanity.floors has unknown format families {unknown}; use {list(FAMILIES)}")
        if any(not 0.0 <= v <= 1.0 for v in floors.values()):
            raise UserError(f"sanity.floors {floors}: each floor is a top-1 agreement between 0 and 1")
        known = {f for f in cls.__dataclass_fields__} - {"floors"}
        extra = sorted(set(values) - known)
        if extra:
            raise UserError(f"unknown sanity setting(s) {extra}; known: {sorted(known | {'floors'})}")
        if "books" in values:
            values["books"] = tuple(str(b) for b in values["books"] or ())
        config = cls(floors=floors, **values)
        if config.num_windows < 1 or config.window_len < 2:
            raise UserError(f"sanity.num_windows={config.num_windows}, sanity.window_len={config.window_len}: "
                            "set at least 1 window of at least 2 tokens")
        return config

    def floor(self, family_name: str) -> float | None:
        return self.floors.get(family_name, self.floors.get("other"))


def default_values() -> dict:
    """conf/sanity/default.yaml as plain values: the report's floors when no config is given."""
    import yaml

    from quantize.common.paths import CONF_DIR
    return yaml.safe_load((CONF_DIR / "sanity" / "default.yaml").read_text())


def family(quantization: dict | None, sparse: bool = False) -> str:
    """The format family of a checkpoint from its manifest's `quantization`
    (a dict as manifests and rows hold it): its narrowest weight scheme
    decides; `sparse` (2:4 held) overrides the scheme."""
    if sparse:
        return "sparse_2of4"
    schemes = (quantization or {}).get("schemes") or []
    weights = [s.get("weights") or {} for s in schemes]
    bits = [int(w["num_bits"]) for w in weights if w.get("num_bits")]
    if not bits:
        return "other"
    if min(bits) <= 4:
        return "w4"
    if min(bits) == 8:
        activations = any((s.get("activations") or {}).get("num_bits") for s in schemes)
        return "w8a8" if activations else "w8a16"
    return "other"


def top1_reason(top1: float | None, family_name: str, config: SanityConfig) -> str | None:
    """Why a top-1 agreement is suspect for its family, or None."""
    floor = config.floor(family_name)
    if top1 is None or floor is None or top1 >= floor:
        return None
    return f"top-1 agreement with the base {top1:.3f} < {floor:.2f}, the floor of {family_name}"


def recovery_reason(recovery_pct: float | None, half_width_pct: float | None, config: SanityConfig) -> str | None:
    """Why an accuracy recovery is suspect, or None: above 100 % by more than
    its 95 % interval's half-width (several runs), else by more than
    recovery_tolerance_pct (one run: no interval measured)."""
    if recovery_pct is None:
        return None
    allowed = config.recovery_tolerance_pct if half_width_pct is None else half_width_pct
    if recovery_pct - allowed <= 100.0:
        return None
    how = (f"its 95 % interval (±{half_width_pct:.1f})" if half_width_pct is not None
           else f"the {config.recovery_tolerance_pct:g} % allowed for one run")
    return f"accuracy recovery {recovery_pct:.1f} % exceeds 100 % by more than {how}"


@dataclass
class Measure:
    """The base model's logits on held-out windows, taken before oneshot,
    then compared with the quantized model's (`compare`)."""
    windows: list[list[int]]
    reference: list = field(default_factory=list)  # per window: [window_len - 1, vocab] logits
    # wall time (s) of the "base" and "quantized" passes; "total" with the text, windows and scores
    seconds: dict = field(default_factory=dict)
    error: str | None = None  # the forward pass failed: the check is skipped

    @classmethod
    def failed(cls, error: Exception) -> "Measure":
        what = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        return cls([], error=f"the model's forward pass failed ({what})")

    @classmethod
    def before(cls, model, tokenizer, config: SanityConfig) -> "Measure":
        import time

        from quantize.common.heldout import held_out_text, windows
        start = time.perf_counter()
        text = held_out_text(config.text, list(config.books), key="sanity.text")
        wins = windows(tokenizer, text, config.num_windows, config.window_len, group="sanity")
        measure = cls(wins)
        measure.reference = measure._timed(model, "base")
        measure.seconds["total"] = time.perf_counter() - start
        return measure

    def compare(self, model) -> dict:
        """checks.sanity: top-1 agreement and KL (nats/token) of the model now against the base."""
        import time

        from quantize.sensitivity.measure import KL
        if self.error:
            return {"skipped": self.error}
        start = time.perf_counter()
        logits = self._timed(model, "quantized")
        agree = sum(int((r.argmax(-1) == q.argmax(-1)).sum()) for r, q in zip(self.reference, logits))
        tokens = sum(r.shape[0] for r in self.reference)
        kl = max(KL(self.reference)(logits), 0.0)  # float rounding can take an exact 0 below it
        self.seconds["total"] = self.seconds.get("total", 0.0) + time.perf_counter() - start
        return {"top1_agreement": round(agree / tokens, 4), "kl_divergence": round(kl, 5),
                "windows": len(self.windows), "window_len": len(self.windows[0]), "scored_tokens": tokens,
                "wall_s": round(self.seconds["total"], 2),
                "pass_s": {k: round(v, 2) for k, v in self.seconds.items() if k != "total"}}

    def _timed(self, model, name: str) -> list:
        import time

        import torch
        start = time.perf_counter()
        device = next(model.parameters()).device
        device = "cpu" if device.type == "meta" else device  # offloaded: its hooks move the inputs
        with torch.inference_mode():  # one batch: the windows are all window_len long
            logits = model(torch.tensor(self.windows, device=device), use_cache=False).logits[:, :-1]
        out = list(logits.float().cpu())
        self.seconds[name] = time.perf_counter() - start
        return out


def judge(numbers: dict, quantization: dict | None, sparse: bool, config: SanityConfig) -> dict | None:
    """The manifest's `suspect` ({reason, family, floor}) when the top-1
    agreement is below its family's floor; None when it keeps it."""
    name = family(quantization, sparse)
    numbers["family"], numbers["floor"] = name, config.floor(name)
    reason = top1_reason(numbers["top1_agreement"], name, config)
    return {"reason": reason, "family": name, "floor": config.floor(name)} if reason else None
