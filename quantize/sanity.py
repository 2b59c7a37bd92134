"""Accuracy sanity gates: is a quantized artifact still its base model?

The rules (format families, floors, conf/sanity/default.yaml) live in
quantize.common.sanity_rules, shared with the report. Quantize's check
(`Measure`, then sanity_rules.judge) runs the base and the quantized
model *in memory*: the base's logits on a few held-out windows right before
oneshot, the quantized model's right after it, before it is compressed and
saved. Why not reload the saved checkpoint: that costs a second model load
and decompression, and the in-memory model is the one oneshot made, with
its activation quantization in the forward pass (so W8A8 is judged as it
serves); the saved bytes are checked apart by `verify` (layout, finite
values) and, served, by evaluate's accuracy pass, which the report gates
again. KL is sensitivity's full-vocabulary KL (quantize.sensitivity.measure.KL);
the windows are heldout.windows of novels kept out of calibration."""
from dataclasses import dataclass, field

from quantize.common.sanity_rules import SanityConfig


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
