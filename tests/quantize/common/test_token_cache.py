"""The token cache (quantize/common/token_cache.py): the ids it gives are
the tokenizer's own, read back from disk on the next call; another text or
another tokenizer definition is another entry; a cache folder that cannot
be written only costs the tokenization."""
import pytest

from quantize.common import token_cache
from quantize.common.assets import AUSTEN_BOOKS, ensure_austen


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "tokens"
    monkeypatch.setattr(token_cache, "TOKENS_DIR", folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from quantize.common import hf_load
    return hf_load.tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def book():
    return (ensure_austen() / f"{AUSTEN_BOOKS[0]}.txt").read_text()


def own_ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_long_text_is_tokenized_once_and_read_back_the_same(cache, tokenizer, book):
    first = token_cache.token_ids(tokenizer, book)
    (entry,) = cache.iterdir()
    assert first == own_ids(tokenizer, book)
    entry.write_bytes(entry.read_bytes()[:-4] + (7).to_bytes(4, "little"))  # what is read is the file
    second = token_cache.token_ids(tokenizer, book)
    assert second[:-1] == first[:-1] and second[-1] == 7 and all(type(i) is int for i in second[:3])


def test_another_text_or_tokenizer_definition_is_another_entry(cache, tokenizer, book):
    import copy

    from tokenizers import normalizers
    token_cache.token_ids(tokenizer, book)
    token_cache.token_ids(tokenizer, book + " The end.")
    other = copy.deepcopy(tokenizer)
    other.backend_tokenizer.normalizer = normalizers.Lowercase()  # "Emma" -> "emma": other ids
    assert token_cache.token_ids(other, book) == own_ids(other, book)
    assert len(list(cache.iterdir())) == 3


def test_a_short_text_or_an_unwritable_cache_is_only_tokenized(cache, tokenizer, book, monkeypatch):
    assert token_cache.token_ids(tokenizer, "Emma Woodhouse") == own_ids(tokenizer, "Emma Woodhouse")
    assert not cache.exists()
    cache.parent.joinpath("blocked").write_text("a file, not a folder")
    monkeypatch.setattr(token_cache, "TOKENS_DIR", cache.parent / "blocked" / "tokens")
    assert token_cache.token_ids(tokenizer, book) == own_ids(tokenizer, book)
