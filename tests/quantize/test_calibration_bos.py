"""Calibration samples begin as llm-compressor's datasets and served prompts
do: plain text with the tokenizer's BOS where it adds one (Llama, Mistral,
Gemma), chat-template text with the template's tokens only. A tokenizer that
adds no BOS (the default SmolLM2) gets the same samples, so its artifacts keep
their ids. Real tokenizers: SmolLM2's, and SmolLM2's made to prepend BOS."""
import json

import pytest

from quantize import calibration
from quantize.calibration import CalibrationConfig
from quantize.common import token_cache
from quantize.common.errors import UserError

SEQ = 32


@pytest.fixture(scope="module")
def plain(tokenizer_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def with_bos(tokenizer_dir):
    """SmolLM2's tokenizer prepending its BOS (id 1) to every text, as Llama's does."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok._tokenizer.post_processor = TemplateProcessing(single=f"{tok.bos_token} $A",
                                                       special_tokens=[(tok.bos_token, tok.bos_token_id)])
    assert tok("a")["input_ids"][0] == tok.bos_token_id != tok("a", add_special_tokens=False)["input_ids"][0]
    return tok


def file_config(path, n, **values) -> CalibrationConfig:
    return CalibrationConfig.from_config({"source": "file", "path": str(path), "num_samples": n,
                                          "max_seq_len": SEQ, **values})


def jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


TEXTS = ["It is a truth universally acknowledged, that a single man in possession of a good fortune, must "
         "be in want of a wife. " * 4, "Emma Woodhouse, handsome, clever, and rich.", ""]


def test_plain_text_records_start_with_bos_as_llm_compressor_tokenizes_them(tmp_path, with_bos):
    data = jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS])
    calib = calibration.build(file_config(data, 2), with_bos, seed=0)
    # llm-compressor's TextGenerationDataset.tokenize: the tokenizer's defaults, truncated to max_seq_length
    assert calib.samples == [with_bos(t, max_length=SEQ, truncation=True)["input_ids"] for t in TEXTS[:2]]
    assert all(s[0] == with_bos.bos_token_id for s in calib.samples)
    assert len(calib.samples[0]) == SEQ  # BOS counts in max_seq_len


def test_a_record_with_no_text_is_still_passed_over_where_bos_is_added(tmp_path, with_bos):
    data = jsonl(tmp_path / "c.jsonl", [{"text": ""}, {"text": "Emma"}, {"text": None}])
    with pytest.raises(UserError, match="has 1 non-empty samples"):
        calibration.build(file_config(data, 2), with_bos, seed=0)


def test_chat_records_get_the_templates_tokens_and_no_second_bos(tmp_path, with_bos):
    chat = [{"role": "user", "content": "Who is Emma?"}, {"role": "assistant", "content": "A heroine."}]
    data = jsonl(tmp_path / "c.jsonl", [{"messages": chat}])
    calib = calibration.build(file_config(data, 1, text_field="messages", max_seq_len=256), with_bos, seed=0)
    rendered = with_bos.apply_chat_template(chat, tokenize=False)
    assert calib.samples == [with_bos(rendered, add_special_tokens=False)["input_ids"]]


def test_text_windows_start_with_bos_and_keep_max_seq_len_tokens(tmp_path, with_bos):
    path = tmp_path / "book.txt"
    path.write_text(TEXTS[0] * 20)
    calib = calibration.build(file_config(path, 4), with_bos, seed=0)
    ids = token_cache.token_ids(with_bos, path.read_text())
    body = [ids[i:i + SEQ - 1] for i in range(0, len(ids) - SEQ + 2, SEQ - 1)]
    assert all(len(s) == SEQ and s[0] == with_bos.bos_token_id for s in calib.samples)
    assert all(s[1:] in body for s in calib.samples)


def test_a_tokenizer_without_bos_keeps_its_samples_and_so_its_artifact_ids(tmp_path, plain):
    path = tmp_path / "book.txt"
    path.write_text(TEXTS[0] * 20)
    ids = token_cache.token_ids(plain, path.read_text())
    windows = calibration.build(file_config(path, 4), plain, seed=0).samples
    assert all(s in [ids[i:i + SEQ] for i in range(0, len(ids) - SEQ + 1, SEQ)] for s in windows)
    data = jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS])
    records = calibration.build(file_config(data, 2), plain, seed=0).samples
    assert records == [plain(t, add_special_tokens=False, max_length=SEQ, truncation=True)["input_ids"]
                       for t in TEXTS[:2]]
