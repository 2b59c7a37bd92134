"""A URL's password kept out of what is shown or written: logs, manifests,
commands, study.json. A database backend (MLflow's tracking.uri, the search's
storage) can only take its password in the URL, so the URL itself is what
must be redacted, everywhere but where it is connected to. A password typed
on the command line is also kept out of every log line of the process
(keep_out_of_logs): Hydra's own lines print the overrides as typed."""
import functools
import logging
import re

from quantize.common.errors import UserError

# scheme://<user>:<password>@<host>...: the password runs to the `@` before a
# host (no `@` or `/` in it): one with a space, a `/` or an `@` is hidden whole.
# A host's port is no password: `https://h:5000/runs@x` has none, its `@` is the path's.
# Without a scheme, `user:password@host` (but not a path: `sqlite:////a@b`).
# Also as a sweep's job gets it from Hydra, quoted or escaped (`postgresql\://u\:pw@h`).
_PASSWORD = re.compile(r"^(\s*['\"]?(?:[A-Za-z][\w+.\-]*\\?://)?[^:/?#@\s]*:(?!//)(?!\d*(?:[/?#]|$)))(.*?)"
                       r"(@[^@/?#]*(?:[/?#].*)?)$", re.S)
# a password in the query string (`postgresql://h/db?user=u&password=p`): to the next `&` or `#`,
# a quote or a space in it too (redact and _url_passwords take a quoted value's quotes off first)
_QUERY_PASSWORD = re.compile(r"([?&](?:password|passwd)=)([^&#]*)", re.I)
# a value as typed in quotes: the leading space and quote, the value, the closing quote and space
_QUOTED = re.compile(r"(\s*(['\"]?))(.*?)(\2\s*)", re.S)
# a value that may be a URL with credentials (redact_values): a scheme and an `@` or a password=
_URL_WITH_CREDENTIALS = re.compile(r"\s*['\"]?[A-Za-z][\w+.\-]*\\?://.*(?:@|[?&](?:password|passwd)=).*", re.S | re.I)


def redact(url) -> str:
    """The URL as logs and files show it: the password as ***. Anything else
    is kept as given (a sqlite path or a git ref with an `@`): a rerun of a
    command that holds it must find the same path."""
    url = str(url)   # Hydra reads storage=5 as a number
    start, _, value, end = _QUOTED.fullmatch(url).groups()
    return start + _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***\3", value, count=1)) + end


def redact_values(values):
    """`values` (nested dicts and lists) with each URL that holds
    credentials redacted; other values as they are."""
    if isinstance(values, dict):
        return {k: redact_values(v) for k, v in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(redact_values(v) for v in values)
    if isinstance(values, str) and _URL_WITH_CREDENTIALS.fullmatch(values):
        return redact(values)
    return values


def redact_override(arg: str) -> str:
    """A Hydra override (`key=value`) with each URL's password in its value as
    ***: in a sweep's choices, a list or a dict too; the rest as typed (a
    command that holds it reruns the same)."""
    key, sep, value = arg.partition("=")
    return f"{key}{sep}{hide_passwords(value, passwords_in(arg))}" if sep else arg


def passwords_in(arg: str) -> tuple[str, ...]:
    """The passwords of the URLs in an override's value, as Hydra's parser
    reads it (`a,b`, `[a]`, `{k: a}`, quoted or escaped); an argument it does
    not parse (`-m`, a value with a `=` in it) is taken as one URL."""
    from hydra.errors import HydraException
    try:
        values = _strings(_parser().parse_override(arg).value())
    except HydraException:
        values = [arg.partition("=")[2]]
    return tuple(password for value in values for password in _url_passwords(value))


def _strings(value):
    """The strings in a parsed override value, the choices of a sweep too."""
    from hydra.core.override_parser.types import ChoiceSweep, QuotedString
    if isinstance(value, ChoiceSweep):
        value = value.list
    if isinstance(value, QuotedString):
        return [value.text]
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in _strings(item)]
    return []   # a number, a range, a glob


@functools.cache
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser
    return OverridesParser.create()


def _url_passwords(url: str) -> list[str]:
    """The password(s) of `url`, as redact finds them: none for a value that is no URL with credentials."""
    if not _URL_WITH_CREDENTIALS.fullmatch(url):
        return []
    found = _PASSWORD.match(url)
    query = _QUERY_PASSWORD.finditer(_QUOTED.fullmatch(url).group(3))
    passwords = ([found.group(2)] if found else []) + [m.group(2) for m in query]
    return [p for p in passwords if p and p != "***"]


