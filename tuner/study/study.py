"""The Optuna studies of a search: objectives, samplers, claiming a study, its warm start.

Every study the tuner makes carries its settings record, the user attribute
``"tuner"`` (`TUNER_ATTR`): the tuner's marker. It is written in one write,
under the storage's lock (`tuner.study.storage.storage_lock`), right after the study
is created and before any work (tracing, trials), so a second search started
at the same moment with other settings is refused, never merged in
(`claim_study`). A study without the marker (a plain Optuna study, another
tool's) is never taken over, and a study's role (``main``, or ``screen`` for the
simulated screening study ``<study>.simulated`` of a measured search) must be
the one asked for.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import BadInput
from .record import StudyRecord

__all__ = ["OBJECTIVES", "DIRECTIONS", "SCREEN_SUFFIX", "TUNER_ATTR", "make_sampler", "create_study",
           "queue_warm_start", "tuner_record", "study_record", "claim_problem", "claim_study", "claim_screen_study", "setup_finished",
           "foreign_study", "screens_for"]

OBJECTIVES = ("batch_size", "throughput")
DIRECTIONS = ("maximize", "maximize")
#: The simulated screening study of a measured search is ``<study><SCREEN_SUFFIX>``.
SCREEN_SUFFIX = ".simulated"
#: The study attribute holding the tuner's settings record (its marker on the studies it owns).
TUNER_ATTR = "tuner"
#: In a settings record: the process setting the study up, until its setup (trace, budget, space) is stored.
_SETUP = "setup"


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
    Called on every start (under `tuner.study.storage.storage_lock`), so a search
    stopped between creating the study and queueing them still gets them.
    """
    for params in space.warm_start_params():
        study.enqueue_trial(params, user_attrs={"warm_start": True}, skip_if_exists=True)
    for params in space.ladder_params()[:max(0, ladder)]:
        study.enqueue_trial(params, user_attrs={"ladder": True}, skip_if_exists=True)


