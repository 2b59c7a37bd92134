"""hydra-joblib-launcher's `joblib`, telling quantbench's failure summary
where each job ran: a job whose hydra.sweep.dir or hydra.sweep.subdir puts
it outside the sweep folder is listed too when it fails
(quantize.common.jobs.note_jobs). Use it through the preset:
hydra/launcher=local_parallel."""
from typing import Sequence

try:
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
except ImportError:  # not installed: nothing to extend, and no warning on every command
    JoblibLauncher = None

if JoblibLauncher is not None:
    class ParallelLauncher(JoblibLauncher):
        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
            from quantize.common.jobs import note_jobs
            returns = super().launch(job_overrides, initial_job_idx)
            note_jobs(returns)
            return returns
