"""Accuracy beside speed: is the quantized model still the same model?

Measured with the *serving engine's* prompt logprobs (so W8A8/FP8 activation
quantization is included, unlike a dequantized transformers copy), against a
reference: the artifact's unquantized base model run in transformers.

- perplexity: exp(mean NLL) over `num_windows` held-out windows of
  `window_len` tokens (every token but each window's first is scored: the
  token count is reported as `scored_tokens`).
- kl_divergence: mean over scored positions of KL(reference || artifact) in
  nats. The engine returns the artifact's top-k logprobs (plus the actual
  token); the reference is known for every token, so the KL is computed
  exactly on the partition {each returned token, everything else}. By the
  data-processing inequality this is a lower bound of the full-vocabulary KL,
  and it equals it when the returned tokens hold all the mass.
- top1_agreement: fraction of positions where the artifact's most likely next
  token equals the reference's. An exact tie at the top (frequent with bf16
  logits) goes to the lowest token id on both sides, so the order an engine
  lists tied tokens in never counts; where every token the engine returned
  ties (a flat distribution), it has no pick and does not agree.
- lastword_accuracy: a LAMBADA-style task built from the held-out novels: each
  item is a paragraph of at least `min_words` words whose last word is
  alphabetic; the model sees the paragraph (last `context_tokens` tokens)
  without that word, and is right when greedy decoding would produce every
  token the word has after it in the whole paragraph, as lm-eval cuts a
  continuation (teacher-forced, each of them is its position's top token,
  ties going to the lowest id as for top1_agreement).
- recovery_pct: reference perplexity / artifact perplexity x 100;
  lastword_recovery_pct: artifact / reference last-word accuracy x 100.
"""
import dataclasses
import functools
import gc
import hashlib
import json
import logging
import math
import random
import re
import traceback
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from quantize.common import atomic, hf_load, machine
from quantize.common.checkpoint import weight_files
from quantize.common.errors import UserError
from quantize.common.extensions import Configurable
from quantize.common.heldout import held_out_text, windows
from quantize.common.jobs import one_line
from quantize.common.model_config import is_quantized
from quantize.common.paths import CACHE_DIR, resolve
from quantize.common.provenance import sha256_bytes
from quantize.common.settings import flag, shown

log = logging.getLogger("quantbench.accuracy")

WORD = re.compile(r"^(.*\S)\s+([A-Za-z]+)[\W_]*$", re.S)
# The most tokens a last-word target takes after its context (needed_len).
WORD_TOKENS = 16


@dataclass
class LastWordConfig(Configurable):
    """accuracy.lastword: the last-word task's size."""
    num_items: int
    min_words: int
    context_tokens: int


@dataclass
class AccuracyConfig(Configurable):
    """The accuracy group (conf/accuracy/<name>.yaml) of an enabled pass; the
    definitions of what it measures are this module's docstring."""
    name: str
    text: str                        # austen, or a local .txt file
    books: list[str]                 # with text=austen
    num_windows: int
    window_len: int
    top_k: int
    lastword: LastWordConfig
    reference: str | None = None     # None: the artifact's base model
    reference_device: str = "cpu"
    enabled: bool = True

    @classmethod
    def from_group(cls, values: dict) -> "AccuracyConfig | None":
        """The group as a plain dict -> the typed config; None for accuracy=none."""
        if not flag("accuracy.enabled", values.get("enabled", False)):   # enabled= is no "false"
            return None
        values = dict(values)
        if "lastword" in values and not isinstance(values["lastword"], dict):
            raise UserError(f"accuracy.lastword={shown(values['lastword'])}: pass its settings "
                            "(num_items, min_words, context_tokens), or accuracy=none for no accuracy pass")
        if "lastword" in values:
            values["lastword"] = LastWordConfig.from_config(values["lastword"], "accuracy.lastword")
        return cls.from_config(values, "accuracy")

    def as_dict(self) -> dict:
        """The group as rows record it (`accuracy_config`), with the local
        text's content hash (text_identity)."""
        return dataclasses.asdict(self) | text_identity(self.text, self.books)


def text_identity(text: str, books: list[str], key: str = "accuracy.text") -> dict:
    """What a row records of its held-out text beyond its name: for a local
    file, the hash of what it holds (`text_sha256`), so an edited file is
    measured anew where its path alone took the old rows as complete. Austen's
    books are fixed, and rows of them keep the key they had."""
    if text == "austen":
        return {}
    return {"text_sha256": sha256_bytes(held_out_text(text, books, key).encode())}


