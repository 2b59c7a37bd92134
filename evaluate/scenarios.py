"""Scenarios: {batch_size, input_len, output_len}, one YAML file each in
conf/scenario/. A *set* file lists others under `include` (or `include: all`)."""
from dataclasses import asdict, dataclass

import yaml

from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR

SCENARIO_DIR = CONF_DIR / "scenario"


@dataclass(frozen=True)
class Scenario:
    name: str
    batch_size: int
    input_len: int
    output_len: int

    def as_row(self) -> dict:
        return {"scenario": self.name, **{k: v for k, v in asdict(self).items() if k != "name"}}

    @property
    def max_len(self) -> int:
        return self.input_len + self.output_len


def resolve(cfg) -> list[Scenario]:
    """The scenario config (a single scenario or a set) -> a list of scenarios."""
    if is_set(cfg):
        names = _all_single() if cfg.include == "all" else list(cfg.include)
        return [load(n) for n in names]
    return [_from_dict(dict(cfg))]


def load(name: str) -> Scenario:
    """One scenario file by name."""
    return _from_dict(_load(name))


def is_set(cfg) -> bool:
    """A scenario set (`include:`) rather than one scenario."""
    return "include" in cfg and cfg.include is not None


def _all_single() -> list[str]:
    return [p.stem for p in sorted(SCENARIO_DIR.glob("*.yaml")) if "include" not in _load(p.stem)]


def _load(name: str) -> dict:
    path = SCENARIO_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
        raise UserError(f"unknown scenario {name!r}; known: {', '.join(known)}")
    return yaml.safe_load(path.read_text()) or {}


def _from_dict(d: dict) -> Scenario:
    try:
        s = Scenario(name=str(d["name"]), batch_size=int(d["batch_size"]),
                     input_len=int(d["input_len"]), output_len=int(d["output_len"]))
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"scenario {d.get('name', d)} needs integer batch_size, input_len and "
                        f"output_len ({type(e).__name__}: {e})") from None
    if min(s.batch_size, s.input_len, s.output_len) < 1:
        raise UserError(f"scenario {s.name}: batch_size, input_len and output_len must be >= 1")
    return s
