"""Calibration text -> a fixed set of token windows, with a content hash.

Sources: the bundled Austen corpus, a local .txt/.json/.jsonl file, or a
Hugging Face Hub dataset (for users with hub access). The samples actually used
are hashed, so two artifacts with the same calibration hash saw the same tokens.
"""
import json
import random
from dataclasses import dataclass, field

from quantize.common import token_cache
from quantize.common.errors import UserError
from quantize.common.paths import resolve
from quantize.common.provenance import sha256_json
from quantize.common.settings import integer, names


@dataclass
class CalibrationSet:
    samples: list[list[int]]  # token ids, each at most max_seq_len long
    spec: dict                # what the user asked for (source, books/path, sizes)

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.samples)

    @property
    def sha256(self) -> str:
        return sha256_json(self.samples)

    def describe(self) -> dict:
        return {**self.spec, "num_tokens": self.num_tokens, "sha256": self.sha256}

    def to_dataset(self):
        from datasets import Dataset
        return Dataset.from_dict({
            "input_ids": self.samples,
            "attention_mask": [[1] * len(s) for s in self.samples],
        })


SOURCES = ("austen", "file", "hub")
BOOKS_EXAMPLE = "emma,mansfieldpark,sensesensibility"  # calibration=austen's, none of them held out
FILE_SUFFIXES = (".txt", ".json", ".jsonl")


@dataclass(frozen=True)
class CalibrationConfig:
    """The `calibration` config group (conf/calibration/*.yaml): where the
    text comes from and how many windows of how many tokens are cut from it."""
    source: str
    num_samples: int
    max_seq_len: int
    name: str = ""
    books: tuple[str, ...] = ()           # source austen
    path: str | None = None               # source file
    dataset: str | None = None            # source hub
    subset: str | None = None
    split: str | None = None
    text_field: tuple[str, ...] = ("text",)  # file and hub records: the field(s) joined into one sample
    template: str | None = None           # TEMPLATES key: renders the text_field values instead of joining them
    # The group's keys as composed, in their order: the manifest records them as given.
    spec: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_config(cls, values: dict) -> "CalibrationConfig":
        """From the group's plain values; keys this class does not read stay in `spec`."""
        missing = [k for k in ("source", "num_samples", "max_seq_len") if values.get(k) is None]
        if missing:   # a preset's own key: no override can add it (Hydra refuses calibration.<key> then)
            example = {"source": "austen", "num_samples": 64, "max_seq_len": 512}[missing[0]]
            raise UserError(f"the calibration config lacks {', '.join(missing)}; add it to its YAML "
                            f"(e.g. {missing[0]}: {example})")
        return cls(
            source=str(values["source"]), num_samples=integer("calibration.num_samples", values["num_samples"], 64),
            max_seq_len=integer("calibration.max_seq_len", values["max_seq_len"], 512), name=str(values.get("name", "")),
            books=tuple(names("calibration.books", values.get("books"), example=BOOKS_EXAMPLE)),
            path=values.get("path"),
            dataset=values.get("dataset"), subset=values.get("subset"), split=values.get("split"),
            text_field=tuple(names("calibration.text_field", values.get("text_field", "text"),   # one, or a list
                                   example="instruction,input,output", one="text")),
            template=values.get("template"), spec=dict(values))


def check(config: CalibrationConfig) -> None:
    """What can be wrong with the `calibration` config before any text is read
    or tokenizer loaded, so a typo fails in a second, not after the imports."""
    n, seq = config.num_samples, config.max_seq_len
    if n < 1 or seq < 2:
        raise UserError(f"calibration.num_samples ({n}) must be >= 1 and calibration.max_seq_len ({seq}) >= 2")
    if config.source not in SOURCES:
        raise UserError(f"unknown calibration.source {config.source!r}; use austen, file or hub")
    if config.source != "austen" and not config.text_field:
        raise UserError("calibration.text_field is empty; name the record field holding the text, e.g. "
                        "calibration.text_field=text")
    if config.template is not None:
        _check_template(config)
    if config.source == "austen":
        from quantize.common.assets import check_books
        check_books(config.books, "calibration.books",
                    f"name the novels to calibrate on, e.g. calibration.books=[{BOOKS_EXAMPLE}]")
    elif config.source == "file":
        path = resolve(config.path)
        if not path.is_file():
            raise UserError(f"calibration file {path} does not exist; pass calibration=<path to .txt/.json/.jsonl>")
        if path.suffix not in FILE_SUFFIXES:
            raise UserError(f"calibration file {path} must end in .txt, .json or .jsonl")


