"""Narrow workarounds for upstream limitations, each applied only where needed."""
import logging

log = logging.getLogger("quantbench")


def allow_awq_without_accelerator() -> None:
    """llmcompressor 0.14's AWQModifier pins its activation cache in page-locked
    memory before every grid search; pinning needs an accelerator, so on a
    CPU-only machine it raises. Pinning only speeds up host-to-device copies,
    so skipping it changes no result. No-op when an accelerator exists."""
    import torch
    if torch.accelerator.is_available():
        return
    from llmcompressor.pipelines.cache import IntermediatesCache
    if getattr(IntermediatesCache.pin_memory, "_quantbench_noop", False):
        return

    def pin_memory(self, batch_index, input_names=None):
        return None

    pin_memory._quantbench_noop = True
    IntermediatesCache.pin_memory = pin_memory
    log.info("no accelerator: AWQ activation cache stays in pageable memory")
