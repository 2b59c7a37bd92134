"""A load profile defined outside conf/ and evaluate/: concurrency levels
`first`, `first + step`, ... (`count` of them). Its config is
dummy_profile.yaml beside it: put it on Hydra's search path as
<dir>/load/<name>.yaml and this folder on PYTHONPATH."""
from dataclasses import dataclass

from evaluate.serving.load import Level
from evaluate.serving.profiles import LoadProfile
from quantize.common.errors import UserError


@dataclass(frozen=True, kw_only=True)
class Staircase(LoadProfile):
    first: int = 1
    step: int = 1
    count: int = 2

    def validate(self, slo) -> None:
        super().validate(slo)
        if self.count < 1:
            raise UserError(f"load={self.name}: load.count must be at least 1, not {self.count}")

    def run(self, measure, slo) -> None:
        for i in range(self.count):
            measure(Level("concurrency", self.first + i * self.step))
