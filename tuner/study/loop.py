"""The ask/tell loop: one Optuna study, a search space, an evaluation function, until enough configs are evaluated.

``--trials`` counts configs evaluated: when the sampler proposes a config the
study already has (same canonical key), the stored result is told at no cost,
and a random config not evaluated yet is queued next (without this, TPE
sometimes settled on a known point and missed the far end of the front; see
``benchmarks/tuner_efficiency.py``). Several threads (one per worker slot) and
several processes (a shared storage) may run it on one study.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import warnings
from typing import Any, Callable, Mapping

from ..budget import format_bytes
from ..errors import SearchError
from .progress import Progress
from ..policy.records import TrialRecord, corrections_warning, counted
from .recovery import owner, recover_stale_trials, start_heartbeat
from ..policy.space import DistinctCounter, SearchSpace

__all__ = ["optimize", "Interrupted"]

log = logging.getLogger(__name__)

_MAX_CONSECUTIVE_ERRORS = 3
_ASK_LOCK = threading.Lock()


class Interrupted(Exception):
    """Raised by an evaluation stopped at the search's time limit (or by `stop`): its trial is queued again."""


def _known_records(study: Any, space: SearchSpace) -> dict[str, tuple[int, dict[str, Any], list[float]]]:
    from optuna.trial import TrialState

    known = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        cfg = t.user_attrs.get("config")
        if isinstance(cfg, dict):
            try:
                key = space.table.canonical_key(space.table.from_dict(cfg))
                known.setdefault(key, (t.number, dict(t.user_attrs), list(t.values)))
            except ValueError:
                continue
    return known


def _best_postfix(study: Any) -> str:
    from optuna.trial import TrialState

    best_batch = best_thr = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("status") != "ok":
            continue
        b, thr = t.values
        best_batch = b if best_batch is None else max(best_batch, b)
        best_thr = thr if best_thr is None else max(best_thr, thr)
    if best_batch is None:
        return "no feasible config yet"
    return f"best batch {best_batch:.0f}, best {best_thr:.1f} samples/s"


