"""evaluate/accuracy.py: the KL divergence on the partition {each returned
token, everything else}, from the engine's top-k logprobs and the reference's
full distribution, against a direct computation."""
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from evaluate.accuracy import _partition_kl
from quantize.common.errors import UserError

P = [0.40, 0.25, 0.15, 0.10, 0.06, 0.04]   # reference distribution over a 6-token vocabulary
Q = [0.30, 0.30, 0.20, 0.05, 0.10, 0.05]   # the artifact's


def engine_topk(q: list[float], ids: list[int]) -> dict:
    """What the engine returns: {token id: (logprob, rank)} for some tokens."""
    order = sorted(range(len(q)), key=lambda t: -q[t])
    return {t: (math.log(q[t]), order.index(t) + 1) for t in ids}


def direct_partition_kl(p: list[float], q: list[float], ids: list[int]) -> float:
    """KL(p || q) over the cells {i} for i in ids, plus one cell for the rest."""
    kl = sum(p[i] * math.log(p[i] / q[i]) for i in ids)
    p_rest = 1 - sum(p[i] for i in ids)
    q_rest = 1 - sum(q[i] for i in ids)
    return kl + (p_rest * math.log(p_rest / q_rest) if p_rest > 0 else 0.0)


def full_kl(p, q) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q))


@pytest.mark.parametrize("ids", [[0, 1, 2], [1, 4], [3], [0, 1, 2, 3, 4]])
def test_matches_the_direct_computation_on_the_partition(ids):
    got = _partition_kl(np.log(np.array(P)), engine_topk(Q, ids))
    assert got == pytest.approx(direct_partition_kl(P, Q, ids), abs=1e-6)  # less the float32 margin of the rest
    assert 0 < got <= full_kl(P, Q) + 1e-12  # a lower bound of the full-vocabulary KL (data processing)


def test_equals_the_full_kl_when_every_token_is_returned():
    got = _partition_kl(np.log(np.array(P)), engine_topk(Q, list(range(len(Q)))))
    assert got == pytest.approx(full_kl(P, Q), rel=1e-9)


@pytest.mark.parametrize("ids", [[0], [0, 1, 2], list(range(6))])
def test_is_zero_for_the_same_distribution(ids):
    assert _partition_kl(np.log(np.array(P)), engine_topk(P, ids)) == pytest.approx(0, abs=1e-12)


def test_the_remainder_cell_counts():
    """Same mass on the returned tokens, different elsewhere: the returned
    cells agree, so all of the KL comes from how the rest differs in total."""
    p = [0.5, 0.3, 0.2]
    q = [0.5, 0.1, 0.4]
    got = _partition_kl(np.log(np.array(p)), engine_topk(q, [0]))
    assert got == pytest.approx(0, abs=1e-12)  # rest is 0.5 in both: this partition cannot tell them apart
    got = _partition_kl(np.log(np.array(p)), engine_topk(q, [1]))
    assert got == pytest.approx(0.3 * math.log(0.3 / 0.1) + 0.7 * math.log(0.7 / 0.9), abs=1e-6)


@pytest.mark.parametrize("q_rest", [1e-6, 1e-7, 1e-8, 1e-9])
def test_stays_a_lower_bound_where_the_returned_tokens_hold_nearly_all_the_mass(q_rest):
    """float32 logprobs (as engines return them) know the artifact's mass
    outside its top 20 only to ~1e-7: that rounding must not lift the KL
    above the true one."""
    vocab, k, p_rest = 1000, 20, 1e-3
    q = np.full(vocab, q_rest / (vocab - k))
    q[:k] = (1 - q_rest) / k
    p = np.full(vocab, p_rest / (vocab - k))
    p[:k] = (1 - p_rest) / k
    cells = float(np.sum(p[:k] * np.log(p[:k] / q[:k])))
    exact = cells + p_rest * math.log(p_rest / q_rest)
    q32, p32 = np.log(q).astype(np.float32), np.log(p).astype(np.float32)
    got = _partition_kl(p32, {t: (float(q32[t]), t + 1) for t in range(k)})
    assert cells + p_rest * math.log(p_rest / (q_rest + 1e-6)) <= got <= exact   # as close as float32 tells


# The reference's last-word results: a cheap forward pass and a cache that is
# used only while nothing they depend on changed.

