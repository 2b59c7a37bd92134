"""Scenarios: {batch_size, input_len, output_len}, one YAML file each in
conf/scenario/, or anywhere (`scenario=/path/to/my.yaml` selects the `file`
option with that path). A *set* file lists others under `include` (or
`include: all`) and/or defines its own under `scenarios` (a list of
{name, batch_size, input_len, output_len}); a set file's includes are looked
up next to it first, then in conf/scenario/. Names are unique within a set."""
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR, resolve as resolve_path

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


def resolve(cfg) -> list[Scenario]:
    """The scenario config (a single scenario, a set, or a file given by
    path) -> a list of scenarios."""
    data, near = _config(cfg)
    if not _is_set_data(data):
        return [_from_dict(data)]
    include = data.get("include") or []
    names = _all_single() if include == "all" else include
    if not isinstance(names, list):
        raise UserError(f"scenario {data.get('name')}: include must be a list of scenarios or 'all', "
                        f"not {include!r}")
    return _unique(data.get("name"), [load(n, near) for n in names] + _inline(data))


def _is_set_data(data: dict) -> bool:
    return data.get("include") is not None or data.get("scenarios") is not None


def _inline(data: dict) -> list[Scenario]:
    """The set's own scenarios (`scenarios:`), so adding a rung edits one file."""
    inline = data.get("scenarios") or []
    if not isinstance(inline, list) or not all(isinstance(d, dict) for d in inline):
        raise UserError(f"scenario {data.get('name')}: scenarios must be a list of mappings of name, "
                        f"batch_size, input_len and output_len, not {inline!r}")
    return [_from_dict(d) for d in inline]


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
    return _from_dict(_load(name, near))


def is_set(cfg) -> bool:
    """A scenario set (`include:` or `scenarios:`) rather than one scenario."""
    return _is_set_data(_config(cfg)[0])


def _config(cfg) -> tuple[dict, Path | None]:
    """The scenario config as a plain dict, and the folder a set's includes
    are looked up in first. For the `file` option, the file's keys, with any
    `+scenario.<key>=` of the command line over them, and the file's folder;
    its name is the file's `name:`, else the file name without .yaml."""
    keys = list(cfg.keys())
    if "path" not in keys:
        return {k: _plain(cfg[k]) for k in keys}, None
    if OmegaConf.is_config(cfg) and OmegaConf.is_missing(cfg, "path"):
        raise UserError("scenario=file needs a path: pass scenario=<path to a scenario YAML>")
    path = cfg["path"]
    file = resolve_path(str(path))
    data = _read(file)
    data.setdefault("name", file.stem)
    data.update({k: _plain(cfg[k]) for k in keys if k not in ("name", "path")})
    return data, file.parent


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _all_single() -> list[str]:
    return [p.stem for p in sorted(SCENARIO_DIR.glob("*.yaml"))
            if p.stem != FILE_OPTION and not _is_set_data(_read(p))]


def _known() -> str:
    return ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml") if p.stem != FILE_OPTION))


def _load(name: str, near: Path | None = None) -> dict:
    return _read(_find(str(name), near))


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
