"""Held-out text (novels kept out of calibration) and the token windows cut
from it: what evaluate's accuracy pass, lm-eval's bundled task and the
per-layer sensitivity score models on."""
from quantize.common import token_cache
from quantize.common.errors import UserError
from quantize.common.paths import resolve


def held_out_text(text: str, books: list[str], key: str = "accuracy.text") -> str:
    """`text` = austen (the given `books`, joined) or a local .txt file;
    `key` is the setting `text` came from, named in errors (its group's
    `books` sit beside it)."""
    if text == "austen":
        from quantize.common.assets import check_books, ensure_austen
        books_key = f"{key.rpartition('.')[0]}.books".lstrip(".")
        # none: a caller's refusal would be "lower num_windows", or a TypeError for null
        check_books(books, books_key, f"name at least one held-out book, e.g. {books_key}=[persuasion]")
        folder = ensure_austen()
        return "\n\n".join((folder / f"{b}.txt").read_text() for b in books)
    path = resolve(text)
    if not path.is_file():
        raise UserError(f"{key} {path} does not exist; set {key}=austen or a local .txt file")
    return path.read_text()


def windows(tokenizer, text: str, n: int, length: int, group: str = "accuracy") -> list[list[int]]:
    """n windows of `length` tokens, evenly spaced over the text; `group`
    holds the num_windows and window_len settings, named in errors."""
    ids = token_cache.token_ids(tokenizer, text)
    count = len(ids) // length
    if count < n:
        raise UserError(f"{group} text holds {len(ids)} tokens = {count} windows of {length}; "
                        f"lower {group}.num_windows ({n}) or {group}.window_len")
    step = count // n
    return [ids[i * step * length:(i * step + 1) * length] for i in range(n)]
