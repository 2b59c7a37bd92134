"""Scenarios: {batch_size, input_len, output_len}, one YAML file each in
conf/scenario/, or anywhere (`scenario=/path/to/my.yaml` selects the `file`
option with that path). A *set* file lists others under `include` (or
`include: all`) and/or defines its own under `scenarios` (a list of
{name, batch_size, input_len, output_len}); a set file's includes are looked
up next to it first, then in conf/scenario/. Names are unique within a set.

The scenario group is an extension point like the others
(quantize.common.extensions): the entry point builds the choice once into a
typed `ScenarioChoice` (OneScenario, ScenarioSet, ScenarioFile, or any
subclass a YAML names with `_target_`), whose `resolve()` gives the list of
scenarios. A set computed by code (a grid, a ladder read from elsewhere) is
one module with a ScenarioChoice subclass and one YAML naming it.

Why `_target_` is optional here, unlike engines: scenario YAMLs are data
that users write, pass by path and include from other sets, and every one of
them predates `_target_`. So a YAML without it is read by what it holds (a
set when it has `include` or `scenarios`, else one scenario) and data-only
sets stay one YAML with nothing to name; conf/scenario/file.yaml names
ScenarioFile, the one option whose meaning is code (read the file at `path`).
"""
import secrets
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from quantize.common import extensions
from quantize.common.errors import UserError
from quantize.common.extensions import Configurable
from quantize.common.paths import CONF_DIR, resolve as resolve_path
from quantize.common.settings import is_integer, is_name, shown

SCENARIO_DIR = CONF_DIR / "scenario"
FILE_OPTION = "file"  # conf/scenario/file.yaml: the option `scenario=<path>` selects
TOKEN_ID_CEILING = 10000  # random prompt token ids are drawn below this, as `vllm bench` does


def random_prompts(key: list[int], n: int, input_len: int, vocab: int) -> list[list[int]]:
    """`n` prompts of exactly `input_len` random token ids, the same for the
    same `key` (the seed of numpy's generator, with what makes them fresh)."""
    import numpy as np
    rng = np.random.default_rng([int(k) for k in key])
    return rng.integers(0, min(vocab, TOKEN_ID_CEILING), size=(n, input_len)).tolist()


@dataclass(frozen=True)
class Scenario:
    """A speed scenario's name and shape. Accuracy and lm-eval rows name an
    eval set or task instead: the report gives them a Scenario without a shape."""
    name: str
    batch_size: int | None = None
    input_len: int | None = None
    output_len: int | None = None

    def as_row(self) -> dict:
        return {"scenario": self.name, **{k: v for k, v in asdict(self).items() if k != "name"}}

    @property
    def max_len(self) -> int:
        """Tokens a sequence needs (speed scenarios, which always have a shape)."""
        return self.input_len + self.output_len

    @property
    def kv_tokens(self) -> int:
        """Tokens the batch keeps in the KV cache at once: every sequence at full length."""
        return self.batch_size * self.max_len

    def heading(self) -> str:
        shape = [f"{k}={v}" for k, v in (("batch_size", self.batch_size), ("input_len", self.input_len),
                                          ("output_len", self.output_len)) if v is not None]
        return f"{self.name} ({', '.join(shape)})" if shape else self.name

    def tick(self) -> str:
        """Two short lines for a plot axis."""
        if self.batch_size is None:
            return self.name
        return f"{self.name}\nbs={self.batch_size} {self.input_len}→{self.output_len}"


@dataclass(frozen=True)
class PromptDraw:
    """What a scenario's random prompts are drawn from besides the seed and
    the run (or load level): the scenario itself, name and shape, since one
    engine serves every scenario of a job and vLLM's prefix cache (on by
    default) would serve a scenario's prompts from another's; and, for a
    server that outlives the job (`engine.remote`: engine=openai), a salt
    drawn per measurement, as that server may hold an earlier job's prompts."""
    salt: int | None = None

    @classmethod
    def for_engine(cls, engine) -> "PromptDraw":
        return cls(secrets.randbelow(2 ** 31) if getattr(engine, "remote", False) else None)

    def key(self, s: "Scenario") -> list[int]:
        shape = [v or 0 for v in (s.batch_size, s.input_len, s.output_len)]
        return [zlib.crc32(s.name.encode()), *shape, *([self.salt] if self.salt is not None else [])]

    def as_row(self) -> dict:
        """The row's `prompts`: how its token ids were drawn (with the salt, they can be drawn again)."""
        return {"per": "scenario"} | ({"salt": self.salt} if self.salt is not None else {})


