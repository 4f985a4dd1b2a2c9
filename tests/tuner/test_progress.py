"""The search's one progress bar: phases and the time left, estimated from what this search has timed so far."""

from __future__ import annotations

import pytest

from tuner.study.progress import PHASES, PROCESSES_PER_TRIAL, Progress


def test_time_left_counts_simulations_trials_processes_and_repeats() -> None:
    p = Progress(disabled=True)
    assert p.remaining_s() is None  # nothing planned, nothing timed: no guess
    p.plan(screen=4, trials=2, repeats=2, fresh=True)
    p.phase("screening", total=4)
    assert p.remaining_s() is None  # no simulation ended yet
    p._last -= 3.0  # a simulation that took 3 s (the clock the bar reads between advances)
    p.advance()
    assert p.remaining_s() is None  # 3 simulations at ~3 s, but no fresh process timed yet: no guess for the rest
    p.process_done(40.0)  # a process of the baseline, measured beside the screen
    assert p.remaining_s() == pytest.approx(3 * 3.0 + (2 + 2 * PROCESSES_PER_TRIAL - 1) * 40.0, abs=0.1)
    p.phase("measuring", total=2)
    p.process_done(20.0)
    mean = 30.0
    assert p.remaining_s() == (2 + 2 * PROCESSES_PER_TRIAL - 2) * mean
    p.advance()  # a trial done: its processes no longer count, one trial fewer
    assert p.remaining_s() == (2 + PROCESSES_PER_TRIAL) * mean
    p.advance()
    p.phase("confirming")
    p.process_done(30.0)
    assert p.remaining_s() == 1 * 30.0
    assert PHASES == ("tracing", "screening", "measuring", "confirming")