ITEMS = [([5, 17, 42, 8, 99, 3, 61], 2), ([7, 7, 12, 300, 4], 1), ([250, 11, 9, 31], 3)]


@pytest.fixture()
def ref_dir(tiny_model, tmp_path):
    """A copy of the tiny model, so its files can be touched."""
    return Path(shutil.copytree(tiny_model, tmp_path / "reference"))


@pytest.fixture()
def reference(ref_dir):
    from evaluate.accuracy import Reference
    return Reference(ref_dir, "cpu")


def test_a_greedy_continuation_is_a_hit(reference, ref_dir, tmp_path, monkeypatch):
    """Items made of the reference's own greedy tokens are all hits; the same
    items with a changed last token are not."""
    from evaluate import accuracy
    monkeypatch.setattr(accuracy, "CACHE_DIR", tmp_path)
    prompt = [5, 17, 42]
    for _ in range(3):
        prompt.append(int(reference.log_probs(prompt + [0])[-1].argmax()))
    wrong = prompt[:-1] + [(prompt[-1] + 1) % 500]
    assert accuracy.reference_hits(reference, [(prompt, 3), (wrong, 1), (wrong, 3)]) == [True, False, False]


def test_the_reference_hits_are_cached_until_what_they_depend_on_changes(reference, ref_dir, tmp_path,
                                                                         monkeypatch):
    from evaluate import accuracy
    monkeypatch.setattr(accuracy, "CACHE_DIR", tmp_path)
    first = accuracy.reference_hits(reference, ITEMS)
    (cached,) = (tmp_path / "accuracy").glob("lastword-*.json")

    def no_forward(*_):
        raise AssertionError("computed again although cached")
    monkeypatch.setattr(reference, "continues", no_forward)
    assert accuracy.reference_hits(reference, ITEMS) == first

    monkeypatch.undo()  # the real greedy, and a fresh cache folder
    monkeypatch.setattr(accuracy, "CACHE_DIR", tmp_path)
    calls = []
    real_continues = reference.continues
    monkeypatch.setattr(reference, "continues", lambda ids, n: calls.append(1) or real_continues(ids, n))
    accuracy.reference_hits(reference, ITEMS[:2])           # other items
    assert len(calls) == 2
    weights = next(ref_dir.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the weights rewritten
    accuracy.reference_hits(reference, ITEMS)
    assert len(calls) == 5
    assert len(list((tmp_path / "accuracy").glob("lastword-*.json"))) == 3 and cached.is_file()


# The reference's window log-probs: kept in memory for the next job of the
# process (a sweep's artifacts share the base model), while nothing changed.

WINDOWS = [[5, 17, 42, 8, 99, 3, 61, 2], [250, 11, 9, 31, 7, 7, 12, 300]]


@pytest.fixture()
def kept(monkeypatch):
    from evaluate import accuracy
    monkeypatch.setattr(accuracy, "_kept_windows", {})
    return accuracy


def test_the_window_log_probs_are_computed_once_while_the_reference_and_windows_stay(kept, reference, ref_dir,
                                                                                      monkeypatch):
    calls = []
    real = reference.log_probs
    monkeypatch.setattr(reference, "log_probs", lambda ids: calls.append(1) or real(ids))
    first = kept.reference_window_log_probs(reference, WINDOWS)
    assert len(calls) == 2 and [lp.shape for lp in first] == [(7, reference.model.config.vocab_size)] * 2
    again = kept.reference_window_log_probs(reference, WINDOWS)
    assert len(calls) == 2 and all(a is b for a, b in zip(again, first))

    kept.reference_window_log_probs(reference, WINDOWS[:1])              # other windows
    assert len(calls) == 3
    weights = next(ref_dir.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the weights rewritten
    kept.reference_window_log_probs(reference, WINDOWS[:1])
    assert len(calls) == 4


def test_window_log_probs_over_the_budget_are_not_kept(kept, reference, monkeypatch):
    monkeypatch.setattr(kept, "KEEP_WINDOW_BYTES", 0)
    calls = []
    real = reference.log_probs
    monkeypatch.setattr(reference, "log_probs", lambda ids: calls.append(1) or real(ids))
    kept.reference_window_log_probs(reference, WINDOWS)
    kept.reference_window_log_probs(reference, WINDOWS)
    assert len(calls) == 4 and kept._kept_windows == {}


def test_a_job_whose_reference_results_are_kept_never_loads_the_reference(kept, ref_dir, tmp_path, monkeypatch):
    from evaluate.accuracy import Reference
    monkeypatch.setattr(kept, "CACHE_DIR", tmp_path)
    first = Reference(ref_dir, "cpu")
    windows = kept.reference_window_log_probs(first, WINDOWS)
    hits = kept.reference_hits(first, ITEMS)
    assert "model" in first.__dict__

    second = Reference(ref_dir, "cpu")   # the next artifact's job
    assert [lp is kept_lp for lp, kept_lp in zip(kept.reference_window_log_probs(second, WINDOWS), windows)] == [True] * 2
    assert kept.reference_hits(second, ITEMS) == hits
    assert "model" not in second.__dict__


class Weights:
    """Stands for a reference model on a GPU: only whether it is still held counts."""

    def to(self, device):
        return self

    def eval(self):
        return self


@pytest.mark.parametrize("fails", [False, True])
def test_the_reference_on_a_gpu_gives_its_memory_back_after_scoring_even_when_scoring_fails(
        kept, ref_dir, tmp_path, monkeypatch, fails):
    """torch's caching allocator keeps a freed model's blocks: vLLM, started
    next in the process (lm-eval's, a sweep's next job), found them taken."""
    import gc
    import weakref
    import torch
    from evaluate.accuracy import AccuracyConfig, LastWordConfig, score
    held, emptied = [], []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append([w() is None for w in held]))
    monkeypatch.setattr(kept, "CACHE_DIR", tmp_path)

    def load(path, **_):
        weights = Weights()
        held.append(weakref.ref(weights))
        return weights
    monkeypatch.setattr(kept.hf_load, "causal_lm", load)

    def log_probs(self, ids):
        assert self.model is not None
        if fails:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return np.zeros((len(ids) - 1, 400), dtype=np.float32)
    monkeypatch.setattr(kept.Reference, "log_probs", log_probs)
    config = AccuracyConfig("t", "austen", [], 1, len(WINDOWS[0]), 1, LastWordConfig(1, 1, 8),
                            reference=str(ref_dir), reference_device="cuda")
    positions = [None] + [{t: (-1.0, 1)} for t in WINDOWS[0][1:]]
    passed = {"windows": WINDOWS[:1], "items": ITEMS[:1], "window_logprobs": [positions],
              "item_logprobs": [[{t: (-1.0, 1)} for t in ITEMS[0][0]]]}
    if fails:
        with pytest.raises(RuntimeError):
            score(passed, None, config)
    else:
        score(passed, None, config)
    gc.collect()
    assert len(held) == 1 and emptied == [[True]]   # the weights were gone before the cache was emptied


def test_a_reference_whose_forward_fails_is_freed_before_the_cache_is_emptied(kept, ref_dir, tmp_path, monkeypatch):
    """An error inside the model's forward (a CUDA OOM) keeps its frames, and
    with them the model, alive in the traceback: release() must not run
    while they hold it."""
    import functools
    import weakref
    import torch
    from evaluate.accuracy import AccuracyConfig, LastWordConfig, score
    held, emptied = [], []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(held[0]() is None))
    monkeypatch.setattr(kept, "CACHE_DIR", tmp_path)

    class Boom(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, ids):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def load(path, **_):
        model = Boom()
        held.append(weakref.ref(model))
        return model
    monkeypatch.setattr(kept.hf_load, "causal_lm", load)
    # no GPU here: the model and its input stay on the CPU
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, device: self)
    monkeypatch.setattr(torch, "tensor", functools.partial(lambda tensor, data, device=None: tensor(data), torch.tensor))
    config = AccuracyConfig("t", "austen", [], 1, len(WINDOWS[0]), 1, LastWordConfig(1, 1, 8),
                            reference=str(ref_dir), reference_device="cuda")
    passed = {"windows": WINDOWS[:1], "items": ITEMS[:1], "window_logprobs": [[None]], "item_logprobs": [[]]}
    with pytest.raises(RuntimeError, match="out of memory"):
        score(passed, None, config)
    assert emptied == [True]


