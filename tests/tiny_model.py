"""The tests' name for quantize.tiny_model."""
from quantize.tiny_model import build_tiny_llama  # noqa: F401
