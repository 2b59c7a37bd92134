"""Calibration text -> a fixed set of token windows, with a content hash.

Sources: the bundled Austen corpus, a local .txt/.json/.jsonl file, or a
Hugging Face Hub dataset (for users with hub access). The samples actually used
are hashed, so two artifacts with the same calibration hash saw the same tokens.
"""
import json
import random
from dataclasses import dataclass

from quantize.common.errors import UserError
from quantize.common.paths import resolve
from quantize.common.provenance import sha256_json


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
FILE_SUFFIXES = (".txt", ".json", ".jsonl")


def check(cfg) -> None:
    """What can be wrong with the `calibration` config before any text is read
    or tokenizer loaded, so a typo fails in a second, not after the imports."""
    n, seq = int(cfg.num_samples), int(cfg.max_seq_len)
    if n < 1 or seq < 2:
        raise UserError(f"calibration.num_samples ({n}) must be >= 1 and calibration.max_seq_len ({seq}) >= 2")
    if cfg.source not in SOURCES:
        raise UserError(f"unknown calibration.source {cfg.source!r}; use austen, file or hub")
    if cfg.source == "austen":
        from quantize.common.assets import AUSTEN_BOOKS
        unknown = sorted(set(cfg.books) - set(AUSTEN_BOOKS))
        if unknown:
            raise UserError(f"unknown Austen book(s) {unknown}; choose from {list(AUSTEN_BOOKS)}")
    elif cfg.source == "file":
        path = resolve(cfg.path)
        if not path.is_file():
            raise UserError(f"calibration file {path} does not exist; pass calibration=<path to .txt/.json/.jsonl>")
        if path.suffix not in FILE_SUFFIXES:
            raise UserError(f"calibration file {path} must end in .txt, .json or .jsonl")


def build(cfg, tokenizer, seed: int) -> CalibrationSet:
    """Build the calibration set described by the `calibration` config group."""
    check(cfg)
    n, seq = int(cfg.num_samples), int(cfg.max_seq_len)
    spec = {k: v for k, v in _plain(cfg).items()}
    if cfg.source == "austen":
        from quantize.common.assets import ensure_austen
        folder = ensure_austen()
        text = "\n\n".join((folder / f"{b}.txt").read_text() for b in cfg.books)
        samples = _windows(tokenizer, text, n, seq, seed, what=f"calibration books {list(cfg.books)}")
    elif cfg.source == "file":
        samples = _from_file(cfg, tokenizer, n, seq, seed)
    else:  # hub
        samples = _pick(_tokenize_records(_hub_records(cfg), cfg, tokenizer, seq), n, seed,
                        what=f"hub dataset {cfg.dataset}")
    return CalibrationSet(samples=samples, spec=spec)


def _plain(cfg) -> dict:
    from omegaconf import OmegaConf
    return OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else dict(cfg)


def _windows(tokenizer, text: str, n: int, seq: int, seed: int, what: str) -> list[list[int]]:
    """Cut the text into non-overlapping windows of `seq` tokens; pick n at random."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    count = len(ids) // seq
    if count < n:
        raise UserError(f"{what} hold {len(ids)} tokens = {count} windows of {seq}, fewer than "
                        f"calibration.num_samples={n}; lower num_samples or max_seq_len, or add text")
    starts = sorted(random.Random(seed).sample(range(count), n))
    return [ids[i * seq:(i + 1) * seq] for i in starts]


def _pick(samples: list[list[int]], n: int, seed: int, what: str) -> list[list[int]]:
    samples = [s for s in samples if s]
    if len(samples) < n:
        raise UserError(f"{what} has {len(samples)} non-empty samples, fewer than "
                        f"calibration.num_samples={n}; lower num_samples or supply more data")
    return [samples[i] for i in sorted(random.Random(seed).sample(range(len(samples)), n))]


def _from_file(cfg, tokenizer, n: int, seq: int, seed: int) -> list[list[int]]:
    path = resolve(cfg.path)  # check() made sure it exists and has a known suffix
    if path.suffix == ".txt":
        return _windows(tokenizer, path.read_text(), n, seq, seed, what=f"calibration file {path}")
    try:
        if path.suffix == ".jsonl":
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        else:
            records = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"calibration file {path} is not valid JSON ({e}); fix the file") from None
    if not isinstance(records, list):
        raise UserError(f"calibration file {path} must hold a list of records (or one JSON object per line)")
    return _pick(_tokenize_records(records, cfg, tokenizer, seq), n, seed, what=f"calibration file {path}")


def _hub_records(cfg):
    try:
        import datasets
        return datasets.load_dataset(cfg.dataset, cfg.get("subset"), split=cfg.split)
    except Exception as e:  # offline machines fail in many ways; all mean the same to the user
        raise UserError(f"cannot load hub dataset {cfg.dataset} ({type(e).__name__}); without hub "
                        "access use calibration=austen or calibration=<local .txt/.jsonl>") from None


def _tokenize_records(records, cfg, tokenizer, seq: int) -> list[list[int]]:
    fields = cfg.text_field if not isinstance(cfg.text_field, str) else [cfg.text_field]
    out = []
    for rec in records:
        if not isinstance(rec, dict):
            raise UserError("calibration records must be JSON objects with a "
                            f"{list(fields)} field; fix the data or set calibration.text_field")
        missing = [f for f in fields if f not in rec]
        if missing:
            raise UserError(f"calibration record lacks field(s) {missing}; set calibration.text_field "
                            f"to one of {sorted(rec)}")
        text = "\n".join(_render(rec[f], tokenizer) for f in fields)
        out.append(tokenizer(text, add_special_tokens=False, truncation=True, max_length=seq)["input_ids"])
    return out


def _render(value, tokenizer) -> str:
    """Chat `messages` go through the model's chat template; strings pass through."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        if tokenizer.chat_template:
            return tokenizer.apply_chat_template(value, tokenize=False)
        return "\n".join(str(m.get("content", "")) for m in value)
    return str(value)