# The row keeps the per-window and per-item values its metrics are sums of,
# so that the report can bound them (evaluate/analysis/accuracy_bounds.py).

def engine_positions(log_probs: np.ndarray, ids: list[int], top_k: int, shift: float) -> list:
    """What an engine returns for a prompt: per position, the top-k of a
    distribution a little off the reference's (and the actual token)."""
    out = [None]
    for i in range(1, len(ids)):
        lp = log_probs[i - 1].astype(np.float64) + shift * np.cos(np.arange(log_probs.shape[1]) * (i + 1))
        lp -= np.logaddexp.reduce(lp)
        order = np.argsort(-lp)
        keep = [int(t) for t in order[:top_k]] + [ids[i]]
        out.append({t: (float(lp[t]), int(np.where(order == t)[0][0]) + 1) for t in keep})
    return out


def test_the_row_keeps_the_values_its_metrics_sum(kept, ref_dir, reference, tmp_path, monkeypatch):
    from evaluate.accuracy import AccuracyConfig, LastWordConfig, score
    monkeypatch.setattr(kept, "CACHE_DIR", tmp_path)
    config = AccuracyConfig("t", "austen", [], len(WINDOWS), len(WINDOWS[0]), 3, LastWordConfig(len(ITEMS), 1, 8),
                            reference=str(ref_dir))
    passed = {"windows": WINDOWS, "items": ITEMS,
              "window_logprobs": [engine_positions(reference.log_probs(w), w, 3, 0.3) for w in WINDOWS],
              "item_logprobs": [engine_positions(reference.log_probs(p), p, 1, 0.3) for p, _ in ITEMS]}
    scores = score(passed, None, config)
    m, s = scores.metrics, scores.samples
    tokens = sum(s["window_tokens"])
    assert s["window_tokens"] == [len(w) - 1 for w in WINDOWS] and tokens == m["scored_tokens"]
    assert math.exp(sum(s["window_nll"]) / tokens) == pytest.approx(m["perplexity"], rel=1e-12)
    assert 100 * math.exp((sum(s["window_reference_nll"]) - sum(s["window_nll"])) / tokens) == \
        pytest.approx(m["recovery_pct"], rel=1e-12)
    assert sum(s["window_kl"]) / tokens == pytest.approx(m["kl_divergence"], rel=1e-12) and m["kl_divergence"] > 0
    assert sum(s["window_top1"]) / tokens == pytest.approx(m["top1_agreement"])
    assert len(s["item_hits"]) == len(s["item_reference_hits"]) == m["lastword_items"] == len(ITEMS)
    assert sum(s["item_hits"]) / len(ITEMS) == pytest.approx(m["lastword_accuracy"])
    assert sum(s["item_reference_hits"]) / len(ITEMS) == pytest.approx(m["reference_lastword_accuracy"])
    assert m["reference"] == str(ref_dir) and m["reference_device"] == "cpu"  # what the figures are against