def tuner_record(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The tuner's settings record among a study's user attributes, as stored (None: not a tuner study)."""
    record = attrs.get(TUNER_ATTR)
    return dict(record) if isinstance(record, dict) else None


def study_record(attrs: Mapping[str, Any]) -> StudyRecord | None:
    """The tuner's settings record, typed (`tuner.study.record.StudyRecord`; None: not a tuner study).

    Raises:
        ValueError: a field of the record has the wrong type (the message names it).
    """
    record = tuner_record(attrs)
    return None if record is None else StudyRecord.from_dict(record)


def setup_finished(record: Mapping[str, Any] | None) -> bool:
    """Whether a settings record is complete (its search stored the budget and the space)."""
    return bool(record) and _SETUP not in record and "space" in record


def _role(study: Any, record: Mapping[str, Any]) -> str:
    return str(study.user_attrs.get("role") or record.get("role") or "main")


def _abandoned(study: Any, record: Mapping[str, Any]) -> bool:
    """A record whose setup never finished: its process (on this host) is gone, and no trial was started.

    Such a study takes the next search's settings: a first run that failed or was killed while
    tracing must not fix the settings of a study that has nothing in it.
    """
    from .recovery import process_gone

    return (_SETUP in record and process_gone(record[_SETUP])
            and not study.get_trials(deepcopy=False))


def _adoptable(study: Any) -> bool:
    """An unmarked study the tuner itself made and could not mark (it died in between): empty, our directions."""
    directions = tuple(d.name.lower() for d in study.directions)
    return not study.user_attrs and not study.get_trials(deepcopy=False) and directions == DIRECTIONS


def foreign_study(study: Any, *, display: str) -> str:
    """Why `study` is not one lms-tuner made ("" when it is, or when it is an empty one it may adopt).

    A search does not take such a study over, and ``best``, ``report`` and ``list`` do not read its
    trials as the tuner's records (their attributes may hold anything).
    """
    if tuner_record(study.user_attrs) is not None or _adoptable(study):
        return ""
    n = len(study.get_trials(deepcopy=False))
    return (f"study {study.study_name!r} in {display} was not made by lms-tuner ({n} trial{'s' * (n != 1)}, "
            "no tuner settings)")


def screens_for(study: Any, main: str) -> bool:
    """Whether `study` is the simulated screening study a measured search of study `main` made."""
    record = tuner_record(study.user_attrs)
    return (record is not None and _role(study, record) == "screen"
            and (study.user_attrs.get("screen_of") or record.get("screen_of")) == main)


def _ownership(study: Any, *, role: str, main: str, display: str) -> str:
    """Why `study` may not serve as this search's `role` study ("" when it may)."""
    name = study.study_name
    record = tuner_record(study.user_attrs)
    if record is None:
        foreign = foreign_study(study, display=display)
        if not foreign:
            return ""
        why = f" (a measured search of study {main!r} screens in {name!r})" if role == "screen" else ""
        return f"{foreign} and is not taken over{why}; use another --study name"
    actual = _role(study, record)
    screen_of = study.user_attrs.get("screen_of") or record.get("screen_of")
    if role == "main" and actual == "screen":
        return (f"study {name!r} in {display} is the simulated screening study of study {screen_of!r}; use "
                "another --study name")
    if role == "screen" and (actual != "screen" or screen_of != main):
        return (f"study {name!r} in {display} is a study of its own, not the screening study of study {main!r} "
                f"(a measured search screens in '<study>{SCREEN_SUFFIX}'); use another --study name")
    return ""


def claim_problem(storage: Any, name: str, *, conflict: Callable[[Mapping[str, Any]], str], screened: bool,
                  display: str) -> str:
    """Why a search may not use study `name` in `storage` ("" when it may); reads only.

    Args:
        conflict: how the search's settings differ from a stored record ("" when they match).
        screened: the search also uses the screening study ``<name>.simulated`` (a measured backend).
        display: the storage, for messages (password masked).
    """
    import optuna

    names = set(optuna.study.get_all_study_names(storage=storage))
    if name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        problem = _ownership(study, role="main", main=name, display=display)
        if problem:
            return problem
        record = tuner_record(study.user_attrs)
        if record is not None and not _abandoned(study, record):
            problem = conflict(record)
            if problem:
                return problem
    if screened and name + SCREEN_SUFFIX in names:
        screen = optuna.load_study(study_name=name + SCREEN_SUFFIX, storage=storage)
        return _ownership(screen, role="screen", main=name, display=display)
    return ""


def claim_study(name: str, storage: Any, sampler: Any, *, record: Mapping[str, Any],
                conflict: Callable[[Mapping[str, Any]], str], screened: bool, display: str) -> Any:
    """Create or load the main study `name` with its settings record; call under `tuner.study.storage.storage_lock`.

    A new study (or one whose setup was abandoned, `_abandoned`) gets `record`, marked as being set
    up by this process, in one write; an existing one is checked against it (`conflict`).

    Raises:
        BadInput: `claim_problem` (another study of that name, settings that differ).
    """
    from .recovery import owner

    problem = claim_problem(storage, name, conflict=conflict, screened=screened, display=display)
    if problem:
        raise BadInput(problem)
    study = create_study(name, storage, sampler)
    stored = tuner_record(study.user_attrs)
    if stored is None or _abandoned(study, stored):
        study.set_user_attr(TUNER_ATTR, {**record, "role": "main", _SETUP: owner()})
        study.set_user_attr("role", "main")
    return study


def claim_screen_study(name: str, storage: Any, sampler: Any, *, main: str, record: Mapping[str, Any],
                       display: str) -> Any:
    """Create or load the screening study `name` of study `main` (refused when it is another study)."""
    import optuna

    if name in optuna.study.get_all_study_names(storage=storage):
        problem = _ownership(optuna.load_study(study_name=name, storage=storage), role="screen", main=main,
                             display=display)
        if problem:
            raise BadInput(problem)
    study = create_study(name, storage, sampler)
    if tuner_record(study.user_attrs) is None:
        study.set_user_attr(TUNER_ATTR, {**record, "role": "screen", "screen_of": main})
        study.set_user_attr("role", "screen")
        study.set_user_attr("screen_of", main)
    return study
