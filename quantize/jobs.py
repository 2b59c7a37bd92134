"""One job = one Hydra run. Bad input becomes one line and a non-zero exit; in
a multirun, a failing job is recorded and the sweep goes on."""
import json
import logging
import os
import sys
import traceback

from quantize.errors import UserError

log = logging.getLogger("quantbench")

FAILURE_FILE = "FAILED.json"


def run_job(fn, cfg):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here; never wait on the network
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        return fn(cfg)
    except (UserError, Exception) as e:
        one_line = f"{type(e).__name__}: {e}" if not isinstance(e, UserError) else str(e)
        if not multirun:
            if isinstance(e, UserError):
                print(f"error: {one_line}", file=sys.stderr)
                raise SystemExit(e.exit_code)
            raise
        log.error("job failed: %s", one_line)
        _record_failure(one_line, traceback.format_exc())
        return None


def _record_failure(message: str, trace: str) -> None:
    from hydra.core.hydra_config import HydraConfig
    out = HydraConfig.get().runtime.output_dir
    with open(os.path.join(out, FAILURE_FILE), "w") as f:
        json.dump({"error": message, "traceback": trace,
                   "overrides": list(HydraConfig.get().overrides.task)}, f, indent=2)
