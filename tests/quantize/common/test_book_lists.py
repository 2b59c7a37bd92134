"""Every `books` list the project takes reads a wrong value alike
(settings.names): calibration.books, sanity.books, sensitivity's text.books,
accuracy.books and lm_eval.austen_lastword.books. A value that is no list of
names (5, true, a list of lists) was a TypeError after the model loaded, or
for lm-eval after the serving runs; it is one line naming the list form."""
import re

import pytest

from evaluate.accuracy import AccuracyConfig
from evaluate.lmeval import LmEvalConfig
from quantize import calibration
from quantize.calibration import CalibrationConfig
from quantize.common.errors import UserError
from quantize.common.heldout import held_out_text
from quantize.common.sanity_rules import SanityConfig
from quantize.sensitivity.config import TextConfig


def calibration_books(books):
    return CalibrationConfig.from_config({"source": "austen", "books": books, "num_samples": 4,
                                          "max_seq_len": 16}).books


def sanity_books(books):
    return SanityConfig.from_config({"books": books}).books


def sensitivity_books(books):
    return TextConfig.from_config({"source": "austen", "books": books, "num_windows": 2, "window_len": 16}).books


def accuracy_books(books):
    return AccuracyConfig.from_group({"name": "mine", "enabled": True, "text": "austen", "books": books,
                                      "num_windows": 2, "window_len": 16, "top_k": 5,
                                      "lastword": {"num_items": 2, "min_words": 3, "context_tokens": 8}}).books


def lm_eval_books(books):
    return LmEvalConfig.from_group({"name": "austen_lastword", "tasks": ["austen_lastword"], "enabled": True,
                                    "austen_lastword": {"text": "austen", "books": books, "num_items": 2,
                                                        "min_words": 3}}).austen_lastword.books


ENTRIES = [calibration_books, sanity_books, sensitivity_books, accuracy_books, lm_eval_books]


@pytest.mark.parametrize("read", ENTRIES)
@pytest.mark.parametrize("value, spelled", [(5, "5"), (True, "true"), (0, "0"), (2.5, "2.5"),
                                            ([["emma"]], r"\[\['emma'\]\]"), ({"a": 1}, r"\{'a': 1\}")])
def test_a_value_that_is_no_list_of_names_is_one_line_naming_the_list_form(read, value, spelled):
    with pytest.raises(UserError, match=rf"^(\w+\.)+books={spelled} is not a list of names; pass a list, e.g. "
                                        r"(\w+\.)+books=\[[^]]+\]$"):   # the key as typed, group and all
        read(value)


@pytest.mark.parametrize("read", ENTRIES)
def test_one_name_is_refused_and_a_list_is_read_as_given(read):
    with pytest.raises(UserError, match=r"^(\w+\.)+books=emma is one name, not a list; pass (\w+\.)+books=\[emma\]$"):
        read("emma")
    assert list(read(["emma", "persuasion"])) == ["emma", "persuasion"]


# An empty list (or null) with text austen: no text. It was refused after the
# model loaded naming the wrong fix (calibration: "lower num_samples";
# sanity: "lower sanity.num_windows"), and for lm-eval after the serving runs
# ("lower accuracy.lastword.num_items"; null: a TypeError).
def calibration_checked(books):
    calibration.check(CalibrationConfig.from_config({"source": "austen", "books": books, "num_samples": 4,
                                                     "max_seq_len": 16}))


@pytest.mark.parametrize("books", [[], None])
@pytest.mark.parametrize("refuse, key", [
    (calibration_checked, "calibration.books"), (sanity_books, "sanity.books"),
    (sensitivity_books, "text.books"),
    (lambda books: held_out_text("austen", books), "accuracy.books"),
    (lambda books: held_out_text("austen", books, key="lm_eval.austen_lastword.text"), "lm_eval.austen_lastword.books"),
])
def test_no_books_is_one_line_naming_the_setting(refuse, key, books):
    with pytest.raises(UserError, match=rf"^{re.escape(key)} is empty; name .*, e.g. {re.escape(key)}=\[\w+"):
        refuse(books)


def test_no_sanity_books_is_taken_where_no_book_is_read(tmp_path):
    assert SanityConfig.from_config({"books": [], "enabled": False}).books == ()
    assert SanityConfig.from_config({"books": None, "text": str(tmp_path / "mine.txt")}).books == ()
