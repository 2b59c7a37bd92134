from quantize.propose.cli import main
from quantize.common.hf_load import detach_stdin

if __name__ == "__main__":
    detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    main()
