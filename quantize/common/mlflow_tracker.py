"""The MLflow tracker: `tracking=mlflow tracking.uri=<uri>` (conf/tracking/mlflow.yaml).

It logs through MlflowClient, never MLflow's fluent API: no active run or
global state, so jobs side by side in one process (a joblib or Ray launcher)
or on many nodes (Slurm) each log their own runs. `uri` is what MLflow takes:
an `http://` server (several jobs at once: use one), `sqlite:///<file>` or a
folder. mlflow-skinny (requirements/common.txt) is enough for the client;
the server is the full package (scripts/setup_mlflow.sh)."""
import importlib.util
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from quantize.common.credentials import hide, redact
from quantize.common.errors import UserError
from quantize.common.tracking import KEY_TAG, REVISION_TAG, Metric, RunRecord, Tracker, clean_key, clean_tags

log = logging.getLogger("quantbench.tracking")
MISSING = ("tracking=mlflow needs the mlflow-skinny package; install it with bash scripts/setup.sh "
           "(requirements/common.txt), or pass tracking=none")
PARENT_TAG = "mlflow.parentRunId"   # how MLflow nests a run under another
# The names of the files this tool logged to a run: only those are replaced,
# never a file a user attached to the run by hand.
FILES_TAG = "quantbench_files"
# MLflow's batch limits (mlflow.utils.validation)
PARAMS_PER_BATCH, METRICS_PER_BATCH = 100, 1000
# The client's defaults a job changes (a user's own setting wins): a server that
# is down is given up in seconds, not after minutes of retries per call, so a
# job only loses its tracking; and no "View run" lines on stdout after each
# write (the report's stdout is the files it wrote; one log line says where runs go);
# and a folder URI works: MLflow 3 refuses its folder store (in maintenance) without the opt-in;
# and no usage telemetry leaves the host (MLflow 3 sends it unless told not to, from its import on).
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
                   "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true", "MLFLOW_ALLOW_FILE_STORE": "true",
                   "MLFLOW_DISABLE_TELEMETRY": "true"}


def _client_defaults() -> None:
    """CLIENT_DEFAULTS, before mlflow is first imported (its telemetry starts then)."""
    for name, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)


# How long a run's creation may take (a SQLite store's lock, a busy server),
# and so how long after creating a run a job looks for one created before it.
SETTLE_S = 1.0
URI_EXAMPLES = "tracking.uri=http://127.0.0.1:5000, sqlite:///mlflow.db or a folder"


