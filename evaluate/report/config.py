"""The report's typed config and its two extension points.

`ReportConfig` is conf/report.yaml converted once by the entry point; nothing
below it sees a DictConfig. `layout=[...]` and `output=[...]` name
`Layout`s and `OutputFormat`s: each name is conf/report/<group>/<name>.yaml,
or the same path under a `hydra.searchpath` folder, whose `_target_` names
the class (quantize.common.extensions). Adding one is one module and one
YAML; nothing here lists them."""
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import yaml

from evaluate.analysis import Analysis
from evaluate.analysis.busy_host import KEY as BUSY_HOST_KEY, BusyHost
from evaluate.analysis.choice import ACCURACY_FLOOR_PCT
from evaluate.analysis.cost import Prices
from quantize.common import extensions, tracking
from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR, check_writable_dir, folder_setting, resolve
from quantize.common.sanity_rules import SanityConfig
from quantize.common.settings import is_number, shown

GROUPS_DIR = "report"   # conf/report/<group>/<name>.yaml
T = TypeVar("T")


@dataclass
class Layout(extensions.Configurable):
    """One report written from the analysed store (`layout=<name>`).
    `render` returns its text files (name in out_dir -> text), computed
    before anything is written; `draw` writes the files it cannot return as
    text (plots) afterwards and returns their paths."""
    name: str = ""      # the name it was chosen by (its YAML's stem)

    def render(self, analysis: Analysis, report: "ReportConfig") -> dict[str, str]:
        raise NotImplementedError

    def draw(self, analysis: Analysis, report: "ReportConfig") -> list[Path]:
        return []


@dataclass
class OutputFormat(extensions.Configurable):
    """One format of the summary layout (`output=<name>`): report.md, the CSVs, the PNGs."""
    name: str = ""

    def render(self, analysis: Analysis, report: "ReportConfig") -> dict[str, str]:
        return {}

    def draw(self, analysis: Analysis, report: "ReportConfig") -> list[Path]:
        return []


@dataclass
class ReportConfig:
    """What to report, and how: conf/report.yaml with the command line over it."""
    results_dirs: list[Path]    # one store, or several side by side (results_dir=a,b)
    out_dir: Path
    title: str
    pareto_scenario: str | None
    layouts: list[Layout]
    outputs: list[OutputFormat]
    # the accuracy recovery (%) an artifact needs to be the answer ("What to use on this machine")
    accuracy_floor_pct: float = ACCURACY_FLOOR_PCT
    # the suspect rules' thresholds (conf/sanity/default.yaml, shared with quantize); None: that file's
    sanity: SanityConfig | None = None
    # where the files written are also logged (conf/tracking/); None: tracking=none
    tracker: tracking.Tracker | None = None
    # the busy-host rule (conf/report.yaml's busy_host_pct); None: that file's
    busy_host: BusyHost | None = None
    # USD per hour of the machines, for the cost per 1M output tokens (conf/report.yaml `cost:`); none: no cost
    cost: Prices = field(default_factory=Prices)
    # when the report was made, read once: report.md and report.html give the same time
    generated: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


def options(group: str, search_dirs: list[Path] = ()) -> dict[str, Path]:
    """The choices of conf/report/<group>/ and of the search path's same folder
    (name -> YAML), sorted; conf/ wins a name both have, as in Hydra."""
    found: dict[str, Path] = {}
    for root in [*search_dirs, CONF_DIR]:
        found |= {p.stem: p for p in (root / GROUPS_DIR / group).glob("*.yaml")}
    return dict(sorted(found.items()))


def build_choices(group: str, base: type[T], names: list[str], search_dirs: list[Path] = ()) -> list[T]:
    """The typed objects of the names chosen in a group, in order, once each;
    an unknown name is one line naming the choices."""
    known = options(group, search_dirs)
    names = list(dict.fromkeys(str(n) for n in names))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"unknown {group} {unknown[0]!r}; {group}= takes one or several of {', '.join(known)} "
                        f"(conf/{GROUPS_DIR}/{group}/), e.g. {group}=[{','.join(list(known)[:2])}]")
    return [build_one(known[n], base, f"conf/{GROUPS_DIR}/{group}/{n}.yaml") for n in names]


def build_one(path: Path, base: type[T], where: str) -> T:
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise UserError(f"{where} is not a mapping; write `{extensions.TARGET}: <module>.<Class>`")
    values.setdefault("name", path.stem)
    return extensions.build(values, base, where)


def search_dirs(entries) -> list[Path]:
    """The folders of Hydra's search path entries (`file://<dir>`; other schemes have no folder)."""
    return [Path(str(e).removeprefix("file://")) for e in entries or () if str(e).startswith("file://")]


def report_config(values: dict, searched: list[Path] = ()) -> ReportConfig:
    """conf/report.yaml's values (plain, resolved) as the typed ReportConfig;
    relative folders are taken from the working directory."""
    return ReportConfig(
        results_dirs=[resolve(folder_setting("results_dir", d)) for d in as_list(values["results_dir"])],
        out_dir=check_writable_dir(folder_setting("out_dir", values["out_dir"]), "out_dir=<a writable directory>"),
        title=str(values["title"]),
        pareto_scenario=None if values.get("pareto_scenario") is None else str(values["pareto_scenario"]),
        layouts=build_choices("layout", Layout, as_list(values.get("layout")), searched),
        outputs=build_choices("output", OutputFormat, as_list(values.get("output")), searched),
        accuracy_floor_pct=floor_pct(values.get("accuracy_floor_pct", ACCURACY_FLOOR_PCT)),
        sanity=SanityConfig.from_config(values.get("sanity")), tracker=tracking.from_group(values.get("tracking")),
        busy_host=BusyHost.from_config(values.get(BUSY_HOST_KEY)), cost=Prices.from_config(values.get("cost")))


def floor_pct(value) -> float:
    """accuracy_floor_pct as a number of percent; anything else is one line."""
    if not is_number(value) or not 0 <= value <= 200:
        raise UserError(f"accuracy_floor_pct={shown(value)} is not a recovery in %; pass a number such as "
                        f"accuracy_floor_pct=99 (default {ACCURACY_FLOOR_PCT:g})")
    return float(value)


def as_list(value) -> list[str]:
    """A list override (`[a,b]`), or one value."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