def lastword_passages(text: str, n: int, min_words: int, seed: int,
                      settings: str = "accuracy.lastword") -> list[tuple[str, str]]:
    """n (paragraph without its last word, last word) pairs: each paragraph has
    at least `min_words` words and ends in an alphabetic word; `settings`: the
    group of num_items and min_words, named in errors."""
    passages = []
    for para in text.split("\n\n"):
        para = para.strip()
        m = WORD.match(para)
        if len(para.split()) >= min_words and m:
            passages.append((m.group(1), m.group(2)))
    if len(passages) < n:
        raise UserError(f"only {len(passages)} paragraphs qualify for the last-word task; lower "
                        f"{settings}.num_items ({n}) or {settings}.min_words")
    return random.Random(seed).sample(passages, n)


def lastword_items(tokenizer, text: str, n: int, min_words: int, context_tokens: int, seed: int):
    """(prompt token ids, number of target tokens at its end) per item: the
    last `context_tokens` of the context (fewer for a word over WORD_TOKENS,
    so that the prompt fits needed_len), then the word's tokens."""
    items = []
    for context, word in lastword_passages(text, n, min_words, seed):
        context_ids, target = _split_last_word(tokenizer, context, word)
        keep = context_tokens - max(len(target) - WORD_TOKENS, 0)
        items.append((context_ids[max(len(context_ids) - keep, 0):] + target, len(target)))
    return items


def _split_last_word(tokenizer, context: str, word: str) -> tuple[list[int], list[int]]:
    """The context's tokens, and the word's as they follow it in the whole
    paragraph (as lm-eval cuts a continuation): tokenized alone, " word"
    gains a token under a SentencePiece normalizer that prepends "▁" itself.
    Where the paragraph's tokens do not start with the context's, the word
    is tokenized alone."""
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    whole = tokenizer(context + " " + word, add_special_tokens=False)["input_ids"]
    if len(whole) > len(context_ids) and whole[:len(context_ids)] == context_ids:
        return context_ids, whole[len(context_ids):]
    return context_ids, tokenizer(" " + word, add_special_tokens=False)["input_ids"]


class Reference:
    """The unquantized base model in transformers: full next-token distributions.
    The weights load on first use: a job whose reference results are all
    cached never loads them."""

    def __init__(self, path: Path, device: str):
        import torch
        self.path = path
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        from quantize.common.dtypes import checkpoint_dtype, compute_dtype
        self.dtype = compute_dtype(checkpoint_dtype(path), "auto", self.device)

    @functools.cached_property
    def model(self):
        model = hf_load.causal_lm(self.path, dtype=self.dtype, use_safetensors=True)
        return model.to(self.device).eval()

    def release(self) -> None:
        """Frees the weights, and on a GPU the blocks torch's allocator keeps
        cached for them: a vLLM started next in this process (lm-eval's, a
        sweep's next job) refuses to start without that memory free."""
        if self.__dict__.pop("model", None) is None:
            return
        gc.collect()
        if self.device.startswith("cuda"):
            import torch
            torch.cuda.empty_cache()

    def log_probs(self, ids: list[int]):
        """[len(ids) - 1, vocab] float32 log-probabilities predicting ids[1:].
        float32 holds bf16/fp16 logits exactly; its log-softmax differs from
        float64's by < 2e-5 nats (SmolLM2, measured), far below the KL it
        feeds, and takes a third less time."""
        import torch
        with torch.inference_mode():
            logits = self.model(torch.tensor([ids], device=self.device)).logits[0, :-1]
            return torch.log_softmax(logits.float(), dim=-1).cpu().numpy()

    def continues(self, ids: list[int], n: int) -> bool:
        """Whether greedy decoding gives the last n tokens of ids: each is its
        position's top token, an exact tie going to the lowest token id (as
        _greedy judges the engine's). From log_probs' full forward pass, so an
        engine running the same weights the same way in transformers gets the
        same values, ties and all."""
        log_probs = self.log_probs(ids)[-n:]
        return all(int(row.argmax()) == token for row, token in zip(log_probs, ids[-n:]))


def needed_len(config: AccuracyConfig) -> int:
    """Context the engine needs for the accuracy requests: each prompt plus
    one generated token (last-word prompts end in a word of up to 16 tokens)."""
    return max(int(config.window_len) + 1, int(config.lastword.context_tokens) + WORD_TOKENS)


