"""Command-line rewriting shared by both stages (quantize/common/config.py)."""
import pytest

from quantize.common.config import open_pass_through_keys


@pytest.mark.parametrize("arg, expected", [
    ("engine.args.enable_prefix_caching=false", "++engine.args.enable_prefix_caching=false"),
    ("engine.env.OMP_NUM_THREADS=2", "++engine.env.OMP_NUM_THREADS=2"),
    ("lm_eval.model_args.max_num_seqs=8", "++lm_eval.model_args.max_num_seqs=8"),
    ("engine.args.max_num_seqs=8,16", "++engine.args.max_num_seqs=8,16"),   # a sweep stays a sweep
    ("engine=hf", "engine=hf"),                                               # a group choice is left alone
    ("runs=3", "runs=3"),
    ("++engine.args.seed=1", "++engine.args.seed=1"),                         # already explicit
])
def test_pass_through_keys_accept_any_name(arg, expected):
    assert open_pass_through_keys([arg]) == [expected]