class ScenarioChoice(Configurable):
    """Base of the scenario group's implementations: what `scenario=<name>`
    chose, typed, before any file it names is read."""

    def resolve(self) -> list[Scenario]:
        """The scenarios to measure, in order."""
        raise NotImplementedError

    def is_set(self) -> bool:
        """A set (several scenarios, rows that say `unsupported` instead of one
        error line) rather than one scenario."""
        return True


@dataclass
class OneScenario(ScenarioChoice):
    """A single scenario's YAML. The shape is checked by resolve(), in the
    words every scenario is checked in."""
    name: str | None = None
    batch_size: int | None = None
    input_len: int | None = None
    output_len: int | None = None

    def resolve(self, override: str | None = "scenario.") -> list[Scenario]:
        return [_from_dict({k: v for k, v in asdict(self).items() if v is not None}, override=override)]

    def is_set(self) -> bool:
        return False


@dataclass
class ScenarioSet(ScenarioChoice):
    """A set: others by name or path (`include`, or `include: all`) and its
    own (`scenarios`, a list of mappings)."""
    name: str | None = None
    include: list | str | None = None
    scenarios: list | None = None
    near: str | None = None  # the folder includes are looked up in first (a set given by path)

    def resolve(self) -> list[Scenario]:
        names = _all_single() if self.include == "all" else (self.include or [])
        if not isinstance(names, list):
            raise UserError(f"scenario {self.name}: include must be a list of scenarios or 'all', not "
                            f"{self.include!r}; pass a list in brackets, e.g. scenario.include=[{self.include}] "
                            "(under -m, a comma without brackets sweeps one job per name)")
        near = Path(self.near) if self.near else None
        return _unique(self.name, [load(n, near) for n in names] + _inline(asdict(self)))


@dataclass
class ScenarioFile(ScenarioChoice):
    """`scenario=<path>`: the file's own choice, with the command line's
    `+scenario.<key>=` over its keys; named by scenario.name= where given,
    else by its `name:`, else the file name."""
    path: str
    name: str | None = None
    overrides: dict = field(default_factory=dict)  # every other key the composed group holds

    @classmethod
    def from_config(cls, values: dict, where: str) -> "ScenarioFile":
        values = dict(values)
        path, name = values.pop("path", None), values.pop("name", None)
        if path is None:
            raise UserError("scenario=file needs a path: pass scenario=<path to a scenario YAML>")
        return cls(path=str(path), name=name, overrides=values)

    def chosen(self) -> ScenarioChoice:
        file = resolve_path(self.path)
        data = _read(file)
        data.setdefault("name", file.stem)
        if self.name not in (None, file.stem):  # scenario.name=, else the group's default (the stem)
            data["name"] = self.name             # on the command line, it wins over the file's own
        data.update(self.overrides)
        choice = choose(data, str(file))
        return replace(choice, near=str(file.parent)) if isinstance(choice, ScenarioSet) else choice

    def resolve(self) -> list[Scenario]:
        choice = self.chosen()
        if isinstance(choice, OneScenario):   # a key its file lacks is added on the command line with +
            return choice.resolve(override="+scenario.")
        return choice.resolve()

    def is_set(self) -> bool:
        return self.chosen().is_set()


def choose(values: dict, where: str = "scenario") -> ScenarioChoice:
    """The typed choice of a scenario YAML (a plain dict): the class its
    `_target_` names, else what its keys hold (see the module docstring)."""
    values = dict(values)
    if extensions.TARGET not in values:
        values[extensions.TARGET] = f"{__name__}.{(ScenarioSet if _is_set_data(values) else OneScenario).__name__}"
    return extensions.build(values, ScenarioChoice, where)


def resolve(choice: ScenarioChoice) -> list[Scenario]:
    """The chosen scenario, set or file -> a list of scenarios."""
    return choice.resolve()


def is_set(choice: ScenarioChoice) -> bool:
    """A scenario set (`include:` or `scenarios:`) rather than one scenario."""
    return choice.is_set()


def _is_set_data(data: dict) -> bool:
    return data.get("include") is not None or data.get("scenarios") is not None


def _inline(data: dict) -> list[Scenario]:
    """The set's own scenarios (`scenarios:`), so adding a rung edits one file."""
    inline = data.get("scenarios") or []
    if not isinstance(inline, list) or not all(isinstance(d, dict) for d in inline):
        raise UserError(f"scenario {data.get('name')}: scenarios must be a list of mappings of name, "
                        f"batch_size, input_len and output_len, not {inline!r}")
    return [_from_dict(d, f"scenario {shown(d.get('name'))} of set {data.get('name')}") for d in inline]


