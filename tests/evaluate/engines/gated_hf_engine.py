"""A test engine: the real transformers engine (evaluate.engines.hf) behind a
gate (tests/evaluate/engines/gate.py), set as gated_vllm_engine.py's is:
`engine._target_=` this class, `+engine.gate=... +engine.free_runs=N`. A test
that presses Ctrl-C while a run is held has it land surely inside that run,
however fast the tiny model's runs or busy the machine."""
from evaluate.engines.hf import HfEngine
from tests.evaluate.engines.gate import Gated


class GatedHfEngine(Gated, HfEngine):

    def start(self, target, args: dict, max_model_len: int) -> None:
        super().start(target, args, max_model_len)
        self.hold_runs(self.settings["gate"], self.settings.get("free_runs"))
