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


# Where configs without max_position_embeddings give their positions (the
# attributes transformers maps it to: GPT2Config.n_positions, DbrxConfig.max_seq_len,
# ...; n_ctx in older GPT-2 files; seq_length in ChatGLM's and Qwen's).
OTHER_POSITION_KEYS = ("n_positions", "n_ctx", "max_seq_len", "seq_length", "max_sequence_length",
                       "max_seq_length", "seq_len", "model_max_length")


def context_length(config: dict) -> int | None:
    """The longest sequence the model's positions cover: max_position_embeddings
    (else the fewest of OTHER_POSITION_KEYS, as vLLM serves it), or what a rope
    scaling declared in config.json stretches them to (its factor times
    original_max_position_embeddings, else times those positions). None where
    config.json does not say."""
    text = config if _declared_positions(config) is not None else config.get("text_config") or {}
    positions = _declared_positions(text)
    if positions is None:
        return None
    scaling = text.get("rope_scaling") or text.get("rope_parameters")
    if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) in (None, "default"):
        return positions
    factor, original = scaling.get("factor"), scaling.get("original_max_position_embeddings")
    if not isinstance(factor, (int, float)) or factor <= 1:
        return positions
    return max(positions, int((original if isinstance(original, int) else positions) * factor))


def _declared_positions(config: dict) -> int | None:
    """max_position_embeddings when config.json gives it, else the fewest its other keys give."""
    if isinstance(positions := config.get("max_position_embeddings"), int):
        return positions
    others = [v for k in OTHER_POSITION_KEYS if isinstance(v := config.get(k), int) and not isinstance(v, bool)]
    return min(others, default=None)
