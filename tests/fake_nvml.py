"""A stand-in for pynvml: a node of GPUs with the memory each has and uses,
for the code that asks NVML on a host without an NVIDIA driver. Install it
with install(monkeypatch, [(total_bytes, used_bytes), ...])."""
import sys
import types
from types import SimpleNamespace


class NVMLError(Exception):
    pass


def module(gpus: list[tuple[int, int]], driver: str = "570.124.06") -> types.ModuleType:
    """pynvml over `gpus` (total, used) in NVML's order; GPU i's UUID is
    GPU-0000000i-..., and its one MIG slice MIG-0000000i-... holds half."""
    uuids = [f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}" for i in range(len(gpus))]
    handles = [SimpleNamespace(total=t, used=u, uuid=uuid) for (t, u), uuid in zip(gpus, uuids)]
    slices = {"MIG" + h.uuid[3:]: SimpleNamespace(total=h.total // 2, used=h.used // 2, uuid="MIG" + h.uuid[3:])
              for h in handles}

    def by_uuid(uuid):
        found = {h.uuid: h for h in handles} | slices
        if uuid not in found:
            raise NVMLError("Not Found")
        return found[uuid]

    fake = types.ModuleType("pynvml")
    fake.NVMLError = NVMLError
    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: len(handles)
    fake.nvmlDeviceGetHandleByIndex = lambda i: handles[i]
    fake.nvmlDeviceGetHandleByUUID = by_uuid
    fake.nvmlDeviceGetUUID = lambda h: h.uuid
    fake.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)
    fake.nvmlSystemGetDriverVersion = lambda: driver
    return fake


def install(monkeypatch, gpus: list[tuple[int, int]], driver: str = "570.124.06") -> types.ModuleType:
    fake = module(gpus, driver)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake
