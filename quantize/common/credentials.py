"""A URL's password kept out of what is shown or written: logs, manifests,
commands, study.json. A database backend (MLflow's tracking.uri, the search's
storage) can only take its password in the URL, so the URL itself is what
must be redacted, everywhere but where it is connected to."""
import re

# scheme://<userinfo>@...: only such a string can hold a password
_WITH_USERINFO = re.compile(r"[A-Za-z][\w+.\-]*://\S*@\S*")


def redact(url) -> str:
    """The URL as logs and files show it: the password as ***."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    url = str(url)   # Hydra reads storage=5 as a number
    if "@" not in url:   # no credentials: as given (a parse would re-encode it)
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url.split("@")[-1]  # unparsable: keep only what follows any credentials


def redact_values(values):
    """`values` (nested dicts and lists) with each URL that holds
    credentials redacted; other values as they are."""
    if isinstance(values, dict):
        return {k: redact_values(v) for k, v in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(redact_values(v) for v in values)
    if isinstance(values, str) and _WITH_USERINFO.fullmatch(values.strip()):
        return redact(values.strip())
    return values


def redact_override(arg: str) -> str:
    """A Hydra override (`key=value`) with a URL value redacted."""
    key, sep, value = arg.partition("=")
    return f"{key}{sep}{redact_values(value)}" if sep else arg


def hide(text: str, url) -> str:
    """`text` (an error's words) with `url` in it redacted."""
    url = str(url)
    return text.replace(url, redact(url)) if "@" in url else text
