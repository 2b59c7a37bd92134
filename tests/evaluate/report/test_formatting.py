"""evaluate/report/formatting.py: units by metric name and number formats."""
from evaluate.report.formatting import fmt_fixed, fmt_number, header, inline_json, interval_text, speedup_text


def test_every_metric_has_its_unit_or_none():
    assert header("reference_perplexity") == "reference_perplexity (ppl)"
    assert header("lastword_accuracy") == "lastword_accuracy (fraction)"
    assert header("scored_tokens") == "scored_tokens (tokens)"
    assert header("kl_divergence") == "kl_divergence (nats)"
    assert header("latency_s") == "latency_s (s)"
    assert header("some_new_score") == "some_new_score"


def test_not_measured_is_a_dash_never_zero():
    assert fmt_fixed(None) == fmt_number(None) == speedup_text(None) == interval_text(None) == "—"
    assert fmt_fixed(0.0) == "0.00"


def test_number_formats():
    assert fmt_fixed(1.23456, 3) == "1.235"
    assert (fmt_number(0.0012345), fmt_number(97.0), fmt_number(123456.7)) == ("0.001234", "97", "123457")
    assert speedup_text(1.234) == "1.23x" and interval_text((1.1, 1.3)) == "1.10–1.30"
    assert inline_json({"b": 1, "a": None}) == '`{"a": null, "b": 1}`'
