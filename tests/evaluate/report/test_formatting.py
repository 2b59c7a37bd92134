"""evaluate/report/formatting.py: units by metric name and number formats."""
from evaluate.report.formatting import (
    LABELS, fmt_fixed, fmt_number, header, inline_json, interval_text, ordered_metrics, speedup_text)


def test_every_metric_has_its_words_and_unit_or_none():
    assert header("reference_perplexity") == "Reference perplexity (ppl)"
    assert header("lastword_accuracy") == "Last-word accuracy (fraction)"
    assert header("scored_tokens") == "Scored tokens (tokens)"
    assert header("kl_divergence") == "KL divergence (nats)"
    assert header("latency_s") == "Latency (s)"
    assert header("recovery_pct") == "Accuracy recovery (%)"
    assert header("lastword_items") == "Last-word items (count)"
    assert header("some_new_score") == "Some new score"  # a key not in LABELS, in words, without a unit


def test_the_csv_columns_follow_the_label_table():
    assert ordered_metrics({"zeta", "latency_s", "output_throughput", "ttft_ms_p50"}) == [
        "output_throughput", "latency_s", "ttft_ms_p50", "zeta"]
    assert list(LABELS)[:2] == ["output_throughput", "total_token_throughput"]


def test_not_measured_is_a_dash_never_zero():
    assert fmt_fixed(None) == fmt_number(None) == speedup_text(None) == interval_text(None) == "—"
    assert fmt_fixed(0.0) == "0.00"


def test_number_formats():
    assert fmt_fixed(1.23456, 3) == "1.235"
    assert (fmt_number(0.0012345), fmt_number(97.0), fmt_number(123456.7)) == ("0.001234", "97", "123457")
    assert speedup_text(1.234) == "1.23x" and interval_text((1.1, 1.3)) == "1.10–1.30"
    assert inline_json({"b": 1, "a": None}) == '`{"a": null, "b": 1}`'


def test_a_bound_that_excludes_1_never_reads_1_00():
    """"1.03x (1.00–1.06), faster" beside "1.03x (1.00–1.06), no significant
    difference": the bounds 1.0016 and 0.9985 both read 1.00."""
    assert interval_text((1.0016, 1.06)) == "1.002–1.06" and interval_text((0.9984, 1.06)) == "0.998–1.06"
    assert interval_text((0.99, 0.99996)) == "0.99–0.99996"
    assert interval_text((1.0, 1.0)) == "1.00–1.00" and speedup_text(1.0) == "1.00x"   # the original over itself
    assert speedup_text(0.996) == "0.996x" and speedup_text(0.98) == "0.98x"


def test_a_recovery_below_the_floor_never_reads_as_the_floor(tmp_path):
    from evaluate.analysis.significance import on_its_side
    assert on_its_side(94.96, 95.0, 1) == "94.96" and on_its_side(94.94, 95.0, 1) == "94.9"
    assert on_its_side(95.0, 95.0, 1) == "95.0" and on_its_side(95.04, 95.0, 1) == "95.04"
