"""Settings read as what they are: a flag is true or false, a seed an
integer. Python's bool("no") is True, so `force=no` rebuilt an artifact and
`skip_completed=no` skipped; each now gets one line naming the fix. Also the
one test of what a number setting is (is_integer, is_number), which the
checks with messages of their own (limits, run counts, prices) share."""
import math

from quantize.common.errors import UserError


def is_integer(value) -> bool:
    """An int as YAML and Hydra give it: true and false are bools, not 1 and 0."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a finite float, not a bool (`inf` and `nan` are no setting's value)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_name(value) -> bool:
    """A label rows carry (an engine's, a scenario's, a profile's): non-blank text."""
    return isinstance(value, str) and bool(value.strip())


def shown(value) -> str:
    """A setting's value as the command line spells it: Hydra's null, true and false."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def flag(key: str, value) -> bool:
    """`key=true|false` (Hydra reads those as booleans; 1 and 0 are taken too)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise UserError(f"{key}={shown(value)}: pass {key}=true or {key}=false")


def integer(key: str, value, example: int = 0, minimum: int | None = None) -> int:
    """`key=<an integer>` (>= `minimum` when given); `example`: one the setting
    takes, for the error line."""
    if is_integer(value) and (minimum is None or value >= minimum):
        return value
    wanted = "an integer" if minimum is None else f"an integer >= {minimum}"
    raise UserError(f"{key}={shown(value)}: pass {wanted}, e.g. {key}={example}")


def names(key: str, value, where: str = "", example: str = "<name>,<name>", one: str | None = None) -> list[str]:
    """`key=[a,b]`, a list of names (null: none). One name alone is refused,
    not read as its letters (list("emma") is e, m, m, a), unless the setting
    takes one too (`one`: such a name, for the error line); any other value
    (5, true, a list of lists) is refused, not a TypeError deep in a run;
    `where`: the group the error line names first, when `key` is the group's
    own; `example`: names the setting takes, for the error line."""
    lead = f"{where}: " if where else ""
    if isinstance(value, str):
        if one is not None:
            return [value]
        raise UserError(f"{lead}{key}={value} is one name, not a list; pass {key}=[{value}]")
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, int, float)) for v in value):
        either = f"a name or a list of names; pass one, e.g. {key}={one}, or" if one else "a list of names; pass"
        raise UserError(f"{lead}{key}={shown(value)} is not {either} a list, e.g. {key}=[{example}]")
    return [str(v) for v in value]
