"""Which layers of a compressed-tensors checkpoint vLLM has a scheme for,
asked of vLLM's own scheme matching before any engine starts.

vLLM picks a scheme per linear layer while it builds the model in its engine
core (compressed_tensors.py: CompressedTensorsConfig.get_quant_method ->
get_scheme -> _get_scheme_from_parts). That choice depends on the config
group a layer falls into (its weight / input / output quantization args and
its storage format), never on the layer's shape or name beyond matching it to
a group; a group with no scheme fails the start with "No compressed-tensors
compatible scheme was found for layer_name=...". So each config group is put
through the same functions here, with the checkpoint's quantization_config:
a group vLLM would reject is known without loading a weight. The choice is
the same on a CPU and on a CUDA host (no platform branch in it); on CUDA,
get_scheme's capability floor (_check_scheme_supported) is asked too, through
the GPU's compute capability (vLLM reads it without starting CUDA).

Not asked here: the fused-MoE path (experts go through
CompressedTensorsMoEMethod, judged by the MoE rules in vllm.py) and kernel
choices that depend on a layer's shape (create_weights), which come later.
"""
import copy
import logging
from dataclasses import dataclass

log = logging.getLogger("quantbench.evaluate")

# What vLLM's scheme matching raises for a group it cannot serve.
_REJECTIONS = (NotImplementedError, ValueError, RuntimeError)


@dataclass(frozen=True)
class UnservedGroup:
    """A config group of the checkpoint that vLLM's loader has no scheme for."""
    group: str                  # its name in quantization_config.config_groups
    targets: tuple[str, ...]    # the layers it holds: names, regexes or module classes
    storage_format: str         # how its weights are stored (compressed-tensors' `format`)
    reason: str                 # vLLM's own message, first line

    def describe(self) -> str:
        """One line: the layers, vLLM's reason, and what to do instead."""
        return (f"vLLM has no compressed-tensors scheme for the layers of {self.group} "
                f"(targets {', '.join(self.targets)}; weights stored as {self.storage_format!r}): {self.reason}; "
                "engine=hf serves it; for vLLM, quantize these layers into a format vLLM has a scheme for, "
                "or leave them out (the recipe's ignore: list)")


def unserved_groups(quantization_config: dict) -> list[UnservedGroup] | None:
    """The config groups vLLM would reject at start-up; None where the installed
    vLLM cannot be asked (not installed, or its scheme matching has another shape)."""
    if quantization_config.get("quantization_status") == "initialized":
        # a recipe's plan (evaluate.target.planned): how its weights will be stored is decided when
        # llm-compressor saves them (format "fakequant" until then), so there is nothing to match yet
        return []
    try:
        from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
            CompressedTensorsConfig)
        config = CompressedTensorsConfig.from_config(copy.deepcopy(quantization_config))
        schemes = config.target_scheme_map
        pick, floor = config._get_scheme_from_parts, config._check_scheme_supported
    except Exception as e:  # another vLLM, or none: the engine's own start says what is wrong
        log.debug("vLLM's compressed-tensors scheme matching not asked: %s", e)
        return None
    groups = quantization_config.get("config_groups") or {}
    unserved = []
    for group, spec in groups.items():
        targets = tuple(spec.get("targets") or ())
        asked = [t for t in targets if t in schemes]  # vLLM drops attention-only groups (KV-cache scales)
        if not asked:
            continue
        parts = schemes[asked[0]]
        storage = parts.get("format") or config.quant_format
        try:
            reason = _rejection(pick, floor, parts, storage, layer_name=asked[0])
        except Exception as e:  # noqa: BLE001 (a vLLM whose _get_scheme_from_parts takes other arguments,
            # or a scheme that reads the engine's config as it is built, FP8's: known only inside a start)
            log.debug("vLLM's compressed-tensors scheme matching not asked: %s", e)
            return None
        if reason:
            unserved.append(UnservedGroup(group, targets, str(storage), reason))
    return unserved


def _rejection(pick, floor, parts: dict, storage: str, layer_name: str) -> str | None:
    """vLLM's reason for refusing one group's scheme, or None where it has one."""
    if parts.get("weights") is None:
        return None  # an unquantized layer: vLLM's UnquantizedLinearMethod
    try:
        scheme = pick(weight_quant=parts["weights"], input_quant=parts.get("input_activations"),
                      output_quant=parts.get("output_activations"), format=storage, layer_name=layer_name)
        floor(scheme.get_min_capability())
    except _REJECTIONS as e:
        # vLLM's message goes on with the whole QuantizationArgs repr: the layer and the class of error say it
        return f"{type(e).__name__}: {_first_line(e).partition(', weight_quant=')[0]}"
    return None


def _first_line(e: BaseException) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), "")
