"""`python -m evaluate.report [results_dir=results|a,b] [out_dir=reports] [title=...] [pareto_scenario=<name>]
[accuracy_floor_pct=95] [busy_host_pct=10] [cost.usd_per_hour=<USD>]
[layout=[summary,batch_table,context_table,oneline,length_grid]] [output=[markdown,csv,png,html]]
[tracking=mlflow tracking.uri=<uri>]`

Hydra overrides like the two stages, over conf/report.yaml (`--help` lists
them and the groups): results_dir holds results*.jsonl, or names several
such folders side by side (`results_dir=a,b` or `results_dir=[a,b]`: rows
stay keyed by hardware and, with several, by store, so nothing measured
on two machines or in two stores is averaged); out_dir gets the
files of every layout (conf/report/layout/): `summary`, the default, writes
the files of its output formats (conf/report/output/: report.md, summary.csv,
runs.csv, serving.csv, the PNGs), every other layout `<layout>.md`;
pareto_scenario names the one scenario to draw a speed-vs-accuracy Pareto
plot of (default: one per scenario); cost.usd_per_hour (or
cost.per_gpu={H100:2.5} per GPU a run used, or cost.per_profile.<hardware
profile>) prices the machine, for the cost per 1M output tokens (none
without a price). Prints the files written,
one per line; their list goes into out_dir/.quantbench-report.json, by which
the next report removes those it does not write again (and nothing else).
Writes nothing else: no .hydra/, no log. With tracking=mlflow
the files written are also logged to the stores' run in MLflow (docs/tracking.md).

The spelling before Hydra, `layout=a,b` and `key=` (empty: the default),
works for one release with a deprecation line on stderr.

SIGTERM (a Slurm time limit, `timeout`) stops it with exit status 143
(128 + 15, as the other commands end) and one line: its staging folder is
removed, and the last report stays as it was."""
import signal
import sys
import threading

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from evaluate.report import Stopped, write_report
from evaluate.tracking import report_record
from evaluate.report.config import report_config, search_dirs
from quantize.common import hydra_errors
from quantize.common.cli_help import print_help_if_asked
from quantize.common.config import warn_old_spelling
from quantize.common.errors import UserError
from quantize.common.extensions import plain
from quantize.common.hf_load import detach_stdin
from quantize.common.jobs import run_command
from quantize.common.paths import CONF_DIR

KEYS = ("results_dir", "out_dir", "title", "pareto_scenario", "accuracy_floor_pct", "busy_host_pct", "layout", "output",
        "sanity", "tracking", "cost")
LIST_KEYS = ("layout", "output")
STORES_KEY = "results_dir"   # one folder, or several: results_dir=a,b is a list, not a Hydra sweep
# Hydra's own flags; those in FLAGS_WITH_VALUE take the next argument too.
HYDRA_FLAGS = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve", "--package", "-p")
FLAGS_WITH_VALUE = ("--cfg", "-c", "--info", "-i", "--package", "-p")
_exit_code = [0]  # what the Hydra task decided; hydra.main returns nothing
_written_to: list = [None]  # out_dir, once the report's files are in place


def check(argv: list[str]) -> None:
    """Every argument is a Hydra flag or an override of a key of conf/report.yaml
    (or of hydra.*); anything else is one line naming the keys."""
    value_next = False
    for arg in argv:
        key = arg.lstrip("+~").partition("=")[0].split(".")[0].split("/")[0]
        flag = arg.partition("=")[0]
        if value_next or flag in HYDRA_FLAGS or ("=" in arg and (key in KEYS or key == "hydra")):
            value_next = arg in FLAGS_WITH_VALUE
            continue
        raise UserError(f"unknown argument {arg!r}; python -m evaluate.report takes "
                        f"{' '.join(f'{k}=' for k in KEYS)} (Hydra overrides; --help lists them)")


