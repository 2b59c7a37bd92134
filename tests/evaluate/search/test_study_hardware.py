"""study.json names the machines that measured the trials: each trial's job
records its own (a Slurm or Ray launcher runs jobs on other hosts than the
sweeper's), and the snapshot gathers them."""
from types import SimpleNamespace

import optuna
import pytest

from evaluate import results
from evaluate.search import speed, study_file, trial
from evaluate.search.sweeper import SearchSettings, snapshot
from quantize.common.errors import UserError

A = {"machine": "x86_64", "cpu": "EPYC", "cpu_count": 2, "accelerators": []}
B = {"machine": "x86_64", "cpu": "Xeon", "cpu_count": 8, "accelerators": ["NVIDIA H100"]}


def test_study_json_names_the_machines_its_trials_ran_on_twin_nodes_as_one(tmp_path):
    res = tmp_path / "res"
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    for number, hardware in enumerate([{"hostname": "n1", **A}, {"hostname": "n2", **A}, {"hostname": "g1", **B}]):
        study.tell(study.ask(), 1.0)
        study_file.write_trial_info(res, "s", number, {"recipe": f"r{number}", "hardware": hardware})
    study.tell(study.ask(), 2.0)   # a job that recorded no machine (from before machines were recorded)
    settings = SearchSettings(results_dir=res, space="", engine="", model="", objectives=None, study="s",
                              identity_values={})
    record = snapshot(study, settings, [study_file.Objective("v", "minimize", "")], url, 4)
    assert record.hardware == {results.machine_id(A): A, results.machine_id(B): B}
    assert [t.machine for t in record.trials] == [results.machine_id(A)] * 2 + [results.machine_id(B), None]
    written = study_file.read(study_file.write(res, record))
    assert written.hardware == record.hardware and written.trials == record.trials


def test_a_trials_record_names_the_machine_its_job_ran_on_even_when_it_fails(tmp_path, monkeypatch):
    host = speed.Host(hardware=B, versions={"torch": "2.9"})
    monkeypatch.setattr(speed.Host, "here", classmethod(lambda cls: host))

    def build(config, number, info):
        raise UserError("quantize failed")
    monkeypatch.setattr(trial, "build", build)
    config = SimpleNamespace(results_dir=tmp_path / "res", study="s")
    with pytest.raises(UserError):
        trial.run(config, 3)
    info = study_file.read_trial_info(config.results_dir, "s", 3)
    assert info["hardware"] == B and info["error"] == "quantize failed"
