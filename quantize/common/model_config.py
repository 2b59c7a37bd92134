"""What both stages ask of a checkpoint's config.json."""
import json
from pathlib import Path

from quantize.common.errors import UserError


def read(checkpoint: Path) -> dict:
    """config.json's object; one line for a file that holds none (truncated, a list, not UTF-8)."""
    path = Path(checkpoint) / "config.json"
    try:
        config = json.loads(path.read_text())
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise UserError(f"{path} is corrupt (not valid JSON: {e}); re-copy or re-create the checkpoint") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} holds a JSON {type(config).__name__}, not the object of a model config; "
                        "re-copy or re-create the checkpoint")
    return config


def is_quantized(config: dict) -> bool:
    """config.json declares its weights quantized (or compressed) already: a
    `quantization_config`, as llm-compressor, GPTQ, AWQ and bitsandbytes write."""
    return bool(config.get("quantization_config"))


def context_length(config: dict) -> int | None:
    """The longest sequence the model's positions cover: max_position_embeddings,
    or what a rope scaling declared in config.json stretches them to (its
    factor times original_max_position_embeddings, else times
    max_position_embeddings). None where config.json does not say."""
    text = config if "max_position_embeddings" in config else config.get("text_config") or {}
    positions = text.get("max_position_embeddings")
    if not isinstance(positions, int):
        return None
    scaling = text.get("rope_scaling") or text.get("rope_parameters")
    if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) in (None, "default"):
        return positions
    factor, original = scaling.get("factor"), scaling.get("original_max_position_embeddings")
    if not isinstance(factor, (int, float)) or factor <= 1:
        return positions
    return max(positions, int((original if isinstance(original, int) else positions) * factor))
