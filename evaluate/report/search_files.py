"""The recipe searches and sensitivity files of the stores a report reads,
each with the name its figure gets in the report folder. Read through their
own modules (evaluate.search.study_file, quantize.common.sensitivity_file):
a store without them gets no section."""
import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from evaluate.analysis.pareto import SearchFront, search_front
from evaluate.search import study_file
from quantize.common import sensitivity_file
from quantize.common.sensitivity_file import Sensitivity

HEATMAP_MODULE = "quantize.common.sensitivity_plot"


@dataclass(frozen=True)
class StudyEntry:
    path: Path              # its study.json
    search: SearchFront
    figure: str             # the stem of its plot in out_dir (search-<study>.png)


@dataclass(frozen=True)
class SensitivityEntry:
    path: Path              # its sensitivity.json
    sensitivity: Sensitivity
    figure: str             # the stem of its heat map in out_dir (sensitivity-<model>-<scheme>.png)


def studies(results_dirs: list[Path], suspects: frozenset[str] = frozenset()) -> list[StudyEntry]:
    """Every study.json of the stores, in store order then by name; trials of
    `suspects` (artifact ids) are on no front."""
    paths = [p for d in results_dirs for p in study_file.find(d)]
    records = [study_file.read(p) for p in paths]
    names = unique_names([f"search-{slug(r.study)}" for r in records])
    return [StudyEntry(p, search_front(r, suspects), n) for p, r, n in zip(paths, records, names)]


def sensitivities(results_dirs: list[Path]) -> list[SensitivityEntry]:
    """Every sensitivity file of the stores, in store order then by model and scheme."""
    paths = [p for d in results_dirs for p in sensitivity_file.find(d)]
    files = [sensitivity_file.read(p) for p in paths]
    names = unique_names([f"sensitivity-{slug(s.model_name)}-{slug(s.scheme_key)}" for s in files])
    return [SensitivityEntry(p, s, n) for p, s, n in zip(paths, files, names)]


def slug(text: str) -> str:
    """A file-name part: letters, digits, `.`, `_` and `-` kept, anything else `_`."""
    return re.sub(r"[^\w.-]", "_", text) or "_"


def unique_names(names: list[str]) -> list[str]:
    """`name`, then `name-2`, `name-3`, ... where two stores hold the same study or model and scheme."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


def can_draw() -> bool:
    """Whether matplotlib is there, so the sections show their figures. No
    warning here: the report's other plots already warn once where it is missing."""
    return importlib.util.find_spec("matplotlib") is not None


def heatmap_drawer():
    """quantize.common.sensitivity_plot.draw_heatmap(sensitivity, path), or
    None where this checkout lacks it (the report then names why it has no heat map)."""
    try:
        return importlib.import_module(HEATMAP_MODULE).draw_heatmap
    except (ImportError, AttributeError):
        return None
