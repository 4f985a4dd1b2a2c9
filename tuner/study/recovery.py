"""Trials left RUNNING by a process that is gone, and heartbeats: the only module on Optuna's private APIs.

Optuna has no public API to read a trial's storage id, its heartbeat, or to
set a trial's state from outside its process, so those calls live here, and
only here (``study._storage``, ``study._study_id``, ``trial._trial_id``,
``optuna.storages._heartbeat``).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from typing import Any

__all__ = ["recover_stale_trials", "start_heartbeat", "owner", "process_gone", "ORPHAN_AFTER_S"]

log = logging.getLogger(__name__)

# A trial is claimed (user attr "owner") right after study.ask(); one still unclaimed after this
# long belongs to a process that died in between (on SQLite or a journal there is no heartbeat).
ORPHAN_AFTER_S = 30.0


def owner() -> dict[str, Any]:
    """Who runs a trial: this host and process (user attr ``owner``)."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def process_gone(who: Any) -> bool:
    """Whether the process `who` (an `owner` record) is known to be gone: it ran on this host and has ended.

    A process on another host cannot be checked from here: False.
    """
    if not isinstance(who, dict) or who.get("host") != socket.gethostname():
        return False
    try:
        pid = int(who.get("pid", -1))
    except (TypeError, ValueError):
        return False
    return 0 < pid != os.getpid() and not _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_by_heartbeat(study: Any) -> set[int]:
    """Trial ids whose heartbeat (database storages, `tuner.study.storage.HEARTBEAT_INTERVAL_S`) is older than the grace
    period."""
    from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

    storage = study._storage
    if not isinstance(storage, BaseHeartbeat) or not is_heartbeat_enabled(storage):
        return set()
    try:
        return set(storage._get_stale_trial_ids(study._study_id))
    except Exception as exc:  # recovery is best effort; the next check tries again
        log.debug("heartbeat check failed: %s", exc)
        return set()


def recover_stale_trials(study: Any) -> int:
    """Fail RUNNING trials whose search process is gone, and queue their params again.

    A trial is stale when its owner ran on this host and that process is gone,
    or (database storages, any host) its heartbeat is older than the grace
    period. Several processes may check at once: only the one whose FAIL is
    stored re-queues the params, so a trial is retried once.
    """
    import optuna
    from optuna.trial import TrialState

    recovered = 0
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return 0
    stale_ids = _stale_by_heartbeat(study)
    now = datetime.datetime.now()
    for t in running:
        owned = t.user_attrs.get("owner") or {}
        local_dead = owned.get("host") == socket.gethostname() and not _pid_alive(int(owned.get("pid", -1)))
        orphan = (not owned and t.datetime_start is not None
                  and (now - t.datetime_start).total_seconds() > ORPHAN_AFTER_S)
        if not (local_dead or orphan or t._trial_id in stale_ids):
            continue
        why = ("its search process ended" if local_dead else
               "its search process ended before claiming it" if orphan else
               "its search process stopped sending heartbeats")
        try:
            trial = optuna.trial.Trial(study, t._trial_id)
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("reason", f"{why} during this trial; it was queued again")
            if not study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                continue
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
            continue  # another process recovered (or finished) it first
        if t.params:
            study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
        recovered += 1
    if recovered:
        log.info("%d trial(s) left running by a process that is gone were queued again", recovered)
    return recovered


def start_heartbeat(study: Any, trial: Any) -> Any:
    """Start Optuna's heartbeat thread for `trial` when the storage has heartbeats (a no-op thread otherwise)."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    thread = get_heartbeat_thread(trial._trial_id, study._storage)
    thread.start()
    return thread
