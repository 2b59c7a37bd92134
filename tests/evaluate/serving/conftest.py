"""Fixtures of the serving tests: the fake server (fake_server.py) in its own
process, started per test with the latency law and faults the test asks for."""
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

FAKE = Path(__file__).resolve().parent / "fake_server.py"


class FakeServer:
    def __init__(self, *flags: str):
        self.proc = subprocess.Popen([sys.executable, str(FAKE), "--port", "0", *flags], stdout=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("port "), f"fake server did not start: {line!r}"
        self.port = int(line.split()[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=60) as r:
            return json.loads(r.read())

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{self.port}/reset", method="POST"),
                               timeout=60).close()

    def alive(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"fake server exited with code {code}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def fake_server():
    """fake_server(*flags) -> a started FakeServer, stopped after the test."""
    started = []

    def start(*flags: str) -> FakeServer:
        started.append(FakeServer(*flags))
        return started[-1]

    yield start
    for s in started:
        s.stop()