def validate(config: AccuracyConfig, target, max_model_len: int | None = None) -> None:
    """Checks that need no engine, so bad input fails before anything starts."""
    check_sizes(config)
    needed = needed_len(config)
    if target.max_context and needed > target.max_context:
        raise UserError(f"the accuracy requests need {needed} tokens, which exceeds the model's context "
                        f"({target.max_context} tokens); {_shrink(config, target.max_context)}")
    if max_model_len and needed > int(max_model_len):
        raise UserError(f"the accuracy requests need {needed} tokens but engine.args.max_model_len is "
                        f"{max_model_len}; raise it to at least {needed}, or {_shrink(config, int(max_model_len))}")
    text = held_out_text(config.text, config.books)
    reference = reference_path(target, config)
    machine.check_device("accuracy.reference_device", config.reference_device or "cpu")
    tokenizer_dir = target.path if target.built else target.base_model
    tokenizer = check_text_holds_the_pass(config, text, tokenizer_dir)
    check_same_vocabulary(reference, tokenizer_dir, tokenizer)


def check_text_holds_the_pass(config: AccuracyConfig, text: str, tokenizer_dir: Path):
    """The held-out text holds the windows and last-word paragraphs asked
    for: cut here as the pass cuts them (the tokens are cached: ~0.1 s for
    SmolLM2 once its tokenizer is loaded), so too few fail before the speed
    runs, not after them. Returns the tokenizer."""
    lastword_passages(text, int(config.lastword.num_items), int(config.lastword.min_words), seed=0)  # seed: which, not how many
    try:
        tokenizer = hf_load.tokenizer(tokenizer_dir)
    except (OSError, ValueError) as e:
        raise UserError(f"the tokenizer of {tokenizer_dir} does not load ({one_line(e)}); the accuracy pass "
                        "needs it: add its tokenizer files, or pass accuracy=none") from None
    windows(tokenizer, text, int(config.num_windows), int(config.window_len))
    return tokenizer


def check_same_vocabulary(reference: Path, tokenizer_dir: Path, tokenizer) -> None:
    """The reference scores the artifact's token ids, so an id must stand for
    the same text in both: another vocabulary gave an IndexError after the
    speed runs, or a KL between unrelated tokens. A reference without
    tokenizer files is checked by its config's vocab_size alone."""
    if reference.resolve() == Path(tokenizer_dir).resolve():
        return
    try:
        same = hf_load.tokenizer(reference).get_vocab() == tokenizer.get_vocab()
    except (OSError, ValueError):
        same = _vocab_size(reference) == _vocab_size(tokenizer_dir)
    if not same:
        raise UserError(f"accuracy reference {reference} has another vocabulary than {tokenizer_dir}, so their "
                        "token ids cannot be compared; set accuracy.reference=<the unquantized checkpoint it was "
                        "made from> or pass accuracy=none")


def _vocab_size(model_dir: Path) -> int | None:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")


# The pass's sizes and the least each takes (a window is a prompt and the token it predicts).
LEAST = {"num_windows": 1, "window_len": 2, "top_k": 1, "lastword.num_items": 1, "lastword.min_words": 1,
         "lastword.context_tokens": 1}


def _shrink(config: AccuracyConfig, limit: int) -> str:
    """What to lower so that every accuracy request fits `limit` tokens."""
    if limit <= WORD_TOKENS:
        return f"pass accuracy=none ({limit} tokens are too few for the last-word task)"
    fixes = [f"accuracy.window_len to at most {limit - 1}"] if int(config.window_len) >= limit else []
    if int(config.lastword.context_tokens) + WORD_TOKENS > limit:
        fixes.append(f"accuracy.lastword.context_tokens to at most {limit - WORD_TOKENS}")
    return f"lower {' and '.join(fixes)}, or pass accuracy=none"


def check_sizes(config: AccuracyConfig) -> None:
    """A size below its least failed after every speed run (a ValueError or
    RuntimeError in the pass), or ran a pass that measured nothing."""
    for key, least in LEAST.items():
        value = getattr(config.lastword, key.partition(".")[2]) if key.startswith("lastword.") else getattr(config, key)
        if value < least:
            raise UserError(f"accuracy.{key}={shown(value)}: pass an integer >= {least}")


