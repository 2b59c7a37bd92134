"""Experiment tracking: each artifact, measurement and report also logged to a
tracker (`tracking=mlflow`: conf/tracking/mlflow.yaml), off by default
(`tracking=none`).

The artifacts and the results store stay the source of truth; a tracker gets
a copy. So logging never fails a job: the first failure is one warning line,
the tracker stays quiet for the rest of the process, and the warning says
what logs it later: `python -m evaluate.track` back-fills rows, a rerun of
quantize or of the report logs an artifact or a report.

What a tracker is sent is a `RunRecord`: a deterministic key, looked up before
a run is created, so a rerun, a requeued Slurm job or a back-fill never logs a
run twice; its parent's key (a measurement's run sits under its artifact's);
params, metrics per step, tags and files. This module maps an artifact to its
record (`artifact_record`); evaluate.tracking maps result rows and reports.

Adding a tracker is one module and one YAML, as for the other extension
points (quantize.common.extensions): a subclass of `Tracker` whose `write`
creates or finds the record's run, and conf/tracking/<name>.yaml naming it
with `_target_`."""
import json
import logging
import re
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from quantize.common import extensions, manifest
from quantize.common.jobs import one_line
from quantize.common.provenance import sha256_json

log = logging.getLogger("quantbench.tracking")

KEY_TAG = "quantbench_key"      # the run's deterministic key, as a tag the tracker looks runs up by
# what a run's metrics and files are of (an artifact: its build); set last, once they are logged
REVISION_TAG = "quantbench_revision"
GROUP = "conf/tracking"
# What recovers a run an outage kept from the tracker, said in the warning (a RunRecord's `recovery`)
BACKFILL = ("the results store keeps every row and python -m evaluate.track results_dir=<results_dir> "
            "tracking.uri=<uri> back-fills them")
QUANTIZE_AGAIN = ("the artifact is built: once the tracker is back, the same python -m quantize command finds it "
                  "complete and logs its run in full")


@dataclass(frozen=True)
class Metric:
    key: str
    value: float
    step: int = 0
    # when it was measured (ms since the epoch), if it says: a step of that
    # index measured at another time (a measurement repeated) is logged too
    at: int | None = None


@dataclass(frozen=True)
class RunRecord:
    """One run as the tracker receives it; `key` decides whether it exists."""
    key: str
    name: str
    params: dict[str, str] = field(default_factory=dict)   # write-once: each the run lacks is written
    tags: dict[str, str] = field(default_factory=dict)     # set on every write (they only overwrite)
    untags: tuple[str, ...] = ()                           # removed where set (a reason since fixed)
    metrics: tuple[Metric, ...] = ()                       # each (key, step) logged once
    files: tuple[Path, ...] = ()                           # each the run lacks is logged
    texts: dict[str, str] = field(default_factory=dict)    # file name -> text, as `files`
    parent: "RunRecord | None" = None                      # created first, if missing
    failed: bool = False                                   # the run ends FAILED instead of FINISHED
    refresh_files: bool = False                            # files replace the run's on every write (a report)
    revision: str | None = None                            # another than the run's: metrics and files anew
    recovery: str = BACKFILL                               # what logs the run after an outage, for the warning


@dataclass
class Tracker(extensions.Configurable):
    """Base of the trackers (conf/tracking/<name>.yaml names one with `_target_`)."""
    name: str = ""
    # key -> a context that holds that run's lock across processes (evaluate
    # binds its results store's locks); None: no other process logs these runs
    locks: Callable[[str], AbstractContextManager] | None = field(default=None, init=False, repr=False,
                                                                  compare=False)
    _quiet: bool = field(default=False, init=False, repr=False, compare=False)
    # the steps `write` logged that the runs lacked (not their parents'), for a back-fill's line
    steps_sent: int = field(default=0, init=False, repr=False, compare=False)

    def write(self, record: RunRecord) -> str:
        """Create the record's run (and its parent's) unless its key exists;
        log what it lacks; return the run's id. Errors propagate (see `log`)."""
        raise NotImplementedError

    def prepare(self, records: list[RunRecord]) -> None:
        """Get ready to write many records at once (a back-fill); nothing by default."""

    def describe(self) -> str:
        """Where the runs go, for the lines that name it (no password)."""
        return self.name

    def shown(self, text: str) -> str:
        """`text` (an error's words) as a line may show it: a tracker whose
        address holds a password redacts it."""
        return text

    def holding(self, key: str) -> AbstractContextManager:
        """Run `key`'s lock: a check-then-create or check-then-log is one step for all processes."""
        return self.locks(key) if self.locks else nullcontext()

    def log(self, *records: RunRecord | None) -> bool:
        """Write the records (None: nothing to log); see `safely`."""
        records = [r for r in records if r is not None]
        return self.safely(lambda: [self.write(r) for r in records],
                           recovery=records[0].recovery if records else BACKFILL)

    def log_artifact(self, artifact_dir: Path) -> bool:
        """The run of the artifact in `artifact_dir` (quantize's: built, or found complete)."""
        return self.safely(lambda: self.log(artifact_record(artifact_dir)), recovery=QUANTIZE_AGAIN)

    def safely(self, fn, recovery: str = BACKFILL) -> bool:
        """Run `fn`, which logs; a failure is one warning that says what logs
        it later (`recovery`), and this tracker is quiet from then on.
        Returns whether it ran to the end."""
        if self._quiet:
            return False
        try:
            fn()
            return not self._quiet
        except Exception as e:  # a tracker fails in many ways; none may fail a measurement
            self._quiet = True
            log.warning("tracking: logging to %s failed (%s); no more tracking in this job, %s",
                        self.describe(), self.error_line(e), recovery)
            return False


    def error_line(self, e: BaseException, limit: int = 200) -> str:
        """The error as one shown line, cut to `limit` after the redaction."""
        text = self.shown(one_line(e, limit=100_000))
        return text if len(text) <= limit else text[:limit - 1] + "…"


