"""A server that is already running, driven over its OpenAI-compatible HTTP
API (`engine=openai engine.base_url=http://127.0.0.1:PORT/v1`, or without
/v1 as `vllm bench serve --base-url` takes it): another vLLM, TGI, SGLang. quantbench starts and stops nothing; it cannot know the remote
machine, so it decides no dtype or kernel and records what it was told.

Load goes to loopback addresses only unless `engine.allow_remote=true`: a
benchmark is a flood of requests, and pointing one at someone else's server
by a typo should take an explicit yes."""
import json
import logging
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from evaluate.formats import YES, Verdict
from evaluate.engines.base import Engine
from evaluate.engines.http import HttpEngine, http_get, is_loopback
import quantize.common.machine
from quantize.common.errors import UserError

log = logging.getLogger("quantbench.evaluate")
ALIVE_TIMEOUT_S = 5.0         # a /models answer later than this is unknown, not a death
DEAD_AFTER_FAILED_POLLS = 3   # /models errors since its last answer that mean the server is gone (a refusal: at once)
DEAD_AFTER_S = 10.0           # ... spread over at least this long: death-grace loops poll several times a second

def check_base_url(base_url, allow_remote: bool) -> str:
    """The API's base URL (the one /models and /completions hang from), or
    one line naming the fix. A bare server address gets the OpenAI API's
    /v1; a URL with a path is taken as given (a proxy may mount it elsewhere)."""
    if not base_url:
        raise UserError("engine=openai needs the server's address: pass engine.base_url=http://127.0.0.1:PORT/v1")
    parts = urlsplit(str(base_url))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"engine.base_url={base_url} is not an http(s) URL; pass e.g. http://127.0.0.1:8000/v1")
    if not is_loopback(parts.hostname) and not allow_remote:
        raise UserError(f"engine.base_url={base_url} is not a loopback address; pass engine.allow_remote=true "
                        "to send load to it")
    url = str(base_url).rstrip("/")
    return url + "/v1" if not parts.path.strip("/") else url


class OpenAIEngine(HttpEngine, Engine):
    name = "openai"
    remote = True

    @staticmethod
    def machine():
        """The client's machine: the server's is not known from here."""
        return quantize.common.machine.detect()

    @staticmethod
    def choose_dtype(fmt, machine, args: dict | None = None) -> str:
        return str((args or {}).get("dtype") or "auto")  # the server decides

    @staticmethod
    def accepted_args() -> set[str]:
        return {"dtype", "max_model_len"}  # recorded, not applied: the server was started with its own

    @staticmethod
    def supports(fmt, machine, args: dict) -> Verdict:
        return YES  # the running server answers that by serving, or not

    @classmethod
    def kv_quant(cls, fmt, args: dict) -> str | None:
        return None  # unknown: the server's own settings

    def start(self, target, args: dict, max_model_len: int) -> None:
        self.base_url = check_base_url(self.settings.get("base_url"), bool(self.settings.get("allow_remote")))
        self.args = {k: v for k, v in args.items() if v is not None}
        status, body = http_get(self.base_url + "/models", timeout=10)
        if status != 200:
            what = "nothing answers" if status == 0 else f"HTTP {status}"
            raise UserError(f"engine.base_url={self.base_url}: {what} at {self.base_url}/models; start the "
                            "server first or fix engine.base_url")
        self.model = str(self.settings.get("model") or _first_model(body, self.base_url))
        log.info("benchmarking the running server at %s (model %s)", self.base_url, self.model)

    failed_polls = 0                    # /models polls that got an error since its last answer
    first_failed: float | None = None   # when the first of them did (time.monotonic())

    def alive(self) -> str | None:
        """None unless the server is gone: its port refuses connections, or
        /models failed DEAD_AFTER_FAILED_POLLS polls over DEAD_AFTER_S or more
        since its last answer. A late answer neither counts nor clears them: a
        server saturated by the load answers slowly."""
        answer = probe(self.base_url + "/models", ALIVE_TIMEOUT_S)
        if answer == "ok":
            self.failed_polls, self.first_failed = 0, None
        if answer in ("ok", "late"):
            return None
        now = time.monotonic()
        self.failed_polls += 1
        self.first_failed = self.first_failed if self.first_failed is not None else now
        failing_s = now - self.first_failed
        if answer != "connection refused" and (self.failed_polls < DEAD_AFTER_FAILED_POLLS or failing_s < DEAD_AFTER_S):
            return None
        return (f"the server at {self.base_url} stopped answering (/models: {answer}"
                f"{f', {self.failed_polls} failed polls over {failing_s:.0f} s since its last answer' if self.failed_polls > 1 else ''})")

    def versions(self) -> dict[str, str]:
        return self.server_versions()


def probe(url: str, timeout: float) -> str:
    """How `url` answers: "ok" (HTTP 200), "late" (no answer within
    `timeout`), "connection refused", or the error in a few words."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            resp.read()
            return "ok" if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except TimeoutError:
        return "late"
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            return "late"
        return "connection refused" if isinstance(e.reason, ConnectionRefusedError) else f"no answer ({e.reason})"
    except OSError as e:  # reset, cut off mid-answer
        return "connection refused" if isinstance(e, ConnectionRefusedError) else f"no answer ({e})"


def _first_model(body: bytes, base_url: str) -> str:
    try:
        return json.loads(body)["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise UserError(f"{base_url}/models lists no model; pass engine.model=<the served model name>") from None
