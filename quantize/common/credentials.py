"""A URL's password kept out of what is shown or written: logs, manifests,
commands, study.json. A database backend (MLflow's tracking.uri, the search's
storage) can only take its password in the URL, so the URL itself is what
must be redacted, everywhere but where it is connected to."""
import re

# scheme://<user>:<password>@<host>...: the password runs to the `@` before a
# host (no `@` or `/` in it): one with a space, a `/` or an `@` is hidden whole.
# Without a scheme, `user:password@host` (but not a path: `sqlite:////a@b`).
# Also as a sweep's job gets it from Hydra, quoted or escaped (`postgresql\://u\:pw@h`).
_PASSWORD = re.compile(r"^(\s*['\"]?(?:[A-Za-z][\w+.\-]*\\?://)?[^:/\s]*:(?!//))(.*?)(@[^@/?#]*(?:[/?#].*)?)$",
                       re.S)
# a value that may be a URL with credentials (redact_values): a scheme and an `@`
_URL_WITH_AT = re.compile(r"\s*['\"]?[A-Za-z][\w+.\-]*\\?://.*@.*", re.S)


def redact(url) -> str:
    """The URL as logs and files show it: the password as ***. Anything else
    is kept as given (a sqlite path or a git ref with an `@`): a rerun of a
    command that holds it must find the same path."""
    url = str(url)   # Hydra reads storage=5 as a number
    return _PASSWORD.sub(r"\1***\3", url, count=1)


def redact_values(values):
    """`values` (nested dicts and lists) with each URL that holds
    credentials redacted; other values as they are."""
    if isinstance(values, dict):
        return {k: redact_values(v) for k, v in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(redact_values(v) for v in values)
    if isinstance(values, str) and _URL_WITH_AT.fullmatch(values):
        return redact(values)
    return values


def redact_override(arg: str) -> str:
    """A Hydra override (`key=value`) with a URL value redacted."""
    key, sep, value = arg.partition("=")
    return f"{key}{sep}{redact_values(value)}" if sep else arg


def hide(text: str, url) -> str:
    """`text` (an error's words) with `url` in it redacted."""
    url = str(url)
    return text.replace(url, redact(url)) if "@" in url else text