def engine_pass(engine, config: AccuracyConfig, tokenizer, seed: int) -> dict:
    """Everything the engine must compute; the engine can be closed afterwards,
    so the reference model never competes with it for cores or memory."""
    text = held_out_text(config.text, config.books)
    wins = windows(tokenizer, text, int(config.num_windows), int(config.window_len))
    items = lastword_items(tokenizer, text, int(config.lastword.num_items), int(config.lastword.min_words),
                           int(config.lastword.context_tokens), seed)
    log.info("accuracy: %d windows x %d tokens, %d last-word items", len(wins), config.window_len, len(items))
    return {"windows": wins, "items": items,
            "window_logprobs": engine.prompt_logprobs(wins, int(config.top_k)),
            # top-k, not top-1: a tie at the top is told apart only beside a token below it
            "item_logprobs": engine.prompt_logprobs([p for p, _ in items], int(config.top_k))}


@dataclass
class Scores:
    """What an accuracy row records: the metrics (this module's docstring),
    and the per-window and per-item values they are sums of (`samples`), so
    the report can bound them by resampling windows or items."""
    metrics: dict
    samples: dict


def score(passed: dict, target, config: AccuracyConfig) -> Scores:
    """Compare the engine's logprobs with the reference model's distributions."""
    ref = Reference(reference_path(target, config), config.reference_device)
    try:
        return _compare(passed, ref, config)
    except BaseException as e:
        # the failed forward's frames hold the model: free them, or release() frees nothing
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        ref.release()


def _compare(passed: dict, ref: Reference, config: AccuracyConfig) -> Scores:
    wins, items = passed["windows"], passed["items"]
    per_window = [window_sums(ids, positions, ref_lp) for ids, positions, ref_lp in
                  zip(wins, passed["window_logprobs"], reference_window_log_probs(ref, wins))]
    nll, ref_nll, kl, agree, scored = (sum(column) for column in zip(*per_window))
    art_hits = [all(_greedy(pos) == tok for pos, tok in _targets(p, n, lp))
                for (p, n), lp in zip(items, passed["item_logprobs"])]
    ref_hits = reference_hits(ref, items)
    ppl, ref_ppl = math.exp(nll / scored), math.exp(ref_nll / scored)
    acc, ref_acc = sum(art_hits) / len(items), sum(ref_hits) / len(items)
    metrics = {
        "perplexity": ppl, "reference_perplexity": ref_ppl,
        "kl_divergence": kl / scored, "top1_agreement": agree / scored,
        "lastword_accuracy": acc, "reference_lastword_accuracy": ref_acc,
        "recovery_pct": 100 * ref_ppl / ppl,
        "lastword_recovery_pct": 100 * acc / ref_acc if ref_acc else None,
        "scored_tokens": scored, "lastword_items": len(items), "top_k": int(config.top_k),
        "reference": str(ref.path), "reference_dtype": str(ref.dtype).removeprefix("torch."),
        "reference_device": ref.device,
    }
    columns = dict(zip(SAMPLE_COLUMNS, (list(c) for c in zip(*per_window))))
    return Scores(metrics, columns | {"item_hits": [int(h) for h in art_hits],
                                      "item_reference_hits": [int(h) for h in ref_hits]})


# Row.accuracy_samples' per-window columns, in window order: the window's
# sums of the artifact's and the reference's NLL (nats), of the KL (nats),
# its top-1 agreements and its scored tokens. Per item: 1 where right.
SAMPLE_COLUMNS = ("window_nll", "window_reference_nll", "window_kl", "window_top1", "window_tokens")


def window_sums(ids: list[int], positions, ref_lp) -> tuple[float, float, float, int, int]:
    """(NLL, reference NLL, KL, top-1 agreements, scored tokens) summed over one window."""
    nll, ref_nll, kl, agree = 0.0, 0.0, 0.0, 0
    for i in range(1, len(ids)):
        q = positions[i]   # {token id: (logprob, rank)} from the engine
        p = ref_lp[i - 1]
        nll -= q[ids[i]][0]
        ref_nll -= float(p[ids[i]])  # sums in float64, whatever the reference's dtype
        kl += _partition_kl(p, q)
        agree += int(_greedy(q) == int(p.argmax()))
    return nll, ref_nll, kl, agree, len(ids) - 1