def from_group(values: dict | None) -> Tracker | None:
    """The `tracking` group's choice, built; None for tracking=none (no `_target_`)."""
    values = dict(values or {})
    if not values.get(extensions.TARGET):
        return None
    return extensions.build(values, Tracker, f"{GROUP}/{values.get('name', '?')}.yaml")


def run_key(*parts) -> str:
    """A run's deterministic key: the same parts give the same key on every host."""
    return sha256_json([str(p) if p is not None else None for p in parts])[:24]


def artifact_record(artifact_dir: Path) -> RunRecord | None:
    """The run of one artifact (None without a manifest): the recipe as params,
    the size, timings and sanity check as metrics, manifest.json and
    recipe.yaml as files."""
    described = manifest.read(artifact_dir)
    if described is None:
        return None
    recipe_file = Path(artifact_dir) / "recipe.yaml"
    sanity = (described.checks or {}).get("sanity") or {}
    params = {"model": described.model.name, "recipe": described.recipe.name,
              "quant_format": described.quant_format, "calibration_dtype": described.calibration_dtype,
              "seed": described.seed, **flat(described.calibration or {}, "calibration"),
              **flat(_recipe_values(recipe_file), "recipe")}
    metrics = {"size_bytes": described.bytes_on_disk.get("total"),
               "weights_bytes": described.bytes_on_disk.get("weights"),
               **flat(described.timings_s, "time_s"), **flat(sanity, "sanity")}
    suspect = described.extra.get("suspect")
    tags = {"artifact_id": described.artifact_id, "model": described.model.name, "recipe": described.recipe.name,
            "artifact_path": str(Path(artifact_dir).resolve()), "suspect": suspect["reason"] if suspect else None}
    return RunRecord(
        key=artifact_key(described.artifact_id),
        name=f"{described.model.name}/{described.recipe.name}",
        params=clean_params(params),
        tags=clean_tags(tags), untags=cleared(tags, "suspect"),
        metrics=numeric(metrics),
        files=tuple(p for p in (Path(artifact_dir) / manifest.FILE, recipe_file) if p.is_file()),
        revision=described.created_at,   # a rebuild (force=true) keeps the id, not the build time
        recovery=QUANTIZE_AGAIN,
        texts={"sanity.json": json.dumps(sanity, indent=2, sort_keys=True)} if sanity else {})


def artifact_key(artifact_id: str) -> str:
    return run_key("artifact", artifact_id)


def _recipe_values(path: Path) -> dict:
    """The recipe YAML's settings (an empty dict when it is not a mapping)."""
    try:
        values = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return values if isinstance(values, dict) else {}


def flat(values, prefix: str = "") -> dict:
    """A nested mapping as dotted keys; lists stay one value (their JSON)."""
    if not isinstance(values, dict):
        return {prefix: values}
    out = {}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out |= flat(value, name) if isinstance(value, dict) and value else {name: value}
    return out


# Trackers take keys of letters, digits and `_ - . /` and space (MLflow's rule, the strictest known).
_BAD_KEY_CHARS = re.compile(r"[^\w.\- ]+")
MAX_KEY, MAX_VALUE = 250, 6000


def clean_key(key: str) -> str:
    """`key` with what a tracker refuses dropped: `oneshot (calibrate + quantize)` -> `oneshot calibrate quantize`."""
    return " ".join(_BAD_KEY_CHARS.sub(" ", str(key)).split()).strip(" .")[:MAX_KEY] or "_"


def _text(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 1] + "…"


def clean_params(values: dict) -> dict[str, str]:
    """Param values as text under valid keys; None values are left out."""
    return {clean_key(k): _text(v) for k, v in values.items() if v is not None}


clean_tags = clean_params


def cleared(tags: dict, *keys: str) -> tuple[str, ...]:
    """Those of `keys` whose value in `tags` is None: tags a run must lose
    (a rebuild no longer suspect, a measurement no longer failed)."""
    return tuple(clean_key(k) for k in keys if tags.get(k) is None)


def numeric(values: dict, step: int = 0, at: int | None = None) -> tuple[Metric, ...]:
    """The values that are numbers (not bools), as metrics at `step` (measured `at`)."""
    return tuple(Metric(clean_key(k), float(v), step, at) for k, v in values.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v)


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"