def _unique(set_name, found: list[Scenario]) -> list[Scenario]:
    """Rows and logs name a scenario: within one set a name must mean one shape."""
    names = [s.name for s in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"scenario set {set_name}: scenario name(s) {', '.join(twice)} appear more than once; "
                        "give every scenario of a set its own name")
    return found


def load(name: str, near: Path | None = None) -> Scenario:
    """One scenario: a name (a file in folder `near`, then in conf/scenario/)
    or a path to a YAML file."""
    path = _find(str(name), near)
    data = _read(path)
    if _is_set_data(data):
        raise UserError(f"{path} is a scenario set, and a set includes single scenarios; include the "
                        "scenarios it lists instead, or run it on its own (scenario=<its path>)")
    return _from_dict(data, str(path))


def _all_single() -> list[str]:
    return [p.stem for p in sorted(SCENARIO_DIR.glob("*.yaml"))
            if p.stem != FILE_OPTION and _is_single(_read(p))]


def _is_single(data: dict) -> bool:
    """One scenario's YAML: no set keys, and no `_target_` but OneScenario's."""
    return not _is_set_data(data) and data.get(extensions.TARGET, _SINGLE) == _SINGLE


def _known() -> str:
    return ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml") if p.stem != FILE_OPTION))


def _find(name: str, near: Path | None) -> Path:
    """A path (relative to `near` when given, else to the cwd), or a name:
    `near/<name>.yaml`, then conf/scenario/<name>.yaml."""
    if "/" in name or name.startswith("~") or name.endswith((".yaml", ".yml")):
        return near / name if near is not None and not Path(name).expanduser().is_absolute() \
            else resolve_path(name)
    for folder in ([near] if near is not None else []) + [SCENARIO_DIR]:
        if (folder / f"{name}.yaml").is_file() and (folder != SCENARIO_DIR or name != FILE_OPTION):
            return folder / f"{name}.yaml"
    where = f" (looked in {near} and {SCENARIO_DIR})" if near is not None else ""
    raise UserError(f"unknown scenario {name!r}{where}; known: {_known()}, or a path to a scenario YAML")


def _read(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"scenario file {path} does not exist; pass scenario=<path to a scenario YAML> "
                        f"or scenario=<name> ({_known()})")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError(f"cannot read scenario file {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"scenario file {path} is not a mapping of name, batch_size, input_len and "
                        "output_len (or name and include/scenarios)")
    return data


SHAPE_KEYS = ("batch_size", "input_len", "output_len")
_SINGLE = f"{__name__}.{OneScenario.__name__}"  # the `_target_` a single scenario's YAML may name


def _or_typed(override: str | None, key: str, value: str) -> str:
    """`, or <override><key>=<value>` where the command line can set the key
    (`override`: the prefix that reaches it); a set's member or an included
    file's scenario only its file sets."""
    return f", or {override}{key}={value}" if override else ""


def _from_dict(d: dict, where: str = "scenario", override: str | None = None) -> Scenario:
    """One scenario's mapping (a file, an include, a set's own entry), checked
    as a file chosen alone is: a key OneScenario does not take (a typo, a
    setting of another tool) is refused in its words, not dropped."""
    known = {"name", *SHAPE_KEYS}
    if d.get(extensions.TARGET) == _SINGLE:
        d = {k: v for k, v in d.items() if k != extensions.TARGET}
    if set(d) - known:
        OneScenario.from_config(d, where)  # raises, naming the first unknown key
    if not is_name(d.get("name")):
        by_name = override if override == "scenario." else None   # a file's name: is its own (or its stem)
        raise UserError(f"scenario {d} has no name; give it one "
                        f"(`name:` in its file{_or_typed(by_name, 'name', '<text>')})")
    missing = [key for key in SHAPE_KEYS if d.get(key) is None]
    if missing:
        raise UserError(f"scenario {d['name']} has no {' or '.join(missing)}; give {'it' if len(missing) == 1 else 'each'} an integer "
                        f"(`{missing[0]}:` in its file{_or_typed(override, missing[0], '<integer>')})")
    # int() would read 2.5 as 2 and true as 1: a file's typo would time another shape
    for key in SHAPE_KEYS:
        if not (is_integer(d[key]) and d[key] >= 1):
            raise UserError(f"scenario {d['name']}: {key}={shown(d[key])} is not an integer >= 1; "
                            f"pass one (`{key}: 8` in its file{_or_typed(override, key, '8')})")
    return Scenario(name=d["name"], **{key: d[key] for key in SHAPE_KEYS})
