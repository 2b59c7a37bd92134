"""calibration.build on local files, driven with a word-level stand-in
tokenizer: what text each record gives, and what is refused."""
import json

import pytest

from quantize import calibration
from quantize.calibration import CalibrationConfig
from quantize.common.errors import UserError
from quantize.common.provenance import sha256_json


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
    assert f"calibration record on line 3 has {shown} in field 'body', not text" in message
    assert "make it a string" in message and "\n" not in message


@pytest.mark.parametrize("bad, refusal", [
    ({"text": 12345}, "calibration record on line 7 has int 12345 in field 'text', not text"),
    ({"body": "x"}, "calibration record on line 7 lacks field(s) ['text']; set calibration.text_field to one of ['body']"),
    ("not an object", 'calibration record on line 7 is str "not an object", not a JSON object with a [\'text\'] field'),
    # ShareGPT's shape: the chat template failed (jinja's "no attribute 'role'") only for seeds that drew it
    ({"text": [{"from": "human", "value": "hi"}]}, 'calibration record on line 7 has message dict {"from": "human", '
                                                   '"value": "hi"} in field \'text\', not {"role": <str>, "content": <str>}'),
    ({"text": [{"role": "user", "content": "hi"}, {"role": "user", "content": 3}]},
     'calibration record on line 7 has message dict {"role": "user", "content": 3} in field \'text\', not {"role"')])
def test_a_bad_record_is_refused_whichever_records_the_seed_draws(tmp_path, bad, refusal):
    """Three of ten records are drawn; the bad one (on line 7: a blank line
    above it) is refused for every seed, drawn or not, naming its line."""
    records = [{"text": f"line {i}"} for i in range(10)]
    records[5] = bad
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" + ("\n" if i == 2 else "") for i, r in enumerate(records)))
    for seed in range(8):
        with pytest.raises(UserError) as e:
            calibration.build(config(data, 3), WordTokenizer(), seed=seed)
        assert refusal in str(e.value), seed


def test_a_json_list_names_the_record_by_its_number(tmp_path):
    data = tmp_path / "c.json"
    data.write_text(json.dumps([{"text": "a"}, {"text": "b"}, ["x"], {"text": "c"}]))
    with pytest.raises(UserError, match=r"calibration record 3 is list \["):
        calibration.build(config(data, 1), WordTokenizer(), seed=0)


def test_invalid_jsonl_names_the_files_line(tmp_path):
    data = tmp_path / "c.jsonl"
    data.write_text('{"text": "a"}\n\n{"text": oops}\n')
    with pytest.raises(UserError, match=r"c.jsonl is not valid JSON on line 3 \("):
        calibration.build(config(data, 1), WordTokenizer(), seed=0)


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



def hub_config(n: int, **values) -> CalibrationConfig:
    return CalibrationConfig.from_config({"source": "hub", "dataset": "someone/chats", "split": "train",
                                          "num_samples": n, "max_seq_len": 16, "text_field": "messages", **values})


@pytest.fixture
def hub_chats(monkeypatch):
    """A 5,000-chat hub split (every 4th chat empty) served without network."""
    import datasets
    rows = [{"messages": [] if i % 4 == 3 else [{"role": "user", "content": f"question {i}"},
                                                 {"role": "assistant", "content": f"answer {i}"}]}
            for i in range(5000)]
    split = datasets.Dataset.from_list(rows)
    asked = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kw: asked.append((args, kw)) or split)
    return asked


def test_only_the_drawn_hub_records_are_tokenized(hub_chats):
    tok = WordTokenizer()
    calib = calibration.build(hub_config(8), tok, seed=0)
    assert hub_chats == [(("someone/chats", None), {"split": "train"})]
    assert 8 <= tok.calls < 30  # the 8 kept and the few empty chats drawn on the way, not 5,000
    numbers = [int(t.split()[1]) for t in texts(calib, tok)]
    assert len(set(numbers)) == 8 and numbers == sorted(numbers)  # distinct, in the split's order
    assert all(n % 4 != 3 for n in numbers)
    # the manifest's record is that of the samples used
    record = calib.describe()
    assert (record["num_samples"], record["num_tokens"]) == (8, 8 * 4)
    assert record["sha256"] == sha256_json(calib.samples)


def test_the_draw_is_the_same_for_a_seed_and_another_for_another_seed(hub_chats):
    tok = WordTokenizer()
    first, again = (texts(calibration.build(hub_config(8), tok, seed=0), tok) for _ in range(2))
    other = texts(calibration.build(hub_config(8), tok, seed=1), tok)
    assert first == again and first != other


def test_a_file_with_too_few_texts_says_how_many_it_has(tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "one"}, {"text": ""}, {"text": "two"}])
    tok = WordTokenizer()
    with pytest.raises(UserError, match="has 2 non-empty samples, fewer than calibration.num_samples=3"):
        calibration.build(config(data, 3), tok, seed=0)
    assert tok.calls == 1 + 3  # what an empty text gives, then each record once


def test_one_book_given_where_a_list_is_expected_names_the_list_form():
    """calibration.books=emma was the letters e, m, m, a: "unknown Austen book(s) ['a', 'e', 'm']"."""
    with pytest.raises(UserError, match=r"^calibration.books=emma is one name, not a list; "
                                        r"pass calibration.books=\[emma\]$"):
        CalibrationConfig.from_config({"source": "austen", "books": "emma", "num_samples": 4, "max_seq_len": 16})


@pytest.mark.parametrize("value, spelled", [(5, "5"), (True, "true"), ([["a"]], r"\[\['a'\]\]")])
def test_a_text_field_that_is_no_name_is_one_line(value, spelled):
    """tuple(5) was a TypeError traceback; a list in the list failed as unhashable on the first record."""
    with pytest.raises(UserError, match=rf"^calibration.text_field={spelled} is not a name or a list of names; pass "
                                        r"one, e.g. calibration.text_field=text, or a list, "
                                        r"e.g. calibration.text_field=\[instruction,input,output\]$"):
        hub_config(2, text_field=value)


@pytest.mark.parametrize("value", [None, []])
def test_no_text_field_is_one_line_before_any_record_is_read(tmp_path, value):
    """null was a TypeError traceback; [] read every record as empty: "has 0 non-empty samples"."""
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "one"}])
    for made in (hub_config(2, text_field=value), config(data, 1, text_field=value)):
        with pytest.raises(UserError, match=r"^calibration.text_field is empty; name the record field holding the "
                                            r"text, e.g. calibration.text_field=text$"):
            calibration.check(made)


def test_a_preset_lacking_a_key_is_told_to_add_it_to_its_yaml():
    """A key the preset lacks cannot be added on the command line (Hydra refuses
    calibration.<key> and +calibration.<key> for a preset without it)."""
    with pytest.raises(UserError, match=r"^the calibration config lacks num_samples, max_seq_len; add it to its YAML "
                                        r"\(e.g. num_samples: 64\)$"):
        CalibrationConfig.from_config({"source": "austen"})