def _check_template(config: CalibrationConfig) -> None:
    if config.template not in TEMPLATES:
        raise UserError(f"unknown calibration.template {config.template!r}; use {' or '.join(TEMPLATES)}, "
                        "or null to join the text_field values")
    if len(config.text_field) != 3:
        plain = "use the field's text as it is" if len(config.text_field) == 1 else "join the fields with newlines"
        raise UserError(f"calibration.template={config.template} renders three fields, instruction, input and "
                        f"output, but calibration.text_field is {list(config.text_field)}; name three, e.g. "
                        f"calibration.text_field=[instruction,input,output], or pass calibration.template=null "
                        f"to {plain}")


def check_held_out(config: CalibrationConfig, sanity) -> None:
    """The sanity check scores held-out text: calibrating on one of its books
    would make a broken artifact look sound (evaluate's accuracy pass holds out
    the same two by default)."""
    if sanity is None or config.source != "austen" or sanity.text != "austen":
        return
    shared = [b for b in config.books if b in sanity.books]
    if shared:
        raise UserError(f"calibration.books and sanity.books share {', '.join(shared)}: the sanity check would "
                        "score text the model was calibrated on; calibrate on other books (e.g. "
                        f"calibration.books=[{BOOKS_EXAMPLE}]), or pass sanity.enabled=false")


def build(config: CalibrationConfig, tokenizer, seed: int) -> CalibrationSet:
    """Build the calibration set described by the `calibration` config group."""
    check(config)
    n, seq = config.num_samples, config.max_seq_len
    if config.source == "austen":
        from quantize.common.assets import ensure_austen
        folder = ensure_austen()
        text = "\n\n".join((folder / f"{b}.txt").read_text() for b in config.books)
        samples = _windows(tokenizer, text, n, seq, seed, what=f"calibration books {list(config.books)}")
    elif config.source == "file":
        samples = _from_file(config, tokenizer, seed)
    else:  # hub
        samples = _pick(_hub_records(config), config, tokenizer, seed, what=f"hub dataset {config.dataset}")
    return CalibrationSet(samples=samples, spec=dict(config.spec))


def _windows(tokenizer, text: str, n: int, seq: int, seed: int, what: str) -> list[list[int]]:
    """Cut the text into non-overlapping windows of `seq` tokens; pick n at
    random. Each starts with BOS where the tokenizer adds one, as a served
    prompt does (BOS counts in the `seq`)."""
    ids = token_cache.token_ids(tokenizer, text)
    bos = _bos(tokenizer)
    size = seq - len(bos)
    count = len(ids) // size
    if count < n:
        raise UserError(f"{what} hold {len(ids)} tokens = {count} windows of {seq}, fewer than "
                        f"calibration.num_samples={n}; lower num_samples or max_seq_len, or add text")
    starts = sorted(random.Random(seed).sample(range(count), n))
    return [bos + ids[i * size:(i + 1) * size] for i in starts]


def _bos(tokenizer) -> list[int]:
    """[BOS] if the tokenizer puts it before a text (Llama, Mistral, Gemma), else []."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return []
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    return [bos] if with_special[:1] == [bos] and plain[:1] != [bos] else []


def _pick(records, config: CalibrationConfig, tokenizer, seed: int, what: str,
          labels: list[str] | None = None) -> list[list[int]]:
    """num_samples records drawn in a seeded random order, kept in the data's
    order. Only drawn records are rendered and tokenized (a hub split holds
    ~200k chats); one with no text is passed over for the next. `labels[i]`
    names record i in a refusal (default: its 1-based number)."""
    n = config.num_samples
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    chosen = {}
    no_text = tokenizer("", add_special_tokens=True)["input_ids"]
    for i in order:
        ids = _tokenize_record(records[i], labels[i] if labels else str(i + 1), config, tokenizer, no_text)
        if ids:
            chosen[i] = ids
            if len(chosen) == n:
                return [chosen[k] for k in sorted(chosen)]
    raise UserError(f"{what} has {len(chosen)} non-empty samples, fewer than "
                    f"calibration.num_samples={n}; lower num_samples or supply more data")


def _from_file(config: CalibrationConfig, tokenizer, seed: int) -> list[list[int]]:
    n, seq = config.num_samples, config.max_seq_len
    path = resolve(config.path)  # check() made sure it exists and has a known suffix
    text = _read_text(path)
    if path.suffix == ".txt":
        return _windows(tokenizer, text, n, seq, seed, what=f"calibration file {path}")
    if path.suffix == ".jsonl":
        lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        records = [_json(path, line, f" on line {number}") for number, line in lines]
        labels = [f"on line {number}" for number, _ in lines]   # the file's line, blank lines counted
    else:
        records = _json(path, text, "")
        if not isinstance(records, list):
            raise UserError(f"calibration file {path} must hold a list of records (or one JSON object per line)")
        labels = [str(i + 1) for i in range(len(records))]
    # Every record is checked before any is drawn: a bad one is refused whatever the seed draws.
    for rec, label in zip(records, labels):
        _record_values(rec, label, config)
    return _pick(records, config, tokenizer, seed, what=f"calibration file {path}", labels=labels)


def _json(path, text: str, at: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"calibration file {path} is not valid JSON{at} ({e}); fix the file") from None


def _read_text(path) -> str:
    """The file as UTF-8, whatever the machine's locale says."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"calibration file {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                        f"{e.start}); convert it, e.g. iconv -f latin1 -t utf-8 {path.name} > "
                        f"utf8{path.suffix}") from None


