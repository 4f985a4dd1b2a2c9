"""A trial whose process died between study.ask() and claiming it (no "owner" attr)."""

from __future__ import annotations

import optuna
import pytest

from tuner.study import recovery
from tuner.policy.records import counted


def _study_with_unclaimed_trial() -> tuple[optuna.Study, int]:
    study = optuna.create_study(directions=["maximize", "maximize"])
    trial = study.ask()  # the process "dies" here: no owner attr, no params
    return study, trial.number


def test_a_fresh_unclaimed_trial_is_left_alone():
    study, number = _study_with_unclaimed_trial()
    assert recovery.recover_stale_trials(study) == 0
    assert study.trials[number].state == optuna.trial.TrialState.RUNNING


def test_an_old_unclaimed_trial_is_recovered(monkeypatch: pytest.MonkeyPatch):
    study, number = _study_with_unclaimed_trial()
    monkeypatch.setattr(recovery, "ORPHAN_AFTER_S", -1.0)  # "old": started before the grace period
    assert recovery.recover_stale_trials(study) == 1
    t = study.trials[number]
    assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs["status"] == "interrupted"
    assert "before claiming it" in t.user_attrs["reason"]
    assert not counted(t)
    # it had drawn no params: nothing is queued again
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))
