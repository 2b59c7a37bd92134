"""Accuracy sanity rules: when is a quantized artifact suspect? The one home
of the thresholds (conf/sanity/default.yaml, read into SanityConfig), the
format family of an artifact, and the two rules, shared by quantize's check
(quantize/sanity.py) and the report (evaluate/analysis/suspect.py):

- top-1 agreement with the base below its format family's floor;
- an accuracy recovery above 100 % by more than its measurement interval
  (a quantized model does not beat its base)."""
from dataclasses import dataclass

from quantize.common.errors import UserError
from quantize.common.extensions import check_scalar_fields
from quantize.common.settings import is_number, shown

FAMILIES = ("w8a8", "w8a16", "w4", "sparse_2of4", "other")


@dataclass(frozen=True)
class SanityConfig:
    """conf/sanity/default.yaml (the `sanity` group of quantize and the report)."""
    floors: dict[str, float]           # family -> minimum top-1 agreement with the base
    recovery_tolerance_pct: float = 2.0  # the least allowance of a recovery above 100 % (recovery_reason)
    enabled: bool = True               # quantize: measure against the base after oneshot
    strict: bool = False               # quantize: a suspect artifact fails the job instead of a WARNING
    text: str = "austen"
    books: tuple[str, ...] = ("prideprejudice", "persuasion")
    num_windows: int = 4
    window_len: int = 64

    @classmethod
    def from_config(cls, values: dict | None) -> "SanityConfig":
        values = dict(values or default_values())
        floors = dict(values.pop("floors", None) or {})
        unknown = sorted(set(floors) - set(FAMILIES))
        if unknown:
            raise UserError(f"sanity.floors has unknown format families {unknown}; use {list(FAMILIES)}")
        for name, value in floors.items():
            if not (is_number(value) and 0.0 <= value <= 1.0):
                raise UserError(f"sanity.floors.{name}={shown(value)}: each floor is a top-1 agreement between 0 and 1, "
                                f"e.g. sanity.floors.{name}=0.8")
        known = {f for f in cls.__dataclass_fields__} - {"floors"}
        extra = sorted(set(values) - known)
        if extra:
            raise UserError(f"unknown sanity setting(s) {extra}; known: {sorted(known | {'floors'})}")
        values = check_scalar_fields(cls, values, "sanity")
        if "books" in values:
            values["books"] = tuple(str(b) for b in values["books"] or ())
        if values.get("recovery_tolerance_pct", 0) < 0:
            raise UserError(f"sanity.recovery_tolerance_pct={values['recovery_tolerance_pct']}: pass a number "
                            "of % >= 0, e.g. sanity.recovery_tolerance_pct=2")
        config = cls(floors={str(k): float(v) for k, v in floors.items()}, **values)
        if config.num_windows < 1 or config.window_len < 2:
            raise UserError(f"sanity.num_windows={config.num_windows}, sanity.window_len={config.window_len}: "
                            "set at least 1 window of at least 2 tokens")
        if config.enabled and config.text == "austen" and not config.books:  # before the model loads
            raise UserError("sanity.books is empty; name at least one held-out book, e.g. sanity.books=[persuasion], "
                            "or pass sanity.enabled=false")
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
    the larger of its 95 % interval's half-width and recovery_tolerance_pct.
    The allowance never shrinks below the tolerance: repeated rows score the
    same windows, so their spread is near 0 and would make a second run strict."""
    if recovery_pct is None:
        return None
    tolerance = config.recovery_tolerance_pct
    allowed = tolerance if half_width_pct is None else max(tolerance, half_width_pct)
    if recovery_pct - allowed <= 100.0:
        return None
    how = (f"the {tolerance:g} % allowed (no interval measured)" if half_width_pct is None else
           f"{allowed:.1f} % (the larger of its 95 % interval, ±{half_width_pct:.1f}, and the {tolerance:g} % allowed)")
    return f"accuracy recovery {recovery_pct:.1f} % exceeds 100 % by more than {how}"


def judge(numbers: dict, quantization: dict | None, sparse: bool, config: SanityConfig) -> dict | None:
    """The manifest's `suspect` ({reason, family, floor}) when the top-1
    agreement is below its family's floor; None when it keeps it."""
    name = family(quantization, sparse)
    numbers["family"], numbers["floor"] = name, config.floor(name)
    reason = top1_reason(numbers["top1_agreement"], name, config)
    return {"reason": reason, "family": name, "floor": config.floor(name)} if reason else None
