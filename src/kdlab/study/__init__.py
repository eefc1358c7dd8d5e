"""The study runner (``kdlab study``): ``plan`` (grid, jobs, completeness), ``kernels`` (warm
kernels, papermill, workers, Ray) and ``runner`` (``run_study`` as named phases)."""
from .kernels import papermill_run
from .plan import expand_grid, notebook_finished, run_is_complete, schedule, study_dir_of, study_model_paths
from .runner import run_study

__all__ = ["expand_grid", "notebook_finished", "papermill_run", "run_is_complete", "run_study", "schedule",
           "study_dir_of", "study_model_paths"]
