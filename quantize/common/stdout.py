"""The process's stdout (file descriptor 1), sent elsewhere for a while: for
libraries that print there from C (oneDNN's verbose lines) or log there
(llm-compressor, vLLM), where sys.stdout swaps would not reach them."""
import os
import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def redirected_stdout(fileno: int) -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(fileno, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
