"""What both stages ask of a checkpoint's config.json."""


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
