from quantize.cli import main
from quantize.common.hf_load import detach_stdin
from quantize.common.jobs import run_command

if __name__ == "__main__":
    detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    run_command(main, "quantize", "quantize")