# Exact ties at the top (bf16 logits tie at ~3 % of SmolLM2's positions):
# engines list tied tokens in an order of their own, which must not count.

def high_id_first(log_probs: np.ndarray, targets: list[int], k: int) -> list[dict]:
    """An engine's positions where tied tokens are listed highest id first
    (numpy's argmax takes the lowest) and a token ranks after every token
    tied with it, as vLLM counts the logprobs >= its own."""
    out = []
    for row, target in zip(log_probs, targets):
        near = np.flatnonzero(row >= np.partition(row, -k)[-k])   # the top k and any tied with the k-th
        order = sorted(near, key=lambda t: (-row[t], -t))[:k]
        d = {int(t): (float(row[t]), r + 1) for r, t in enumerate(order)}
        d.setdefault(target, (float(row[target]), int((row >= row[target]).sum())))
        out.append(d)
    return out


def test_a_tie_at_the_top_goes_to_the_lowest_id_whichever_tied_token_the_engine_lists_first():
    from evaluate.accuracy import window_sums
    p = np.log(np.array([[0.1, 0.3, 0.3, 0.2, 0.1]], dtype=np.float32))   # tokens 1 and 2 tie first
    for first, second in [(1, 2), (2, 1)]:
        q = {first: (float(p[0, first]), 1), second: (float(p[0, second]), 2), 3: (float(p[0, 3]), 4)}
        assert window_sums([0, 3], [None, q], p)[3] == 1
    alone = np.log(np.array([[0.1, 0.31, 0.29, 0.2, 0.1]], dtype=np.float32))   # token 1 alone first
    q = {2: (float(p[0, 2]), 1), 1: (float(p[0, 1]), 2), 3: (float(p[0, 3]), 4)}   # the engine's 1 and 2 tie
    assert window_sums([0, 3], [None, q], alone)[3] == 1
    second_alone = np.log(np.array([[0.1, 0.29, 0.31, 0.2, 0.1]], dtype=np.float32))
    assert window_sums([0, 3], [None, q], second_alone)[3] == 0   # the engine's tie went to 1, the reference's pick is 2
    q = {2: (-1.0, 1), 1: (-1.5, 2), 3: (-2.0, 3)}
    assert window_sums([0, 3], [None, q], alone)[3] == 0   # a real disagreement still counts


