"""calibration.build on local files, driven with a word-level stand-in
tokenizer: what text each record gives, and what is refused."""
import json

import pytest

from quantize import calibration
from quantize.calibration import CalibrationConfig
from quantize.common.errors import UserError


class WordTokenizer:
    """One id per whitespace-separated word (its vocabulary grows as it
    reads); counts its calls. Decodes ids back to the words."""
    chat_template = None

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.calls = 0

    def __call__(self, text, add_special_tokens=False, truncation=False, max_length=None):
        self.calls += 1
        ids = [self.vocab.setdefault(word, len(self.vocab)) for word in text.split()]
        return {"input_ids": ids[:max_length] if truncation else ids}

    def decode(self, ids) -> str:
        words = {i: w for w, i in self.vocab.items()}
        return " ".join(words[i] for i in ids)


def config(path, n: int, seq: int = 16, **values) -> CalibrationConfig:
    return CalibrationConfig.from_config({"source": "file", "path": str(path), "num_samples": n,
                                          "max_seq_len": seq, **values})


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def texts(calib, tokenizer) -> list[str]:
    return [tokenizer.decode(s) for s in calib.samples]


def test_null_texts_are_skipped_like_empty_ones(tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": None}, {"text": "hello world"}, {"text": ""},
                                              {"text": None}, {"text": "good morning"}])
    tok = WordTokenizer()
    calib = calibration.build(config(data, 2), tok, seed=0)
    assert texts(calib, tok) == ["hello world", "good morning"]
    assert calib.num_tokens == 4
    with pytest.raises(UserError, match="has 2 non-empty samples, fewer than calibration.num_samples=3"):
        calibration.build(config(data, 3), WordTokenizer(), seed=0)


def test_a_null_field_among_several_adds_no_text(tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", [{"q": "why so", "a": None}, {"q": None, "a": "because"}])
    tok = WordTokenizer()
    calib = calibration.build(config(data, 2, text_field=["q", "a"]), tok, seed=0)
    assert texts(calib, tok) == ["why so", "because"]


@pytest.mark.parametrize("value, shown", [(12345, "int 12345"), (["a", "b"], 'list ["a", "b"]'),
                                          (True, "bool true"), ({"t": "x"}, 'dict {"t": "x"}')])
def test_a_value_that_is_not_text_is_refused_naming_record_and_field(tmp_path, value, shown):
    data = write_jsonl(tmp_path / "c.jsonl", [{"body": "hello world"}, {"body": "fine"}, {"body": value}])
    with pytest.raises(UserError) as e:
        calibration.build(config(data, 2, text_field="body"), WordTokenizer(), seed=0)
    message = str(e.value)
    assert f"calibration record 3 has {shown} in field 'body', not text" in message
    assert "make it a string" in message and "\n" not in message


def test_chat_messages_without_a_template_give_their_contents(tmp_path):
    chat = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]
    data = write_jsonl(tmp_path / "c.json", [])
    data.write_text(json.dumps([{"messages": chat}, {"messages": []}, {"messages": chat}]))
    tok = WordTokenizer()
    calib = calibration.build(config(data, 2, text_field="messages"), tok, seed=0)
    assert texts(calib, tok) == ["hi there hello", "hi there hello"]


@pytest.mark.parametrize("name, content", [
    ("latin1.txt", "Mr. Darcy's café, Émile's naïve remark. " * 40),
    ("latin1.jsonl", '{"text": "café au lait"}\n{"text": "crème brûlée"}\n'),
    ("latin1.json", '[{"text": "café au lait"}, {"text": "crème brûlée"}]')])
def test_a_file_that_is_not_utf8_is_refused_in_one_line(tmp_path, name, content):
    data = tmp_path / name
    data.write_bytes(content.encode("latin-1"))
    with pytest.raises(UserError) as e:
        calibration.build(config(data, 1), WordTokenizer(), seed=0)
    message = str(e.value)
    assert f"calibration file {data} is not UTF-8 text (byte 0xe9 at offset" in message
    assert "iconv -f latin1 -t utf-8" in message and "\n" not in message