@dataclass
class MlflowTracker(Tracker):
    uri: str = "sqlite:///mlflow.db"
    experiment: str = "quantbench"
    # per process: key -> run id (a run, once made, keeps its id)
    _runs: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _client: object = field(default=None, init=False, repr=False, compare=False)
    _experiment_id: str | None = field(default=None, init=False, repr=False, compare=False)
    # per process: parent key -> run id, once the parent is written (a child's many writes write it once)
    _parents: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, values: dict, where: str) -> "MlflowTracker":
        if importlib.util.find_spec("mlflow") is None:
            raise UserError(MISSING)
        _client_defaults()
        tracker = super().from_config(values, where)
        if not str(tracker.uri).strip():
            raise UserError(f"{where}: uri is empty; pass {URI_EXAMPLES}")
        _check_scheme(str(tracker.uri), where)
        return tracker

    def describe(self) -> str:
        return f"MLflow experiment {self.experiment} at {redact(self.uri)}"

    def shown(self, text: str) -> str:
        return hide(text, self.uri)

    def write(self, record: RunRecord) -> str:
        run_id, sent = self._write(record)
        self.steps_sent += sent
        return run_id

    def _write(self, record: RunRecord) -> tuple[str, int]:
        """The record's run id, and how many steps it was sent (its parent's not counted)."""
        parent = self._parent(record.parent) if record.parent else None
        with self.holding(record.key):
            run_id, created = self._ensure(record, parent)
            rebuilt = not created and self._complete(run_id, record)
            sent = self._metrics(run_id, record.metrics, created or rebuilt)
            if record.revision and (created or rebuilt):   # last: a write cut short is a rebuild still
                self._batch(run_id, tags={REVISION_TAG: record.revision})
            self.client().set_terminated(run_id, status="FAILED" if record.failed else "FINISHED")
        return run_id, sent

    def find(self, key: str) -> str | None:
        """The id of the run with this key (the first created, should two exist), None if none."""
        if key not in self._runs:
            first = self._settled(key)
            if first:
                self._runs[key] = first
        return self._runs.get(key)

    def prepare(self, records: list[RunRecord]) -> None:
        """Create the runs the records (and their parents) lack, a level at a
        time: parents, then children, each level waiting SETTLE_S once for
        all its runs, where `write` waits once per run it creates (a back-fill
        into a new experiment creates hundreds)."""
        parents = list({r.parent.key: r.parent for r in records if r.parent}.values())
        for level in (parents, records):
            created = {}
            for record in level:
                with self.holding(record.key):
                    if record.key not in created and not self.find(record.key):
                        parent = self._runs.get(record.parent.key) if record.parent else None
                        created[record.key] = self._create(record, parent)
            if created:
                _wait_settled(max(c.start_time for c in created.values()))
            for key, run in created.items():
                self._keep(key, run)

    def _settled(self, key: str, mine=None) -> str | None:
        """The run every job keeps of those with `key`: the first created.
        Jobs that share no lock (quantize's; evaluate's of other stores or
        nodes) may each create one, so a first that started less than SETTLE_S
        ago is looked up again once that second has passed: a run started
        earlier whose creation was still on its way is seen too (and a run
        about to be deleted by its creator is not logged to). `mine`: (run id,
        start ms) of the run this job just created."""
        first = self._first(key) or mine
        if first and _wait_settled(first[1]):
            first = self._first(key) or mine
        return first[0] if first else None

    def _first(self, key: str) -> tuple[str, int] | None:
        """The first created of the runs with this key (the run id breaks a
        tie), and its start (ms): every job that looks agrees on it."""
        found = self.client().search_runs([self.experiment_id()], filter_string=f"tags.{KEY_TAG} = '{key}'",
                                          max_results=100, order_by=["attributes.start_time ASC"])
        first = min(((r.info.start_time, r.info.run_id) for r in found), default=None)
        return (first[1], first[0]) if first else None

    def client(self):
        if self._client is None:
            _client_defaults()
            retries = logging.getLogger("urllib3.connectionpool")
            if retries.level == logging.NOTSET:   # a server down is one warning line, not one per retry too
                retries.setLevel(logging.ERROR)
            from mlflow import MlflowClient
            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = self._experiment()
        return self._experiment_id

    def _experiment(self) -> str:
        """The experiment's id, created if missing (two jobs may race to create it)."""
        from mlflow.exceptions import MlflowException
        client = self.client()
        found = client.get_experiment_by_name(self.experiment)
        if found is None:
            try:
                return client.create_experiment(self.experiment, artifact_location=self._artifact_location())
            except MlflowException:
                found = client.get_experiment_by_name(self.experiment)  # created by another job meanwhile
                if found is None:
                    raise
        if found.lifecycle_stage != "active":
            raise UserError(f"MLflow experiment {self.experiment!r} is deleted; restore it or pass "
                            "tracking.experiment=<another name>")
        return found.experiment_id

    def _artifact_location(self) -> str | None:
        """Where a new experiment keeps its files: beside a SQLite store, in
        `mlruns/<experiment>/` (MLflow's default is ./mlruns of whichever
        folder a job ran in, so one experiment's files were spread over each
        job's folder); None (the server's or store's own choice) for other stores.
        A name's `/` parts are folders, but never an absolute path or `..`
        (`/Users/me/exp`, a valid Databricks-style name: mlruns/Users/me/exp)."""
        if not self.uri.startswith("sqlite:///"):
            return None
        database = Path(self.uri.removeprefix("sqlite:///")).absolute()
        return (database.parent / "mlruns" / _folder(self.experiment)).as_uri()

    def _parent(self, parent: RunRecord) -> str:
        """The parent's run id, written once per process: created, or completed
        where it was found (one a back-fill built from rows, or cut short)."""
        if parent.key not in self._parents:
            self._parents[parent.key] = self._write(parent)[0]
        return self._parents[parent.key]

    def _ensure(self, record: RunRecord, parent: str | None) -> tuple[str, bool]:
        """The record's run id, and whether this call created it."""
        run_id = self.find(record.key)
        if run_id:
            return run_id, False
        created = self._create(record, parent)
        run_id = self._keep(record.key, created)
        if run_id != created.run_id:
            return run_id, False
        self._batch(run_id, params=record.params)
        self._files(run_id, record)
        self._own_files(run_id, _names(record))
        return run_id, True

    def _create(self, record: RunRecord, parent: str | None):
        """A new run of the record (its tags only); its RunInfo."""
        tags = {KEY_TAG: record.key, **record.tags, **({PARENT_TAG: parent} if parent else {})}
        return self.client().create_run(self.experiment_id(), tags=tags, run_name=record.name).info

    def _keep(self, key: str, created) -> str:
        """The run kept of `key` once this job created `created`: the settled
        first; this job's run is deleted if it is not that one."""
        first = self._settled(key, (created.run_id, created.start_time))
        self._runs[key] = first
        if first != created.run_id:
            self.client().delete_run(created.run_id)
        else:
            log.info("tracking: run %s (%s) in %s", created.run_name, first, self.describe())
        return first

    def _complete(self, run_id: str, record: RunRecord) -> bool:
        """A found run gets what it lacks: a run created just before an outage
        holds only its tags, one a back-fill built from rows no params or files.
        Params are write-once, so only the absent ones; tags overwrite, and
        those the record clears are deleted. Returns whether the run is of
        another revision (a rebuild): its files are then replaced, the metrics
        the new build lacks unset, and its metrics are to be logged anew."""
        run = self.client().get_run(run_id)
        held = run.data
        rebuilt = bool(record.revision) and held.tags.get(REVISION_TAG) != record.revision
        self._batch(run_id, params={k: v for k, v in record.params.items() if k not in held.params},
                    tags={**record.tags, **_seen(held, record.params)})
        for key in set(record.untags) & set(held.tags):
            self.client().delete_tag(run_id, key)
        if rebuilt:
            self._unset(run_id, set(held.metrics) - {m.key for m in record.metrics})
        if record.refresh_files or rebuilt:
            self._files(run_id, record)
            self._drop_stale(run_id, run.info.artifact_uri, record, _logged_here(held.tags))
            self._own_files(run_id, _names(record))
        elif record.files or record.texts:
            self._files(run_id, record, skip={a.path for a in self.client().list_artifacts(run_id)})
            self._own_files(run_id, _names(record) | (_logged_here(held.tags) or set()))
        return rebuilt

    def _batch(self, run_id: str, params: dict | None = None, tags: dict | None = None) -> None:
        from mlflow.entities import Param, RunTag
        for kind, values in ((Param, params or {}), (RunTag, tags or {})):
            items = [kind(k, v) for k, v in values.items()]
            for i in range(0, len(items), PARAMS_PER_BATCH):
                chunk = items[i:i + PARAMS_PER_BATCH]
                self.client().log_batch(run_id, **({"params": chunk} if kind is Param else {"tags": chunk}))

    def _files(self, run_id: str, record: RunRecord, skip: set[str] = frozenset()) -> None:
        """The record's files and texts, but those named in `skip` (held already)."""
        client = self.client()
        for path in record.files:
            if Path(path).name not in skip:
                client.log_artifact(run_id, str(path))
        for name, text in record.texts.items():
            if name not in skip:
                client.log_text(run_id, text, name)

    def _own_files(self, run_id: str, names: set[str]) -> None:
        if names:
            self._batch(run_id, tags={FILES_TAG: json.dumps(sorted(names))})

    def _drop_stale(self, run_id: str, artifact_uri: str, record: RunRecord, ours: set[str] | None) -> None:
        """Delete the files this tool logged to the run that the record does
        not hold (a plot the last report wrote and this one did not): a
        replaced run's files are the record's, not a mix of two writes. A file
        a user attached stays; `ours` None (a run logged before FILES_TAG
        existed) takes every file for the tool's. MlflowClient deletes no
        artifact; the run's artifact store does (a server's proxy too)."""
        kept = _names(record)
        stale = [a.path for a in self.client().list_artifacts(run_id)
                 if a.path not in kept and (ours is None or a.path in ours)]
        if stale:
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
            store = get_artifact_repository(artifact_uri, tracking_uri=self.uri)
            for path in stale:
                store.delete_artifacts(path)

    def _unset(self, run_id: str, keys: set[str]) -> None:
        """The metrics the run shows that this build lacks (a sanity check or a
        verify phase the old build had), set to NaN: MLflow deletes no metric,
        and the run is one build's, not a mix of two."""
        from mlflow.entities import Metric as MlflowMetric
        now = int(time.time() * 1000)
        gone = [MlflowMetric(key, float("nan"), now, 0) for key in sorted(keys)]   # an artifact's are step 0
        for i in range(0, len(gone), METRICS_PER_BATCH):
            self.client().log_batch(run_id, metrics=gone[i:i + METRICS_PER_BATCH])

    def _metrics(self, run_id: str, metrics: tuple[Metric, ...], every: bool) -> int:
        """The metrics of each step the run lacks (`every`: all of them, the
        latest value of a step wins). A step is its index and, where a metric
        says when it was measured, that time: a measurement repeated adds its
        runs at the same indexes. A step's metrics go in one batch, so one
        metric's history says which steps a run holds. Returns how many steps were new."""
        from mlflow.entities import Metric as MlflowMetric
        now = int(time.time() * 1000)
        held = set() if every or not metrics else self._steps_logged(run_id, min(m.key for m in metrics))
        indexes = {step for step, _ in held}
        new = [MlflowMetric(m.key, m.value, now if m.at is None else m.at, m.step) for m in metrics
               if (m.step not in indexes if m.at is None else (m.step, m.at) not in held)]
        for i in range(0, len(new), METRICS_PER_BATCH):
            self.client().log_batch(run_id, metrics=new[i:i + METRICS_PER_BATCH])
        return len({(m.step, m.timestamp) for m in new})

    def _steps_logged(self, run_id: str, key: str) -> set[tuple[int, int]]:
        return {(m.step, m.timestamp) for m in self.client().get_metric_history(run_id, key)}


