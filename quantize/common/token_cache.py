"""Token ids of a long text, tokenized once per tokenizer: the calibration
books (~560k tokens, ~3.5 s of CPU) and the held-out books (~260k, ~2 s)
are the same for every quantize run, sanity check and accuracy pass.

`token_ids(tokenizer, text)` is `tokenizer(text, add_special_tokens=False)
["input_ids"]`, kept under CACHE_DIR/tokens/ by the SHA-256 of the text and
of everything that decides how it is cut: the fast tokenizer's full
definition (normalizer, pre-tokenizer, vocabulary, merges), its class and
the transformers and tokenizers versions. A tokenizer without that
definition (a slow one) is not cached. A file that cannot be read or written
is only a cache miss: the text is tokenized as before."""
import hashlib
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from quantize.common import atomic
from quantize.common.paths import CACHE_DIR

log = logging.getLogger(__name__)

TOKENS_DIR = CACHE_DIR / "tokens"
# Texts shorter than this are tokenized each time: a cache file would cost more than it saves.
MIN_CHARS = 100_000


def token_ids(tokenizer, text: str) -> list[int]:
    """The ids `tokenizer` gives `text` without special tokens (cached, see the module's docstring)."""
    key = _key(tokenizer, text) if len(text) >= MIN_CHARS else None
    if key is None:
        return _tokenize(tokenizer, text)
    import numpy as np
    path = TOKENS_DIR / f"{key}.u32"
    try:
        data = path.read_bytes()
    except OSError:
        data = None
    if data is not None and len(data) % 4 == 0:
        return np.frombuffer(data, dtype="<u4").tolist()
    ids = _tokenize(tokenizer, text)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(path, np.asarray(ids, dtype="<u4").tobytes())
    except (OSError, OverflowError, ValueError) as e:  # a read-only or full disk: tokenize again next time
        log.debug("token cache not written (%s): %s", path, e)
    return ids


def _tokenize(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _key(tokenizer, text: str) -> str | None:
    """SHA-256 of the text and the tokenizer's definition; None where there is no definition to hash."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    h = hashlib.sha256()
    for part in (type(tokenizer).__qualname__, _version("transformers"), _version("tokenizers"), backend.to_str()):
        h.update(part.encode() + b"\0")
    h.update(text.encode())
    return h.hexdigest()


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return ""
