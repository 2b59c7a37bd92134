"""The held-out text and its windows, shared by accuracy, lm-eval's bundled
task and the sensitivity measurement."""
import pytest

from quantize.common.errors import UserError
from quantize.common.heldout import held_out_text, windows


class CharTokenizer:
    """One token per character: window arithmetic without a real tokenizer."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_windows_are_evenly_spaced_and_of_the_asked_length():
    text = "".join(chr(65 + i % 26) for i in range(100))
    got = windows(CharTokenizer(), text, n=3, length=10)
    assert [len(w) for w in got] == [10, 10, 10]
    # 10 windows fit, so every third one starts at 0, 30, 60
    assert [w[0] for w in got] == [65 + 0, 65 + 30 % 26, 65 + 60 % 26]


def test_a_text_too_short_names_the_settings_to_lower():
    with pytest.raises(UserError, match=r"lower text.num_windows \(5\) or text.window_len"):
        windows(CharTokenizer(), "x" * 40, n=5, length=10, group="text")


def test_a_local_text_file_and_a_missing_one(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("It is a truth universally acknowledged.")
    assert held_out_text(str(path), []) == path.read_text()
    with pytest.raises(UserError, match="text.source .* does not exist; set text.source=austen"):
        held_out_text(str(tmp_path / "none.txt"), [], key="text.source")


def test_an_unknown_book_names_the_choices():
    with pytest.raises(UserError, match="unknown Austen book.*'nosuchbook'.*choose from"):
        held_out_text("austen", ["nosuchbook"])