# the characters Hydra puts a backslash before when it writes a sweep's job's overrides
HYDRA_ESCAPED = re.compile(r"([\\()\[\]{}:=, \t])")


@functools.cache   # asked for each log record while a password is hidden
def _typed_forms(password: str) -> frozenset[str]:
    """The ways `password` can stand in an override as typed: as is, escaped
    as Hydra writes a sweep's job's overrides, inside quotes (where a quote is
    `\\'` and the backslashes before it are doubled), and each as repr() shows it."""
    forms = {password, HYDRA_ESCAPED.sub(r"\\\1", password)}
    for quote in "'\"":
        forms.add(re.sub(rf"(\\*){quote}", lambda m: "\\" * (2 * len(m[1]) + 1) + quote, password))
    return frozenset(forms | {form.replace("\\", "\\\\") for form in forms})


def hide_passwords(text: str, passwords) -> str:
    """`text` with each of `passwords` as *** where it stands as a password:
    between a user's `:` and the host's `@`, or after password=. Also as
    typed in quotes, as Hydra escapes it (a sweep's job's overrides) and as
    repr() shows that."""
    for password in sorted(set(passwords), key=len, reverse=True):
        for form in _typed_forms(password):
            text = text.replace(f":{form}@", ":***@")
            text = re.sub(rf"((?:password|passwd)\\*=){re.escape(form)}", r"\1***", text, flags=re.I)
    return text


def check_folder_names(dirs: dict, overrides, excluded) -> None:
    """Refuse job folders named by ${hydra.job.override_dirname} (Hydra's
    `key=value,...` of the overrides as typed) while an override it names
    holds a URL's password: the password would be the folder's name, shown
    in every path, listing and summary. `dirs`: each folder setting (hydra.sweep.subdir)
    as written, `excluded`: hydra.job.config.override_dirname.exclude_keys."""
    named = next((key for key, value in dirs.items() if re.search(r"hydra\W*job\.override_dirname", str(value))), None)
    keys = [key for key in (str(arg).partition("=")[0].lstrip("+~") for arg in overrides if passwords_in(str(arg)))
            if key not in excluded]
    if named and keys:
        raise UserError(f"{named} names each job's folder by ${{hydra.job.override_dirname}}, which would show "
                        f"the password in {keys[0]}: add hydra.job.config.override_dirname.exclude_keys="
                        f"[{','.join([*excluded, *keys])}], or name the folders by ${{hydra.job.num}}")


def hide(text: str, url) -> str:
    """`text` (an error's words) with `url` in it redacted."""
    url = str(url)
    shown = redact(url)
    return text.replace(url, shown) if shown != url else text


_typed: set[str] = set()   # the passwords this process was given on its command line or in its job's overrides


def keep_out_of_logs(overrides) -> None:
    """From now on, every log record of this process (Hydra's lines that list
    a sweep's jobs, ours, a failure's trace) shows the passwords of the URLs
    in `overrides` as ***."""
    found = {p for arg in overrides for p in passwords_in(str(arg))}
    if found and not _typed:
        _hide_in_records(logging.getLogRecordFactory())
    _typed.update(found)


def hide_typed(text: str) -> str:
    """`text` with every password keep_out_of_logs was given as ***."""
    return hide_passwords(text, _typed) if _typed else text


def may_hold_typed(text: str) -> bool:
    """`text` holds a part of a password keep_out_of_logs was given, in any
    form it is typed in (YAML may have folded a password with a space over
    two lines)."""
    return any(piece in text for password in _typed for form in _typed_forms(password) for piece in form.split())


def _hide_in_records(make_record) -> None:
    """The record factory, not a filter: Hydra's logging config replaces the
    handlers (and their filters) at each job, and a logger's filter misses
    what its children log."""
    def made(*args, **kwargs):
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:   # a bad format: the handler reports it, as logging does
            return record
        shown = hide_typed(message)
        if shown != message:
            record.msg, record.args = shown, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = hide_typed(logging.Formatter().formatException(record.exc_info))
        return record
    logging.setLogRecordFactory(made)