def optimize(study: Any, space: SearchSpace, evaluate: Callable[[Any, Any], TrialRecord], *,
             n_trials: int, deadline: float | None, progress: Progress, desc: str,
             explore_on_repeat: bool = True, seed: int | None = None,
             stop: threading.Event | None = None, own_progress: bool = True,
             ask_lock: Callable[[], Any] | None = None, stopped: dict[str, str] | None = None) -> int:
    """Ask/tell until `n_trials` configs are evaluated, the space is exhausted, or the deadline passes.

    A config the study has already evaluated (same `canonical_key`) is told
    the stored result at once (``duplicate_of``) and is not counted: the trial
    budget pays for evaluations. With `explore_on_repeat`, each repeat also
    queues one config not evaluated yet, drawn at random from the space: a
    sampler that keeps returning to a known point gets a fresh one instead
    (on the ResNet-50 benchmark this is what finds the far end of the front).

    Several threads may run it on one study (one per GPU); `stop` ends them all
    (each re-queues the trial it was running). With ``own_progress=False`` the
    caller starts and closes `progress`. Several processes may share the study
    too: `ask_lock` (e.g. `tuner.study.storage.storage_lock`) makes their ``ask`` one
    at a time, so two never pop the same queued trial. Why the loop ended is
    written to ``stopped["reason"]``: ``trials`` (done), ``others`` (the last
    trials are running in other workers or processes), ``time limit``,
    ``space`` (every config evaluated), ``repeats``, ``stop``.

    Returns:
        configs evaluated by this call.
    """
    from optuna.trial import TrialState

    def why(reason: str) -> None:
        if stopped is not None:
            stopped["reason"] = reason

    done = sum(1 for t in study.get_trials(deepcopy=False) if counted(t))
    known = _known_records(study, space)
    space_size = DistinctCounter(space)
    repeats = 0
    rng = random.Random(seed)
    if own_progress:
        progress.start(total=n_trials, initial=done, desc=desc)
    progress.note(_best_postfix(study))
    ran = errors = 0
    durations: list[float] = []
    try:
        while True:
            # Other processes may share the study (journal / database storage): count what is there now.
            if recover_stale_trials(study):  # a worker process on this host (or, by heartbeat, anywhere) died
                known.update({k: v for k, v in _known_records(study, space).items() if k not in known})
            done, running = _slots(study.get_trials(deepcopy=False))
            known.update({k: v for k, v in _known_records(study, space).items() if k not in known})
            if done + running >= n_trials or (stop is not None and stop.is_set()):
                why("stop" if stop is not None and stop.is_set() else "trials" if done >= n_trials else "others")
                break
            everything = space_size.at_most(len(known))
            if everything or repeats > max(50, 2 * n_trials):
                log.info("every config of the search space has been evaluated (%d)" if everything
                         else "the sampler keeps proposing evaluated configs; stopping at %d", len(known))
                why("space" if everything else "repeats")
                break
            if deadline is not None:
                left = deadline - time.monotonic()
                typical = sorted(durations)[len(durations) // 2] if durations else 0.0
                if left <= 0 or left < typical:
                    log.warning("time limit: %d trial(s) run now, %d of %d done; run the same command again "
                                "to continue", ran, done, n_trials)
                    why("time limit")
                    break
            t0 = time.monotonic()
            # threads of one process, and processes sharing a file storage, must not pop the same queued trial
            with _ASK_LOCK, (ask_lock() if ask_lock is not None else contextlib.nullcontext()), \
                    warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Heartbeat of storage")  # ours runs in _heartbeat
                # count again under the lock: another worker may have taken the last slot since the check above
                full = sum(_slots(study.get_trials(deepcopy=False))) >= n_trials
                if not full:
                    trial = study.ask()
                    trial.set_user_attr("owner", owner())
            if full:
                why("others")
                break
            config = space.suggest(trial)
            key = space.table.canonical_key(config)
            heartbeat = start_heartbeat(study, trial)
            try:
                earlier = None
                if key not in known:  # another worker may be running it, or have finished it since the loop began
                    earlier = _running_same_config(study, space, trial, key)  # RUNNING first, then COMPLETE:
                    if earlier is None:  # a trial finishing in between is seen by one of the two reads
                        known.update({k: v for k, v in _known_records(study, space).items() if k not in known})
                if key in known:
                    number, attrs, values = known[key]
                    for name, value in attrs.items():
                        if name not in ("owner", "retry_of"):
                            trial.set_user_attr(name, value)
                    trial.set_user_attr("duplicate_of", number)
                    trial.set_constraint("memory", float(attrs.get("constraint", [0.0])[0]))
                    study.tell(trial, values)
                    # said at INFO: the trial numbers in the log then run on without a gap
                    log.info("trial %d: same effective config as trial %d; answered from the study, not counted",
                             trial.number, number)
                    repeats += 1
                    if explore_on_repeat:
                        _queue_unexplored(study, space, known, rng)
                    continue
                if earlier is not None:
                    # another thread or process is evaluating this config now: the earlier trial keeps it
                    trial.set_user_attr("status", "skipped")
                    trial.set_user_attr("reason", f"same config as trial {earlier}, running in another worker")
                    trial.set_user_attr("concurrent_duplicate_of", earlier)
                    study.tell(trial, state=TrialState.FAIL)
                    log.info("trial %d: same config as trial %d, running in another worker; skipped", trial.number,
                             earlier)
                    repeats += 1
                    if explore_on_repeat:
                        _queue_unexplored(study, space, known, rng)
                    continue
                else:
                    trial.set_user_attr("evaluating", True)
                    record = evaluate(config, trial)
                    for name, value in record.user_attrs().items():
                        trial.set_user_attr(name, value)
                    trial.set_constraint("memory", float(record.constraint))
                    if record.requeue:
                        _requeue(study, trial, record.reason, status=record.status)
                        errors += 1
                        log.warning("trial %d: %s", trial.number, record.reason)
                        if errors >= _MAX_CONSECUTIVE_ERRORS:
                            raise SearchError(f"{errors} trials in a row failed; last: {record.reason}")
                    elif record.failed:
                        study.tell(trial, state=TrialState.FAIL)
                        errors += 1
                        log.warning("trial %d failed: %s", trial.number, record.reason)
                        if errors >= _MAX_CONSECUTIVE_ERRORS:
                            raise SearchError(f"{errors} trials in a row failed; last: {record.reason}")
                    else:
                        errors = 0
                        study.tell(trial, [float(record.batch_size), float(record.throughput)])
                        known[key] = (trial.number, record.user_attrs(),
                                      [float(record.batch_size), float(record.throughput)])
                        _log_record(trial.number, record, f"[{done + 1}/{n_trials}]", space)
            except Interrupted:
                _requeue(study, trial, "stopped at the search's time limit during this trial; queued again")
                why("stop" if stop is not None and stop.is_set() else "time limit")
                break
            except (KeyboardInterrupt, SystemExit):
                _requeue(study, trial, "interrupted; queued again")
                raise
            except SearchError:
                raise
            except Exception as exc:
                trial.set_user_attr("status", "error")
                trial.set_user_attr("reason", f"{type(exc).__name__}: {exc}")
                study.tell(trial, state=TrialState.FAIL)
                raise
            finally:
                heartbeat.join()
            durations.append(time.monotonic() - t0)
            ran += 1
            progress.advance(postfix=_best_postfix(study))
    finally:
        if own_progress:
            progress.close()
    return ran


def _slots(trials: list[Any]) -> tuple[int, int]:
    """(trials that count toward ``--trials``, trials running in a worker that claimed them).

    Running: other threads / processes; a trial with no owner yet was only just
    asked for, or its process died between ask() and claiming it: it must not
    hold a slot (see `tuner.study.recovery.ORPHAN_AFTER_S`).
    """
    from optuna.trial import TrialState

    return (sum(1 for t in trials if counted(t)),
            sum(1 for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("owner")))


def _running_same_config(study: Any, space: SearchSpace, trial: Any, key: str) -> int | None:
    """The number of an earlier RUNNING trial drawing the same config (another worker), else None.

    Each worker writes its params before it checks and marks its trial
    ``evaluating`` right after; a trial marked so, or with a lower number,
    keeps the config. Of two workers that draw one config at once one
    evaluates it, except in the few milliseconds between another worker's
    check and its mark (then both run it: the second result is kept as a repeat).
    """
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # a queued trial (a warm start, which each process may have queued) is known from its
        # fixed params as soon as it is popped, before its worker has written them
        params = t.params if space.complete(t.params) else t.system_attrs.get("fixed_params") or {}
        if t.number == trial.number or not space.complete(params):
            continue
        if t.number > trial.number and not t.user_attrs.get("evaluating"):
            continue
        try:
            if space.table.canonical_key(space.config_of(params)) == key:
                return t.number
        except (ValueError, KeyError):
            continue
    return None


def _queue_unexplored(study: Any, space: SearchSpace, known: Mapping[str, Any], rng: random.Random) -> None:
    """Queue one random config of the space that is neither evaluated nor already queued."""
    from optuna.trial import TrialState

    waiting = {space.table.canonical_key(space.config_of(t.system_attrs["fixed_params"]))
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
               if "n_tensors" in t.system_attrs.get("fixed_params", {})}
    fresh = [p for p in space.grid() if space.table.canonical_key(space.config_of(p)) not in known
             and space.table.canonical_key(space.config_of(p)) not in waiting]
    if fresh:
        study.enqueue_trial(rng.choice(fresh), user_attrs={"explore": True})


def _requeue(study: Any, trial: Any, reason: str, *, status: str = "interrupted") -> None:
    from optuna.trial import TrialState

    try:
        trial.set_user_attr("status", status)
        trial.set_user_attr("reason", reason)
        params = dict(trial.params)
        kept = {k: v for k, v in trial.user_attrs.items() if k in ("warm_start", "from_screen", "explore")}
        study.tell(trial, state=TrialState.FAIL)
        study.enqueue_trial(params, user_attrs={**kept, "retry_of": trial.number})
    except Exception as exc:  # the next run recovers it as a stale trial
        log.debug("could not re-queue trial %d: %s", trial.number, exc)


def _log_record(number: int, r: TrialRecord, count: str, space: SearchSpace) -> None:
    kind = "measured" if r.measured else "predicted"
    cfg = space.table.short_label(r.config)
    if r.status == "ok":
        host = r.extra.get("host_copies_peak_bytes", r.extra.get("peak_host_bytes"))
        log.info("trial %d %s: %s -> batch %d, %.1f samples/s, peak %s%s (%s, %s)", number, count, cfg, r.batch_size,
                 r.throughput, format_bytes(r.peak_device_bytes),
                 f", host {format_bytes(host)}" + (" (host-limited)" if r.extra.get("limited_by") == "host" else "")
                 if host else "", kind, r.peak_source)
    else:
        log.info("trial %d %s: %s -> %s (%s): %s", number, count, cfg, r.status, kind, r.reason)
    corrected = corrections_warning(r.extra.get("lms_summary"))
    if corrected:
        log.info("trial %d: %s", number, corrected)