def _wait_settled(started_ms: int) -> bool:
    """Wait until SETTLE_S has passed since `started_ms`; whether it had not.
    At most SETTLE_S: a start stamped by a node whose clock is ahead must not
    hold the job (and its store's lock) for as long as the clocks differ."""
    left = min(started_ms / 1000 + SETTLE_S - time.time(), SETTLE_S)
    if left > 0:
        time.sleep(left)
    return left > 0


def _folder(experiment: str) -> str:
    """The experiment's folder under mlruns/: its name's `/` parts but empty ones, `.` and `..`
    (split by hand: PurePosixPath keeps a leading `//` as a part of its own)."""
    parts = [p for p in experiment.split("/") if p not in ("", ".", "..")]
    return "/".join(parts) or "_"


def _seen(held, params: dict) -> dict:
    """Params are write-once, so a run's are its first record's: for each the
    record has another value of (a measurement's row from a twin host, or
    after a git pull), a tag `seen.<param>` listing every value seen."""
    tags = {}
    for key, value in params.items():
        first = held.params.get(key)
        if first is None or first == value:
            continue
        name = clean_key(f"seen.{key}")
        try:
            values = set(json.loads(held.tags[name]))
        except (KeyError, ValueError, TypeError):
            values = {first}
        if value not in values:
            tags[name] = json.dumps(sorted(values | {value}))
    return clean_tags(tags)


def _names(record: RunRecord) -> set[str]:
    """The names the record's files and texts have in its run."""
    return {Path(p).name for p in record.files} | set(record.texts)


def _logged_here(tags: dict) -> set[str] | None:
    """The names FILES_TAG says this tool logged; None if the run has no such tag."""
    try:
        return set(json.loads(tags[FILES_TAG]))
    except (KeyError, ValueError, TypeError):
        return None


def _check_scheme(uri: str, where: str) -> None:
    """A URI the installed MLflow has no store for (`htp://`, `foo://`) is a typo,
    not a server that is down: one line and exit 2 before any work, where the
    client's own error came after the run. MLflow's registry decides, so the
    schemes follow the installed release."""
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry as registry
    except ImportError:   # a release that moved it: the client's own error stays
        return
    try:
        registry.get_store_builder(uri)
    except Exception as e:   # MLflow's "unsupported URI" (it names the schemes it takes)
        raise UserError(f"{where}: MLflow has no store for uri={redact(uri)!r} (not a scheme it knows); "
                        f"pass {URI_EXAMPLES}") from None
