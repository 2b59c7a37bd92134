"""What both stages ask of a checkpoint's config.json."""


def is_quantized(config: dict) -> bool:
    """config.json declares its weights quantized (or compressed) already: a
    `quantization_config`, as llm-compressor, GPTQ, AWQ and bitsandbytes write."""
    return bool(config.get("quantization_config"))
