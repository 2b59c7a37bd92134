"""A test engine: the dummy engine (tests/evaluate/engines/dummy_engine.py,
fake clock, no model) behind a gate (tests/evaluate/engines/gate.py), set by
engine.args.gate and engine.args.free_runs. A job on it is surely
mid-scenario, its first rows written, when a test cancels, signals or
requeues it; the test creates the file to let the rest run."""
from tests.evaluate.engines.dummy_engine import DummyEngine
from tests.evaluate.engines.gate import Gated


class GatedEngine(Gated, DummyEngine):
    name = "gated"

    @staticmethod
    def accepted_args() -> set[str]:
        return DummyEngine.accepted_args() | {"gate", "free_runs"}

    def start(self, target, args: dict, max_model_len: int) -> None:
        super().start(target, args, max_model_len)
        self.hold_runs(args["gate"], args.get("free_runs"))
