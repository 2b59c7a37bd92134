"""Suspect artifacts: those whose accuracy says they are no longer their base
model. An artifact is suspect when quantize's sanity check says so (its
recorded numbers judged again with the report's floors), when its measured
top-1 agreement (the accuracy rows) is below its format family's floor, or
when its accuracy recovery exceeds 100 % by more than the measurement's
interval. The rules and thresholds are quantize.common.sanity_rules'
(conf/sanity/default.yaml), shared with quantize. Suspect
artifacts' rows enter no group (`analysis.analyse` leaves them out), so they
are never ranked, on a Pareto front or recommended; the report names them
in a section of their own."""
import json
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

from evaluate.analysis import accuracy_bounds
from evaluate.analysis.groups import BASELINE, Group, aggregate
from evaluate.results import Row
from quantize.common import sanity_rules
from quantize.common.manifest import FILE as MANIFEST_FILE
from quantize.common.settings import is_number


@dataclass
class Suspect:
    """One artifact kept out of every ranking, and why."""
    artifact_id: str
    model_name: str
    recipe: str
    family: str
    reasons: list[str] = field(default_factory=list)
    # measured by evaluate (mean of its runs), if any: of the accuracy group
    # behind the first reason, so the figures shown are those the reason judged
    top1_agreement: float | None = None
    recovery_pct: float | None = None


def find(rows: list[Row], config: sanity_rules.SanityConfig) -> list[Suspect]:
    """The suspect artifacts among the rows, in order of first appearance; the
    original (the reference everything is measured against) never is."""
    accuracy = aggregate(rows, "accuracy")
    out = []
    for artifact_id, first in first_rows(rows).items():
        suspect = judge(first, [r for r in rows if r.artifact_id == artifact_id],
                        [a for a in accuracy if a.artifact_id == artifact_id], config)
        if suspect.reasons:
            out.append(suspect)
    return out


def first_rows(rows: list[Row]) -> dict[str, Row]:
    """Each quantized artifact's first row (the original and id-less rows left out)."""
    firsts: dict[str, Row] = {}
    for row in rows:
        if row.artifact_id and row.recipe != BASELINE:
            firsts.setdefault(row.artifact_id, row)
    return firsts


def judge(first: Row, rows: list[Row], accuracy: list[Group], config: sanity_rules.SanityConfig) -> Suspect:
    """The artifact's reasons to be suspect (none: it is not)."""
    recorded = next((r.manifest for r in rows if r.manifest), None) or {}
    name = sanity_rules.family(recorded.get("quantization"), holds_2_4(recorded))
    suspect = Suspect(first.artifact_id, first.model_name or "?", first.recipe or "?", name)
    marked = manifest_mark(rows, config)
    if marked:
        suspect.reasons.append(f"quantize's sanity check: {marked}")
    shown = None   # the first group that gave a reason; with none (a manifest mark alone), the first group
    for group in accuracy:
        for reason in accuracy_reasons(group, name, config):
            if reason not in suspect.reasons:
                suspect.reasons.append(reason)
                shown = shown or group
    shown = shown or (accuracy[0] if accuracy else None)
    if shown:
        suspect.top1_agreement, suspect.recovery_pct = shown.mean("top1_agreement"), shown.mean("recovery_pct")
    return suspect


def accuracy_reasons(group: Group, family: str, config: sanity_rules.SanityConfig) -> list[str]:
    """Why one accuracy group (engine, eval set) says the artifact is broken, each naming the group."""
    interval = recovery_interval(group)
    half = None if interval is None else (interval[1] - interval[0]) / 2
    found = (sanity_rules.top1_reason(group.mean("top1_agreement"), family, config),
             sanity_rules.recovery_reason(group.mean("recovery_pct"), half, config))
    return [f"{reason} ({group.engine}, {group.scenario.name})" for reason in found if reason]


def recovery_interval(group: Group) -> tuple[float, float] | None:
    """The recovery's 95 % interval the accuracy section shows: over the
    windows where the rows kept them, else over the rows (older rows)."""
    samples = accuracy_bounds.samples_of(group)
    found = accuracy_bounds.bounds(samples).get("recovery_pct") if samples else None
    return found or group.interval("recovery_pct")


def manifest_mark(rows: list[Row], config: sanity_rules.SanityConfig) -> str | None:
    """Quantize's sanity verdict with the report's floors: its recorded
    checks.sanity numbers judged again by quantize's own rule, so
    `sanity.floors.w4=0.5` clears (or a higher floor adds) a mark set at build
    time. The numbers as the rows repeat them, else as the artifact folder's
    manifest.json holds them; a mark recorded without numbers (older rows, the
    folder not on this machine) stands as written."""
    marks = []
    for fields in chain((r.manifest for r in rows if r.manifest), folder_manifests(rows)):
        numbers = sanity_numbers(fields)
        if numbers is not None:
            suspect = sanity_rules.judge(dict(numbers), fields.get("quantization"), holds_2_4(fields), config)
            return suspect["reason"] if suspect else None
        marks.append(fields.get("suspect"))
    mark = next((m for m in marks if m), None)
    return str(mark.get("reason") if isinstance(mark, dict) else mark) if mark else None


def folder_manifests(rows: list[Row]):
    """The artifact folders' manifest.json (each read only when reached), only
    where the folder still holds the rows' artifact: one rebuilt since (force,
    a sweep into the same folder) holds another artifact's numbers."""
    ids = {r.artifact_id for r in rows if r.artifact_id}
    for path in dict.fromkeys(Path(r.artifact_path) / MANIFEST_FILE for r in rows if r.artifact_path):
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a store read on another machine: the artifact is not here
        if isinstance(found, dict) and found.get("artifact_id") in ids:
            yield found


def sanity_numbers(fields: dict) -> dict | None:
    """checks.sanity as measured (rows repeat it as `sanity`); None when not recorded or skipped."""
    numbers = fields.get("sanity") or (fields.get("checks") or {}).get("sanity")
    if isinstance(numbers, dict) and "skipped" not in numbers and is_number(numbers.get("top1_agreement")):
        return numbers
    return None


def holds_2_4(fields: dict) -> bool:
    """The 2:4 pattern as the rows repeat it (`sparsity`), else as the manifest's checks hold it."""
    sparsity = fields.get("sparsity") or (fields.get("checks") or {}).get("sparsity") or {}
    return bool(sparsity.get("all_layers_hold_pattern"))
