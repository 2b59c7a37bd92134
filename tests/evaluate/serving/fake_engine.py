"""The vLLM server engine with the fake server in vLLM's place: the same
start, health wait, warm-up, watchdog and process-group stop, in a second
instead of minutes. Its config (engine.fake_flags) passes the fake's law and
faults; --spawn-child gives it a child in its process group, as vLLM's
engine core is."""
import sys
from pathlib import Path

from evaluate.engines.vllm_server import VllmServerEngine

FAKE = Path(__file__).resolve().parent / "fake_server.py"


class FakeServerEngine(VllmServerEngine):
    name = "fake_server"

    def command(self, target, host, port):
        flags = [str(f) for f in self.settings.get("fake_flags") or []]
        return [sys.executable, str(FAKE), "--host", host, "--port", str(port), "--spawn-child", *flags]


ENGINE_YAML = """\
name: fake_server
_target_: fake_engine.FakeServerEngine
host: 127.0.0.1
startup_timeout_s: 300   # a hang guard: the fake answers /health within a second or two
fake_flags: {flags}
args:
  dtype: auto
  max_model_len: null
env: {{}}
"""


def write_conf(folder: Path, flags: list[str]) -> Path:
    """A Hydra search-path folder with conf/engine/fake_server.yaml."""
    (folder / "engine").mkdir(parents=True, exist_ok=True)
    (folder / "engine" / "fake_server.yaml").write_text(ENGINE_YAML.format(flags=list(flags)))
    return folder
