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


def test_group_options_on_hydra_search_path_are_known(tmp_path):
    import pytest

    from quantize.common.config import check_group_options
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "mine.yaml").write_text("name: mine\n")
    check_group_options(["engine=mine", f"hydra.searchpath=[file://{tmp_path}]"])  # no exit
    with pytest.raises(SystemExit) as e:
        check_group_options(["engine=mine"])
    assert e.value.code == 2
