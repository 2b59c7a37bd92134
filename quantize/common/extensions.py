"""The one way to extend quantbench: a Hydra config group whose YAML names
its implementation with `_target_`, as Hydra's own instantiate does.

    # conf/load/sweep.yaml
    _target_: evaluate.serving.profiles.Sweep   # a subclass of the group's base class
    name: sweep
    saturation_concurrency: 16

Engines (conf/engine/), load profiles (conf/load/), report layouts and output
formats (conf/report/...) all work this way: adding one is one module (the
class, anywhere importable) and one YAML (in conf/<group>/ or on Hydra's
search path), with no list to edit.

The entry point calls `build(cfg.<group>, Base)` once. It imports the class,
checks that it subclasses the group's base, and returns
`cls.from_config(values)`: the typed object everything below the entry point
receives instead of the DictConfig. For a dataclass base (`Configurable`) that
is an instance whose fields are the YAML's keys, an unknown key a one-line
error naming the fields.

Why `_target_` resolved by hand rather than `hydra.utils.instantiate`: some
classes are not built from their config alone (an engine is started per
artifact), so the group's base decides what `from_config` returns; the key
and its meaning stay Hydra's.
"""
import dataclasses
import importlib
import re
import types
import typing
from typing import Any, Mapping, TypeVar

from quantize.common.errors import UserError, nearest
from quantize.common.settings import is_integer, is_name, is_number, names, shown

TARGET = "_target_"
T = TypeVar("T")


def plain(node) -> dict:
    """A config node (DictConfig, dict or None) as a plain, resolved dict."""
    if node is None:
        return {}
    if isinstance(node, Mapping) and not hasattr(node, "_metadata"):
        return dict(node)
    from omegaconf import OmegaConf
    return OmegaConf.to_container(node, resolve=True) or {}


def implementation(target: Any, base: type, where: str) -> type:
    """The class `_target_` names (module.Class), checked to subclass `base`;
    each problem is one line that says what to fix in `where`."""
    if not target or "." not in str(target):
        raise UserError(f"{where} names no implementation; add `{TARGET}: <module>.<Class>` "
                        f"(a subclass of {base.__module__}.{base.__qualname__})")
    module_name, _, cls_name = str(target).rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if not (e.name and (module_name == e.name or module_name.startswith(e.name + "."))):
            raise  # the module exists and lacks a dependency: its own error says which
        raise UserError(f"cannot import module {module_name!r} ({TARGET}: {target} in {where}); "
                        "fix it or put its folder on PYTHONPATH") from None
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        what = (f"is not a subclass of {base.__module__}.{base.__qualname__}" if cls is not None
                else "does not exist")
        raise UserError(f"{target} {what}; fix {TARGET} in {where}")
    return cls


def build(node, base: type[T], where: str) -> T:
    """The typed object of one config group choice: `_target_`'s class,
    built from the other keys by its `from_config`."""
    values = plain(node)
    cls = implementation(values.pop(TARGET, None), base, where)
    return cls.from_config(values, where)


class Configurable:
    """Base of the extension points whose implementation is its own typed
    config: a dataclass whose fields are the YAML's keys."""

    @classmethod
    def from_config(cls, values: dict, where: str):
        names = [f.name for f in dataclasses.fields(cls)]
        for key in sorted(set(values) - set(names)):
            close = nearest(key, names)
            hint = f"did you mean {close}?" if close else f"it takes {', '.join(names)}"
            raise UserError(f"{where}: {key!r} is not a setting of {cls.__qualname__}; {hint}")
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in values
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise UserError(f"{where}: {cls.__qualname__} needs {', '.join(missing)}; add it to the YAML")
        return cls(**check_scalar_fields(cls, values, where))


def check_scalar_fields(cls: type, values: dict, where: str) -> dict:
    """`values`, once each whose dataclass field in `cls` is typed int, float,
    bool or str (optionally | None) is of that type, and a `name` is not
    empty: one line naming it, not a TypeError, or bool("no") read as true,
    deep in a run. A true-or-false field given 1 or 0 gets True or False, as
    `settings.flag` reads the top-level switches."""
    hints = typing.get_type_hints(cls)
    checked = dict(values)
    group = re.fullmatch(r"[A-Za-z_][\w.]*", where)   # a group (not a file): its keys as overrides are typed
    for key, value in values.items():
        wanted = _scalar_kind(hints.get(key), value)
        if wanted:
            raise UserError(f"{where}: {key}={shown(value)} is not {wanted}; pass {wanted} for {key}")
        if _is_list(hints.get(key)) and value is not None and (
                not isinstance(value, (list, tuple)) or typing.get_args(hints[key])[:1] == (str,)):
            # refuses what is no list of names: list("gsm8k") is 5 tasks, list(5) a TypeError
            names(f"{where}.{key}", value) if group else names(key, value, where)
        if key == "name" and isinstance(value, str) and not is_name(value):
            raise UserError(f"{where}: name is empty; pass a name, the rows' label, e.g. "
                            f"{where + '.' if group else ''}name=mine")
        if _is_flag_field(hints.get(key)) and is_integer(value):  # 0 or 1: checked above
            checked[key] = bool(value)
    return checked


# What a field annotated with only these types (and None) takes, for the error line.
_SCALARS = {int: "an integer", float: "a number", bool: "true or false", str: "text"}


def _kinds(annotation) -> set:
    """The scalar types a field annotation takes, None left out."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return (set(typing.get_args(annotation)) if union else {annotation}) - {type(None)}


def _is_list(annotation) -> bool:
    return typing.get_origin(annotation) in (list, tuple)


def _is_flag_field(annotation) -> bool:
    return _kinds(annotation) == {bool}


def _scalar_kind(annotation, value) -> str | None:
    """What `value` should have been for a field of type `annotation` (int,
    float, bool, str, optionally | None), or None when it fits or the type is not
    one of those: bool("no") is True and int("abc") fails deep in a run."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    optional = union and type(None) in typing.get_args(annotation)
    kinds = _kinds(annotation)  # list[str] is a list
    if not kinds or not kinds <= set(_SCALARS) or (value is None and optional):
        return None
    if bool in kinds and (isinstance(value, bool) or (kinds == {bool} and is_integer(value) and value in (0, 1))):
        return None
    if (int in kinds and is_integer(value)) or (float in kinds and is_number(value)) or (
            str in kinds and isinstance(value, str)):
        return None
    return " or ".join(_SCALARS[k] for k in (int, float, bool, str) if k in kinds)
