"""The Optuna studies of a search: objectives, samplers, creating a study and its warm start."""

from __future__ import annotations

from typing import Any

__all__ = ["OBJECTIVES", "DIRECTIONS", "SCREEN_SUFFIX", "make_sampler", "create_study", "queue_warm_start"]

OBJECTIVES = ("batch_size", "throughput")
DIRECTIONS = ("maximize", "maximize")
#: The simulated screening study of a measured search is ``<study><SCREEN_SUFFIX>``.
SCREEN_SUFFIX = ".simulated"


def make_sampler(name: str, *, seed: int | None, n_startup_trials: int = 10) -> Any:
    """TPE (multivariate, default), NSGA-II, or random; all read the trials' constraints."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                              n_startup_trials=n_startup_trials)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=20)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; choose tpe, nsga2 or random")


def create_study(name: str, storage: Any, sampler: Any) -> Any:
    """Create the study `name`, or load it if it exists (two objectives, both maximised)."""
    import optuna

    return optuna.create_study(study_name=name, storage=storage, directions=list(DIRECTIONS), sampler=sampler,
                               load_if_exists=True)


def queue_warm_start(study: Any, space: Any, *, ladder: int = 0) -> None:
    """Queue `SearchSpace.warm_start_params` (no LMS, TFLMS's defaults, ...) unless the study has them.

    With `ladder` (a simulated screen, where a trial costs a simulation) also
    up to that many of `SearchSpace.ladder_params`: the ``n_tensors`` levels of the warm starts.
    Called on every start (under `tuner.storage.storage_lock`), so a search
    stopped between creating the study and queueing them still gets them.
    """
    for params in space.warm_start_params():
        study.enqueue_trial(params, user_attrs={"warm_start": True}, skip_if_exists=True)
    for params in space.ladder_params()[:max(0, ladder)]:
        study.enqueue_trial(params, user_attrs={"ladder": True}, skip_if_exists=True)