def test_a_flat_artifact_whose_returned_tokens_all_tie_agrees_nowhere():
    """Its top-k and the actual token all tie: counting any tied token as its
    pick made a broken (uniform) artifact agree wherever the reference's top
    was the actual token, and hit every last-word item."""
    from evaluate.accuracy import window_sums
    p = np.log(np.array([[0.1, 0.2, 0.4, 0.2, 0.1]], dtype=np.float32))   # the reference's top: 2
    flat = {t: (-math.log(5), 1) for t in (0, 1, 2)}   # top-2 and the actual token 2, all alike
    assert window_sums([0, 2], [None, flat], p)[3] == 0


def test_an_artifact_identical_to_its_reference_agrees_with_it_whatever_its_tie_order(tokenizer_dir, tmp_path,
                                                                                       monkeypatch):
    """The reference and an engine running its weights in bf16 (engine=hf,
    and one that breaks ties the other way): top-1 agreement 1.0 and the
    reference's last-word accuracy, on windows and items full of ties."""
    import random
    from types import SimpleNamespace

    import torch

    from evaluate import accuracy
    from evaluate.engines.hf import HfEngine
    from quantize.common import dtypes, hf_load
    from quantize.common.tiny_model import build_tiny_llama
    model_dir = build_tiny_llama(tmp_path / "peaked", tokenizer_dir, initializer_range=0.2)  # peaked: bf16 ties
    monkeypatch.setattr(dtypes, "compute_dtype", lambda *_: torch.bfloat16)   # the reference in bf16 on any CPU
    monkeypatch.setattr(accuracy, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(accuracy, "_kept_windows", {})
    ref = accuracy.Reference(model_dir, "cpu")
    rng = random.Random(0)
    wins = [[rng.randrange(1000) for _ in range(48)] for _ in range(4)]
    items = []   # each ends in a token tied first: the lowest id of the tie (a hit), or the highest (a miss)
    for w in wins:
        for i, window_row in enumerate(ref.log_probs(w)):
            row = ref.log_probs(w[:i + 2])[-1] if (window_row == window_row.max()).sum() > 1 else window_row
            tied = np.flatnonzero(row == row.max())   # as the item's own forward pass gives it
            if len(tied) > 1:
                items += [(w[:i + 1] + [int(tied[0])], 1), (w[:i + 1] + [int(tied[-1])], 1)]
    assert len(items) >= 6

    hf = SimpleNamespace(model=hf_load.causal_lm(model_dir, dtype=torch.bfloat16).eval(), device="cpu")

    def other_order(prompts, k):
        with torch.inference_mode():
            return [[None, *high_id_first(torch.log_softmax(hf.model(torch.tensor([ids])).logits[0, :-1].float(),
                                                            -1).numpy(), ids[1:], k)] for ids in prompts]
    config = accuracy.AccuracyConfig("t", "austen", [], len(wins), len(wins[0]), 5,
                                     accuracy.LastWordConfig(len(items), 1, 48), reference=str(model_dir))
    for prompt_logprobs in (lambda prompts, k: HfEngine.prompt_logprobs(hf, prompts, k), other_order):
        passed = {"windows": wins, "items": items, "window_logprobs": prompt_logprobs(wins, 5),
                  "item_logprobs": prompt_logprobs([p for p, _ in items], 5)}
        m = accuracy.score(passed, None, config).metrics
        assert m["reference_dtype"] == "bfloat16" and m["kl_divergence"] == pytest.approx(0, abs=1e-9)
        assert m["top1_agreement"] == 1.0
        assert m["lastword_accuracy"] == m["reference_lastword_accuracy"] == 0.5


# The last-word items: the word's tokens are the ones it has after its context.

def sentencepiece_tokenizer(folder: Path, words: list[str]):
    """A Llama-2/Mistral-style tokenizer.json (SentencePiece BPE as HF exports
    it: normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer) that
    knows "▁<word>" for each of `words`; anything else is spelled out."""
    import json as _json
    from tokenizers import Tokenizer, decoders, models, normalizers
    from quantize.common import hf_load
    vocab, merges = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "▁▁": 4}, [("▁", "▁")]
    for ch in sorted(set("".join(words) + "abcdefghijklmnopqrstuvwxyz")):
        vocab.setdefault(ch, len(vocab))
    for w in words:
        merged = "▁"
        for ch in w:
            merges.append((merged, ch))
            merged += ch
            vocab.setdefault(merged, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Strip(" ", 1, 0)])
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(_json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return hf_load.tokenizer(folder)


PARAGRAPHS = ["Shall I take any message", "Will you take the taste", "I shall take it to our incomprehensibilities"]


@pytest.mark.parametrize("which", ["sentencepiece", "smollm2"])
def test_a_last_word_has_the_tokens_it_has_after_its_context(which, tokenizer_dir, tmp_path):
    """Tokenized alone, " message" was "▁▁" + its letters under a SentencePiece
    normalizer: a target the text never holds, so no model got it right. A
    word spelled out in many tokens takes context tokens, not more room."""
    from evaluate.accuracy import WORD_TOKENS, lastword_items
    from quantize.common import hf_load
    tok = (sentencepiece_tokenizer(tmp_path / "sp", ["Shall", "I", "take", "any", "message", "the", "it"])
           if which == "sentencepiece" else hf_load.tokenizer(tokenizer_dir))
    context_tokens = 8
    items = lastword_items(tok, "\n\n".join(PARAGRAPHS), len(PARAGRAPHS), 1, context_tokens, seed=0)
    wholes = [tok(p, add_special_tokens=False)["input_ids"] for p in PARAGRAPHS]
    contexts = [tok(p.rsplit(" ", 1)[0], add_special_tokens=False)["input_ids"] for p in PARAGRAPHS]
    for prompt, n in items:
        (i,) = [i for i, whole in enumerate(wholes) if whole[-len(prompt):] == prompt]  # the paragraph's own tokens
        assert prompt[-n:] == wholes[i][len(contexts[i]):]  # the word's, as they follow its context
        assert len(prompt) <= context_tokens + WORD_TOKENS


# A local held-out text is one measurement while it holds the same text:
# the row's key is its content's hash, the path is kept for display.

def accuracy_config(text: str):
    from evaluate.accuracy import AccuracyConfig
    return AccuracyConfig.from_group({"name": "mine", "enabled": True, "text": text, "books": [], "num_windows": 2,
                                      "window_len": 16, "top_k": 5,
                                      "lastword": {"num_items": 2, "min_words": 3, "context_tokens": 8}})


def accuracy_row(config):
    from evaluate.results import Row
    return Row(kind="accuracy", artifact_id="a1", scenario=config.name, run_index=0, seed=0,
               accuracy_config=config.as_dict())


def test_an_edited_local_text_is_measured_anew(tmp_path):
    """The key held the file's path alone: a rerun after the text was edited
    took the rows of the old text as complete, and the report set them
    beside rows measured on the new one."""
    from evaluate.results import Row
    text = tmp_path / "held_out.txt"
    text.write_text("The first version of the text.\n")
    config = accuracy_config(str(text))
    before = accuracy_row(config)
    assert accuracy_row(config).run_key() == before.run_key()   # unchanged text: complete, not measured again
    text.write_text("The second version of the text.\n")
    after = accuracy_row(config)
    assert after.run_key() != before.run_key()
    assert after.accuracy_config["text"] == str(text)
    stored = Row.from_dict(json.loads(json.dumps(before.to_dict())))
    assert stored.run_key() == before.run_key()                 # as the store gives it back
    older = {k: v for k, v in before.accuracy_config.items() if k != "text_sha256"}   # a row from before the hash
    assert Row.from_dict(before.to_dict() | {"accuracy_config": older}).run_key() != after.run_key()


def test_austen_rows_keep_their_key():
    """The bundled books do not change: their rows stored before the hash stay complete."""
    config = accuracy_config("austen")
    assert "text_sha256" not in config.as_dict() and config.as_dict()["text"] == "austen"


@pytest.mark.extended
def test_a_rerun_after_the_local_text_was_edited_measures_accuracy_again(tiny_model, tmp_path):
    """The same job, run three times: a second run with the text unchanged
    has nothing to do; after an edit, the accuracy row is measured again."""
    import random

    from evaluate import results
    from tests.conftest import run_cli
    words = "the lady said her sister walked to the house one morning and never thought of it".split()
    paragraph = lambda rng: " ".join(rng.choice(words) for _ in range(40)) + " friendship."
    text = tmp_path / "held_out.txt"
    args = [f"model={tiny_model}", "engine=hf", "scenario=none", f"accuracy.text={text}", "accuracy.num_windows=1",
            "accuracy.window_len=32", "accuracy.lastword.num_items=2", "accuracy.lastword.min_words=3",
            "accuracy.lastword.context_tokens=8", f"results_dir={tmp_path / 'res'}"]
    for seed, expect in ((0, "appended"), (0, "nothing to do"), (1, "appended")):
        rng = random.Random(seed)
        text.write_text("\n\n".join(paragraph(rng) for _ in range(8)))
        out = run_cli("evaluate", *args, cwd=tmp_path)
        assert out.returncode == 0 and expect in out.stdout + out.stderr, out.stderr[-2000:]
    rows = [r for r in results.read(tmp_path / "res") if r.kind == "accuracy"]
    assert len(rows) == 2 and rows[0].accuracy_config["text_sha256"] != rows[1].accuracy_config["text_sha256"]


# The reference scores the artifact's token ids: its vocabulary must be the artifact's.

@pytest.fixture()
def artifact(tiny_model, tmp_path):
    """A plain dense checkpoint (a copy of the tiny model) opened as evaluate opens it."""
    from evaluate.target import from_path
    return from_path(shutil.copytree(tiny_model, tmp_path / "artifact"))


def austen_config(reference: Path):
    from evaluate.accuracy import AccuracyConfig
    return AccuracyConfig.from_group({"name": "austen", "enabled": True, "text": "austen", "books": ["persuasion"],
                                      "num_windows": 2, "window_len": 16, "top_k": 5, "reference": str(reference),
                                      "lastword": {"num_items": 2, "min_words": 30, "context_tokens": 8}})


def test_a_reference_with_another_vocabulary_is_refused_before_any_engine_starts(artifact, tmp_path):
    """Token ids of one vocabulary were scored in another's distributions: an
    IndexError after the speed runs (a smaller vocabulary) or a KL between
    unrelated tokens."""
    from evaluate import accuracy
    from quantize.common.tiny_model import build_tiny_llama
    sentencepiece_tokenizer(tmp_path / "sp", ["the", "and"])
    other = build_tiny_llama(tmp_path / "other", tmp_path / "sp")
    with pytest.raises(UserError, match=rf"^accuracy reference {other} has another vocabulary than {artifact.path}, "
                                        r"so their token ids cannot be compared; set accuracy.reference=<the "
                                        r"unquantized checkpoint it was made from> or pass accuracy=none$"):
        accuracy.validate(austen_config(other), artifact)
    for name in ("tokenizer.json", "tokenizer_config.json"):   # no tokenizer: its config's vocab_size tells
        (other / name).unlink()
    with pytest.raises(UserError, match="has another vocabulary"):
        accuracy.validate(austen_config(other), artifact)


def test_a_reference_with_the_same_vocabulary_passes(artifact, tmp_path, tokenizer_dir):
    from evaluate import accuracy
    from quantize.common.tiny_model import build_tiny_llama
    other = build_tiny_llama(tmp_path / "other", tokenizer_dir, seed=1)   # other weights, the artifact's tokenizer
    accuracy.validate(austen_config(other), artifact)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).unlink()
    accuracy.validate(austen_config(other), artifact)