def modernise(argv: list[str]) -> list[str]:
    """The old spelling as Hydra overrides, one deprecation line per old
    argument: `layout=a,b` -> `layout=[a,b]`, `key=` (empty) -> the default.
    `results_dir=a,b` (several stores, the current spelling) becomes the
    list of its folders, each quoted. Any other title or folder Hydra would
    read as something else (a comma: a sweep; brackets, quotes) is quoted,
    so it stays the text typed."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key in KEYS and value == "":
            warn_old_spelling(arg, f"leave {key}= out for its default")
            continue
        if eq and key == STORES_KEY and value.startswith("["):
            out.append(arg)     # a list already: Hydra reads it
        elif eq and key == STORES_KEY and "," in value:
            out.append(f"{key}=[{','.join(quoted(v) for v in value.split(',') if v)}]")
        elif eq and key in LIST_KEYS and not value.startswith("["):
            new = f"{key}=[{value}]"
            if "," in value:
                warn_old_spelling(arg, f"write {new}")
            out.append(new)
        elif eq and key in KEYS and key not in LIST_KEYS and not plain_value(arg):
            out.append(f"{key}={quoted(value)}")
        else:
            out.append(arg)
    return out


def quoted(value: str) -> str:
    """`value` as a Hydra quoted string, read back as the text typed."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def plain_value(override: str) -> bool:
    """Whether Hydra reads `key=value` as one plain value (not a sweep, list or syntax error)."""
    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException:
        return False
    return not parsed.is_sweep_override() and isinstance(parsed.value(), (str, int, float, bool, type(None)))


def parse_check(overrides: list[str]) -> None:
    """An override Hydra's grammar cannot read is one line naming it (Hydra's own error is several)."""
    for arg in overrides:
        if "=" in arg and hydra_errors.override_error(arg):
            raise UserError(hydra_errors.override_error(arg))


@hydra.main(config_path=str(CONF_DIR), config_name="report", version_base="1.3")
def _hydra_main(cfg) -> None:
    try:  # the one conversion: from here down the report sees a ReportConfig
        report = report_config(plain(cfg), search_dirs(HydraConfig.get().searchpath))
        paths = write_report(report)
        _written_to[0] = report.out_dir
        if report.tracker:  # a copy: the files in out_dir are the report
            report.tracker.log(report_record(report.results_dirs, report.out_dir, paths))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        _exit_code[0] = e.exit_code
        return
    for p in paths:
        print(p)
    _exit_code[0] = 0


def stopped_line(e: Stopped) -> str:
    """What a report stopped by a signal says: where, if it was stopped
    after its files were in place (its tracking not logged)."""
    name = signal.Signals(e.signum).name
    written_to = e.written_to or _written_to[0]
    if written_to:
        return f"stopped ({name}) after the report was written to {written_to}; tracking, if asked, was not logged"
    return f"stopped ({name}): nothing was replaced, the last report is as it was; rerun the same command to write it"


def _on_sigterm(signum, frame):
    signal.signal(signum, signal.SIG_IGN)   # a second one must not cut the staging folder's removal short
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if print_help_if_asked("report", argv):
        return 0
    try:
        check(argv)
        overrides = modernise(argv)
        parse_check(overrides)
        hydra_errors.check_no_value_replaces_keys("report", overrides)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    program, sys.argv = sys.argv, [sys.argv[0], *overrides]
    _exit_code[0], _written_to[0] = 0, None
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        _hydra_main()
    except SystemExit as e:  # Hydra's own flags (--cfg, --hydra-help) and errors
        return e.code if isinstance(e.code, int) else 1
    except Stopped as e:   # the staging folder is removed by now
        print(f"error: {stopped_line(e)}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        if not _written_to[0]:
            raise   # run_command's line: nothing was replaced
        print(f"error: {stopped_line(Stopped(signal.SIGINT))}", file=sys.stderr)   # Ctrl-C while tracking
        return 128 + signal.SIGINT
    finally:
        sys.argv = program
        if main_thread:
            signal.signal(signal.SIGTERM, before)
    return _exit_code[0]


if __name__ == "__main__":
    detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    run_command(main, "evaluate.report", "report")