def reference_path(target, config: AccuracyConfig) -> Path:
    if config.reference:
        path = resolve(config.reference)
    elif target.manifest:
        path = Path(target.manifest.model.path)
    elif target.base_model:
        path = target.base_model
    elif is_quantized(target.config):  # its own scores would match it exactly
        raise UserError(f"{target.path} is already quantized, so it cannot be its own reference; pass "
                        "accuracy.reference=<its unquantized checkpoint> or accuracy=none")
    else:
        path = target.path  # a plain dense checkpoint is its own reference
    if not (path / "config.json").is_file():
        raise UserError(f"reference model {path} not found; set accuracy.reference=<unquantized checkpoint dir>")
    hf_load.refuse_model_code(path)
    return path


# Engines return float32 logprobs: each is rounded by up to about |logprob| x
# this, and their normalization by about as much.
FLOAT32_EPS = float(np.finfo(np.float32).eps)


def _partition_kl(p_log: np.ndarray, q: dict) -> float:
    ids = np.fromiter(q.keys(), dtype=np.int64)
    q_in = np.exp(np.array([v[0] for v in q.values()], dtype=np.float64))
    q_log = np.log(np.maximum(q_in, 1e-300))
    p_in = np.exp(p_log[ids].astype(np.float64))
    kl = float(np.sum(p_in * (np.log(np.maximum(p_in, 1e-300)) - q_log)))
    p_rest = max(1.0 - p_in.sum(), 0.0)
    if p_rest > 1e-12:
        # The artifact's rest is known only to the rounding of its returned
        # mass (~1e-7): where the returned tokens hold nearly all of it, that
        # rounding decided the term. Its largest value keeps the KL a lower bound.
        q_rest = max(1.0 - q_in.sum(), 0.0) + FLOAT32_EPS * (1.0 + float(np.sum(q_in * -q_log)))
        kl += p_rest * math.log(p_rest / q_rest)
    return max(kl, 0.0)


def _greedy(q: dict) -> int | None:
    """The token greedy decoding takes from the engine's returned logprobs
    (its top-k, which always holds the top): an exact tie goes to the lowest
    token id, as numpy's argmax gives the reference's, whatever order the
    engine lists tied tokens in (torch.topk's; vLLM ranks a tied token after
    it). None where every returned token ties: the tie may reach past them
    (a flat distribution, a broken artifact), so no token is its pick."""
    best = max(v[0] for v in q.values())
    tied = [t for t, (logprob, _) in q.items() if logprob == best]
    if len(tied) == len(q) > 1:
        return None
    return min(tied)


def _targets(prompt: list[int], n: int, positions):
    return [(positions[i], prompt[i]) for i in range(len(prompt) - n, len(prompt))]


# The last reference's window log-probs, for the next job of this process: a
# sweep's artifacts share one base model and one window set. Full vocabulary
# rows, so only sets up to this size are held (SmolLM2's default: 0.8 GB).
KEEP_WINDOW_BYTES = 2 * 2**30
_kept_windows: dict[str, list[np.ndarray]] = {}


def reference_window_log_probs(ref: Reference, wins) -> list[np.ndarray]:
    """The reference's log-probs for each window, computed once per process
    while the reference and the windows stay the same."""
    key = _reference_key(ref, wins)
    if key in _kept_windows:
        return _kept_windows[key]
    _kept_windows.clear()
    log_probs = [ref.log_probs(ids) for ids in wins]
    if sum(lp.nbytes for lp in log_probs) <= KEEP_WINDOW_BYTES:
        _kept_windows[key] = log_probs
    return log_probs


def reference_hits(ref: Reference, items) -> list[bool]:
    """Per last-word item, whether the reference gets it right. The same for
    every artifact of one base model, so it is computed once (a forward pass
    per item) and kept in .cache/accuracy/, keyed by everything it depends on."""
    # "ties": a tie at the top counts as a hit (files before counted the first tied token only).
    file = CACHE_DIR / "accuracy" / f"lastword-lowest-id-{_reference_key(ref, items)}.json"
    try:
        return json.loads(file.read_text())["hits"]
    except (OSError, ValueError, KeyError):
        pass
    hits = [ref.continues(prompt, n) for prompt, n in items]
    atomic.write_json(file, {"reference": str(ref.path), "hits": hits})
    return hits


def _reference_key(ref: Reference, inputs) -> str:
    """The reference weights (file names, sizes, modification times), how they
    run (dtype, device, library versions) and the input tokens."""
    files = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in weight_files(ref.path)]
    runs = [str(ref.dtype), ref.device, metadata.version("torch"), metadata.version("transformers")]
    return hashlib.sha256(json.dumps([files, runs, inputs]).encode()).hexdigest()[:16]