def _hub_records(config: CalibrationConfig):
    try:
        import datasets
        return datasets.load_dataset(config.dataset, config.subset, split=config.split)
    except Exception as e:  # offline machines fail in many ways; all mean the same to the user
        raise UserError(f"cannot load hub dataset {config.dataset} ({type(e).__name__}); without hub "
                        "access use calibration=austen or calibration=<local .txt/.jsonl>") from None


def _tokenize_record(rec, where: str, config: CalibrationConfig, tokenizer, no_text: list[int]) -> list[int]:
    """The record's `text_field` value(s) as one sample, cut to max_seq_len
    tokens. Plain text gets the tokenizer's special tokens (its BOS), as
    llm-compressor's datasets and served prompts do; a chat template writes
    its own. A record with no text, only the special tokens `no_text`, is [] (passed over)."""
    values = _record_values(rec, where, config)
    if config.template and values:
        if any(_is_chat(v) for v in values):
            raise UserError(f"calibration record {where} holds chat messages, which calibration.template="
                            f"{config.template} does not render; pass calibration.template=null")
        text = TEMPLATES[config.template](*(rec[f] for f in config.text_field))
    else:
        text = "\n".join(_render(value, tokenizer) for value in values)
    special = not (tokenizer.chat_template and any(_is_chat(v) and v for v in values))
    ids = tokenizer(text, add_special_tokens=special, truncation=True, max_length=config.max_seq_len)["input_ids"]
    return [] if ids == (no_text if special else []) else ids


def _alpaca(instruction: str | None, input_text: str | None, output: str | None) -> str:
    """A record as llm-compressor's `dataset="open_platypus"` calibrates on
    it: its Alpaca prompt, with the `### Input:` section only where the input
    is not empty, followed by the output."""
    from llmcompressor.transformers.data.open_platypus import OpenPlatypusDataset
    prompts = OpenPlatypusDataset.ALPACA_TEMPLATE
    prompt = (prompts["prompt_input"].format(instruction=instruction or "", input=input_text) if input_text
              else prompts["prompt_no_input"].format(instruction=instruction or ""))
    return prompt + (output or "")


TEMPLATES = {"alpaca": _alpaca}  # calibration.template: a record's text_field values -> its text


def _record_values(rec, where: str, config: CalibrationConfig) -> list:
    """The record's non-null `text_field` values, each a string or chat
    messages; anything else is refused in one line naming the record (`where`).
    A null field is no text, as an empty string is: a record with no text
    left is passed over (_pick)."""
    fields = config.text_field
    if not isinstance(rec, dict):
        raise UserError(f"calibration record {where} is {_shown(rec)}, not a JSON object with a {list(fields)} "
                        "field; fix the data or set calibration.text_field")
    missing = [f for f in fields if f not in rec]
    if missing:
        raise UserError(f"calibration record {where} lacks field(s) {missing}; set calibration.text_field "
                        f"to one of {sorted(rec)}")
    for f in fields:
        # A number or a list of strings: its Python spelling is not text anyone meant to calibrate on.
        if not (rec[f] is None or isinstance(rec[f], str) or _is_chat(rec[f])):
            raise UserError(f"calibration record {where} has {_shown(rec[f])} in field {f!r}, not text; make it "
                            "a string (or null to skip the record), or set calibration.text_field")
        _check_messages(rec[f], where, f)
    return [rec[f] for f in fields if rec[f] is not None]


def _check_messages(value, where: str, field: str) -> None:
    """Chat messages need a string role and content: the chat template reads
    them, and failed on another shape (ShareGPT's from/value) only when drawn."""
    if not _is_chat(value):
        return
    for m in value:
        if not (isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise UserError(f"calibration record {where} has message {_shown(m)} in field {field!r}, not "
                            '{"role": <str>, "content": <str>}; convert the chats (ShareGPT\'s from/value: '
                            "role/content), or set calibration.text_field")


def _is_chat(value) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) for m in value)


def _shown(value) -> str:
    """A value as a refusal names it: its type and the start of its JSON."""
    shown = json.dumps(value, default=str)
    return f"{type(value).__name__} {shown if len(shown) <= 40 else shown[:37] + '...'}"


def _render(value, tokenizer) -> str:
    """Chat `messages` go through the model's chat template; strings pass through."""
    if not _is_chat(value):
        return value
    if not value:
        return ""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(value, tokenize=False)
    return "\n".join(str(m.get("content", "")) for m in value)
