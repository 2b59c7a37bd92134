"""The report judges quantize's recorded sanity numbers with its own floors
(evaluate/analysis/suspect.py, the rule quantize/common/sanity_rules.judge):
`python -m evaluate.report sanity.floors.w4=0.5` clears a mark quantize set
with the default 0.55, and a higher floor marks what quantize kept; a mark
recorded without its numbers stands."""
import json

from evaluate.report.__main__ import main
from evaluate.report.markdown import SUSPECT_TITLE
from quantize.common import sanity_rules
from quantize.common.manifest import Manifest

from .rows import ARTIFACTS, MODEL, main_rows, store
from .test_suspect import W4, sections

BUILD_FLOORS = sanity_rules.SanityConfig.from_config(None)   # conf/sanity/default.yaml: w4 0.55


def quantized_fields(top1: float) -> tuple[dict, dict]:
    """The w4a16_gptq artifact's manifest.json as quantize writes it after a
    sanity check that measured `top1`, and the fields its rows repeat."""
    numbers = {"top1_agreement": top1, "kl_divergence": 0.4, "windows": 4, "window_len": 64, "scored_tokens": 252}
    mark = sanity_rules.judge(numbers, W4, False, BUILD_FLOORS)   # as quantize's pipeline._judged does
    artifact_id = ARTIFACTS["w4a16_gptq"][0]
    full = {"schema": 1, "artifact_id": artifact_id, "model": {"name": MODEL, "path": "/m"},
            "recipe": {"name": "w4a16_gptq"}, "quantization": W4, "checks": {"sanity": numbers},
            **({"suspect": mark} if mark else {})}
    return full, Manifest.from_dict(full).row_fields()


def report(tmp_path, rows, *overrides: str) -> dict[str, str]:
    store(tmp_path / "res", rows)
    assert main([f"results_dir={tmp_path / 'res'}", f"out_dir={tmp_path / 'out'}", "output=[markdown]",
                 *overrides]) == 0
    return sections((tmp_path / "out" / "report.md").read_text())


def with_fields(fields: dict | None, folder=None) -> list:
    changes = {} if fields is None else {"manifest": fields}
    if folder:
        changes["artifact_path"] = str(folder)
    return [r.but(**changes) if r.recipe == "w4a16_gptq" else r for r in main_rows()]


def test_a_lower_floor_in_the_report_clears_quantizes_mark(tmp_path):
    full, fields = quantized_fields(0.54)
    assert full["suspect"]["floor"] == 0.55 and fields["sanity"]["top1_agreement"] == 0.54   # rows carry the numbers
    rows = with_fields(fields)
    default = report(tmp_path / "default", rows)
    assert "quantize's sanity check: top-1 agreement with the base 0.540 < 0.55, the floor of w4" \
        in default[SUSPECT_TITLE]
    lowered = report(tmp_path / "lowered", rows, "sanity.floors.w4=0.5")
    assert SUSPECT_TITLE not in lowered and "w4a16_gptq" in lowered["Ranking"]


def test_a_higher_floor_in_the_report_marks_what_quantize_kept(tmp_path):
    full, fields = quantized_fields(0.60)
    assert "suspect" not in full
    raised = report(tmp_path, with_fields(fields), "sanity.floors.w4=0.7")
    assert "quantize's sanity check: top-1 agreement with the base 0.600 < 0.70, the floor of w4" \
        in raised[SUSPECT_TITLE]
    assert "w4a16_gptq" not in raised["Ranking"]


def test_older_rows_take_the_numbers_from_the_artifact_folder(tmp_path):
    """Rows written before they repeated the numbers carry only the mark: the
    folder's manifest.json has them, and the report's floor decides."""
    full, fields = quantized_fields(0.54)
    folder = tmp_path / "w4a16_gptq"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(full))
    older = {k: v for k, v in fields.items() if k != "sanity"}
    lowered = report(tmp_path / "lowered", with_fields(older, folder), "sanity.floors.w4=0.5")
    assert SUSPECT_TITLE not in lowered and "w4a16_gptq" in lowered["Ranking"]
    # the folder not on this machine: the recorded mark stands as written
    gone = report(tmp_path / "gone", with_fields(older, tmp_path / "elsewhere"), "sanity.floors.w4=0.5")
    assert "quantize's sanity check: top-1 agreement with the base 0.540 < 0.55" in gone[SUSPECT_TITLE]


def test_a_skipped_sanity_check_marks_nothing(tmp_path):
    _, fields = quantized_fields(0.9)
    skipped = fields | {"sanity": {"skipped": "RuntimeError: no forward"}}
    md = report(tmp_path, with_fields(skipped))
    assert SUSPECT_TITLE not in md and "w4a16_gptq" in md["Ranking"]


def rebuilt_folder(tmp_path, top1: float):
    """The artifact folder rebuilt since the rows were written (force=true, a
    sweep into one folder): it now holds another artifact measuring `top1`."""
    full, _ = quantized_fields(top1)
    folder = tmp_path / "w4a16_gptq"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(full | {"artifact_id": "f" * 16}))
    return folder


def test_a_folder_rebuilt_since_does_not_clear_the_rows_mark(tmp_path):
    _, fields = quantized_fields(0.40)
    older = {k: v for k, v in fields.items() if k != "sanity"}
    md = report(tmp_path, with_fields(older, rebuilt_folder(tmp_path, 0.90)))
    assert "quantize's sanity check: top-1 agreement with the base 0.400 < 0.55" in md[SUSPECT_TITLE]
    assert "w4a16_gptq" not in md["Ranking"]


def test_a_folder_rebuilt_since_does_not_mark_the_rows_artifact(tmp_path):
    _, fields = quantized_fields(0.90)
    older = {k: v for k, v in fields.items() if k != "sanity"}
    md = report(tmp_path, with_fields(older, rebuilt_folder(tmp_path, 0.40)))
    assert SUSPECT_TITLE not in md and "w4a16_gptq" in md["Ranking"]
