"""The measurement: each cell (one Linear module of one decoder layer)
fake-quantized alone, KL(original || quantized) over held-out windows.

Speed: the original model runs once, recording each decoder layer's input
and call arguments; a cell in layer L reruns only layers L.. from that
record, so the 210 cells of a 30-layer model cost about half of 210 full
forward passes. The final norm and the output head follow the layers as in
the model's own forward (checked once against the model's logits)."""
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass

from quantize.common.errors import UserError
from quantize.common.progress import duration
from quantize.common.sensitivity_file import Cell
from quantize.sensitivity import scheme as schemes

log = logging.getLogger("quantbench.sensitivity")


@dataclass(frozen=True)
class Group:
    """One cell's modules: `name` inside its layer (e.g. self_attn.q_proj)."""
    layer: int
    name: str
    modules: dict  # full module name -> torch.nn.Linear

    @property
    def params(self) -> int:
        return sum(m.weight.numel() for m in self.modules.values())


def decoder_layers(model):
    """(name, layer) of the model's decoder layers, in order."""
    import torch
    base = model.base_model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not isinstance(getattr(base, "norm", None), torch.nn.Module):
        raise UserError(f"{type(model).__name__} keeps no decoder layers at .layers and final norm at .norm of its "
                        "base model; sensitivity measures models laid out as Llama, Qwen, Mistral")
    prefix = next(name for name, module in model.named_modules() if module is layers)
    return [(f"{prefix}.{i}", layer) for i, layer in enumerate(layers)]


def groups(model, scheme: schemes.WeightScheme) -> list[Group]:
    """The Linear modules the scheme quantizes inside each decoder layer
    (the recipe's targets, minus its ignore list), in the layer's order."""
    import torch
    from compressed_tensors.utils.match import match_named_modules
    targeted = {name: m for name, m in match_named_modules(model, scheme.targets, scheme.ignore)
                if isinstance(m, torch.nn.Linear)}
    found = []
    for index, (prefix, _) in enumerate(decoder_layers(model)):
        for name, module in targeted.items():
            if name.startswith(prefix + "."):
                found.append(Group(index, name.removeprefix(prefix + "."), {name: module}))
    if not found:
        raise UserError(f"the recipe's targets {scheme.targets} (ignore {scheme.ignore}) match no Linear module "
                        "inside the decoder layers; pass a recipe that quantizes them")
    return found


@contextmanager
def quantized(group_list: list[Group], weight_args):
    """The groups' weights fake-quantized for the duration; restored after."""
    import torch
    originals = {}
    with torch.no_grad():
        try:
            for group in group_list:
                for name, module in group.modules.items():
                    originals[name] = (module, module.weight.data)
                    module.weight.data = schemes.fake_quantize(module.weight.data, weight_args)
            yield
        finally:
            for module, weight in originals.values():
                module.weight.data = weight


class LayerwiseModel:
    """The model run from a recorded decoder-layer input onwards, on fixed windows."""

    def __init__(self, model, windows: list[list[int]]):
        import torch
        self.model = model
        self.layers = [layer for _, layer in decoder_layers(model)]
        self.norm = model.base_model.norm
        self.head = model.get_output_embeddings()
        self.ids = torch.tensor(windows, device=model.device)
        self.inputs: list = [None] * len(self.layers)
        self.calls: list = [None] * len(self.layers)
        self.reference_logits = self._record()
        self._check_replay()

    def _record(self):
        """The original model's logits, recording each layer's input on the way."""
        import torch

        def record(index, module, args, kwargs):
            kwargs = dict(kwargs)
            hidden = args[0] if args else kwargs.pop("hidden_states")
            self.inputs[index], self.calls[index] = hidden, (args[1:], kwargs)

        hooks = [layer.register_forward_pre_hook(lambda m, a, k, i=i: record(i, m, a, k), with_kwargs=True)
                 for i, layer in enumerate(self.layers)]
        try:
            with torch.inference_mode():
                return self.model(self.ids, use_cache=False).logits[:, :-1]
        finally:
            for hook in hooks:
                hook.remove()

    def logits_from(self, start: int):
        """Logits predicting each window's tokens 2.., running layers start..end."""
        import torch
        with torch.inference_mode():
            hidden = self.inputs[start]
            for index in range(start, len(self.layers)):
                args, kwargs = self.calls[index]
                out = self.layers[index](hidden, *args, **kwargs)
                hidden = out[0] if isinstance(out, tuple) else out
            return self.head(self.norm(hidden[:, :-1]))

    def logits(self):
        """The whole model's logits (as the reference), with the weights it has now."""
        return self.logits_from(0)

    def _check_replay(self) -> None:
        replayed = self.logits_from(0).float()
        reference = self.reference_logits.float()
        gap = float((replayed - reference).abs().max())
        if gap > 1e-3 * max(1.0, float(reference.abs().max())):
            raise UserError(f"{type(self.model).__name__}'s forward does more than decoder layers, norm and output "
                            f"head (replayed logits differ by {gap:.3g}); sensitivity cannot measure this architecture")

    def work(self, layer: int) -> int:
        """A cell's cost in weights touched: layers layer.. plus the head."""
        return sum(p.numel() for p in self._params(layer)) + self.head.weight.numel()

    def _params(self, layer: int):
        for module in self.layers[layer:]:
            yield from module.parameters()


class KL:
    """KL(reference || q) in nats per scored token, over the full vocabulary,
    in float32 (log_softmax), one window at a time. The reference's
    probabilities and negative entropy are computed once, so a cell costs one
    log_softmax and one weighted sum: KL = sum p log p - sum p log q."""

    def __init__(self, reference_logits):
        import torch
        log_ps = [torch.log_softmax(w.float(), dim=-1) for w in reference_logits]
        self.probs = [log_p.exp() for log_p in log_ps]
        self.neg_entropy = float(sum((p * log_p).sum() for p, log_p in zip(self.probs, log_ps)))
        self.tokens = sum(w.shape[0] for w in self.probs)

    def __call__(self, logits) -> float:
        import torch
        cross = 0.0
        for p, window in zip(self.probs, logits):
            cross += float((p * torch.log_softmax(window.float(), dim=-1)).sum())
        return (self.neg_entropy - cross) / self.tokens


def measure(runner: LayerwiseModel, cells: list[Group], weight_args) -> tuple[list[Cell], float]:
    """Every cell's KL, and the KL with every cell quantized at once."""
    kl = KL(runner.reference_logits)
    work = {layer: runner.work(layer) for layer in {c.layer for c in cells}}
    total, done, start = sum(work[c.layer] for c in cells), 0, time.perf_counter()
    measured = []
    for k, cell in enumerate(cells, 1):
        with quantized([cell], weight_args):
            value = kl(runner.logits_from(cell.layer))
        measured.append(Cell(layer=cell.layer, group=cell.name, modules=list(cell.modules), kl=value,
                             params=cell.params))
        done += work[cell.layer]
        if k == len(cells) or cells[k].layer != cell.layer:
            _progress(k, len(cells), time.perf_counter() - start, done / total)
    with quantized(cells, weight_args):
        baseline = kl(runner.logits())
    return measured, baseline


def _progress(k: int, n: int, elapsed: float, fraction: float) -> None:
    eta = elapsed * (1 - fraction) / fraction if fraction else 0.0
    log.info("sensitivity: %d/%d cells, elapsed %s, ETA %s", k, n, duration(elapsed), duration(eta))
