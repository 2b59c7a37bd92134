"""Defaults that follow the hardware: the config group conf/hardware/{cpu,cuda}.yaml.

`python -m evaluate` picks the profile once, at its entry point, from the
machine facts (a CUDA GPU present: cuda), unless the command line names one
(`hardware=cpu|cuda`). Being a config group, the profile only changes
defaults: scenario=, slo=, load=, accuracy.reference_device=... given on the
command line still win. Every row records the profile (`hardware_defaults`)
and the report header names it.

`python -m evaluate.hardware` prints the profile this machine gets
(scripts/run_matrix.sh picks its matrix preset from it)."""
import sys

import quantize.common.machine
from quantize.common.conf_groups import HYDRA_VALUE_FLAGS
from quantize.common.hf_load import detach_stdin

GROUP = "hardware"
PROFILES = ("cpu", "cuda")
DEFAULT = "cpu"   # conf/evaluate.yaml's own choice
# Hydra's command-line flags that take a value (the next argument is not an override).
VALUE_FLAGS = {*HYDRA_VALUE_FLAGS, "--info", "-i"}


def detected(machine=None) -> str:
    """The profile for `machine` (default: this one, by its GPUs alone:
    the entry point asks before any check, so a refused command line stays quick)."""
    cuda = machine.cuda if machine else quantize.common.machine.gpus().get("cuda")
    return "cuda" if cuda else "cpu"


def named(argv: list[str]) -> str | None:
    """The profile the command line names (a sweep's `cpu,cuda` too), or None."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if sep and key == GROUP:
            return value
    return None


def with_default(argv: list[str]) -> list[str]:
    """`argv` with this machine's profile added where the user named none.
    The CPU profile is the config's own default, so a CPU command line stays
    as typed (and so does the `repro` its rows record); on a GPU the added
    `hardware=cuda` is in `repro`, which then reproduces from any machine."""
    if named(argv) is not None:
        return argv
    profile = detected()
    if profile == DEFAULT:
        return argv
    # Just before the first override, so that the overrides stay together: Hydra's
    # parser takes one run of them, and `hardware=cuda -m a=b` would leave `a=b`
    # unrecognized. With no override, first: a trailing flag that takes an optional
    # value (--info) would swallow it.
    at = next((i for i, arg in enumerate(argv)
               if "=" in arg and not arg.startswith("-") and (i == 0 or argv[i - 1] not in VALUE_FLAGS)), 0)
    return [*argv[:at], f"{GROUP}={profile}", *argv[at:]]


def mismatch(profile: str, machine) -> str | None:
    """A warning for a job whose defaults were chosen for another machine: a
    sweep launched from a CPU login node to GPU nodes gets the CPU defaults."""
    if profile == "cpu" and machine.cuda:
        return ("this job runs on a CUDA machine with the CPU defaults (hardware=cpu: scenario, slo, load, "
                "accuracy reference), picked where it was launched; pass hardware=cuda for the GPU ones")
    return None


def main(argv: list[str]) -> int:
    """Print this machine's profile; it takes no arguments (-h says what it prints)."""
    if argv in (["-h"], ["--help"]):
        print("python -m evaluate.hardware: print the hardware profile this machine gets (cpu or cuda); "
              "it takes no arguments")
        return 0
    if argv:
        print(f"error: python -m evaluate.hardware takes no arguments, not {argv[0]!r} "
              "(it prints this machine's profile; --help says more)", file=sys.stderr)
        return 2
    print(detected())
    return 0


if __name__ == "__main__":
    detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    sys.exit(main(sys.argv[1:]))
