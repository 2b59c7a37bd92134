"""A URL's password kept out of what is shown or written: logs, manifests,
commands, study.json. A database backend (MLflow's tracking.uri, the search's
storage) can only take its password in the URL, so the URL itself is what
must be redacted, everywhere but where it is connected to."""
import re

# scheme://<user>:<password>@<host>...: the password runs to the `@` before a
# host (no `@` or `/` in it): one with a space, a `/` or an `@` is hidden whole.
# A host's port is no password: `https://h:5000/runs@x` has none, its `@` is the path's.
# Without a scheme, `user:password@host` (but not a path: `sqlite:////a@b`).
# Also as a sweep's job gets it from Hydra, quoted or escaped (`postgresql\://u\:pw@h`).
_PASSWORD = re.compile(r"^(\s*['\"]?(?:[A-Za-z][\w+.\-]*\\?://)?[^:/?#@\s]*:(?!//)(?!\d*(?:[/?#]|$)))(.*?)"
                       r"(@[^@/?#]*(?:[/?#].*)?)$", re.S)
# a password in the query string (`postgresql://h/db?user=u&password=p`)
_QUERY_PASSWORD = re.compile(r"([?&](?:password|passwd)=)[^&#\s'\"]*", re.I)
# a value that may be a URL with credentials (redact_values): a scheme and an `@` or a password=
_URL_WITH_CREDENTIALS = re.compile(r"\s*['\"]?[A-Za-z][\w+.\-]*\\?://.*(?:@|[?&](?:password|passwd)=).*", re.S | re.I)


def redact(url) -> str:
    """The URL as logs and files show it: the password as ***. Anything else
    is kept as given (a sqlite path or a git ref with an `@`): a rerun of a
    command that holds it must find the same path."""
    url = str(url)   # Hydra reads storage=5 as a number
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***\3", url, count=1))


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
    """A Hydra override (`key=value`) with a URL value redacted."""
    key, sep, value = arg.partition("=")
    return f"{key}{sep}{redact_values(value)}" if sep else arg


def hide(text: str, url) -> str:
    """`text` (an error's words) with `url` in it redacted."""
    url = str(url)
    shown = redact(url)
    return text.replace(url, shown) if shown != url else text
