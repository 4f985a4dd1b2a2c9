"""TEST-ONLY fault injection into trial workers (`FAULT_ENV`); read by both sides of the worker protocol."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

__all__ = ["FAULT_ENV", "FAULT_KINDS", "act_out", "injected_fault"]

#: TEST-ONLY hook. ``LMS_TUNER_FAULT="kill@3,oom@4,hang@5,raise@6,die@7,ok@*"``: in the worker of
#: measured trial N, ``kill`` SIGKILLs itself, ``oom`` reports a (simulated) out-of-memory result,
#: ``hang`` sleeps until the parent's --trial-timeout (``hangonce``: only in the trial's first process, the
#: next one is ``ok``), ``raise`` makes the model code raise,
#: ``ok`` returns a synthetic fitting result at once without TensorFlow (so a fault study takes
#: seconds), ``die`` SIGKILLs the *search process* (parent) while the worker runs (which then
#: hangs, so a worker that outlived its parent would be seen), ``rofs`` fails to write its result
#: as on a study folder turned read-only (a fault of the machine, not the config). ``*`` matches
#: every trial without its own entry; ``N.K`` (e.g. ``smaller@3.1``) targets the K-th re-measurement of
#: trial N in a fresh process (`tuner.backends.confirm`), where ``smaller`` returns a synthetic fitting result at
#: 3/4 of the batch asked for (as a process whose op order peaks higher would); ``fitsN`` (e.g. ``fits120@3.*``,
#: where ``N.*`` targets every re-measurement of trial N) acts out a config whose peak grows linearly to the
#: usable budget at batch N: its search finds N, a run at one batch fits when that is at most N; ``pathN`` is
#: ``fitsN`` whose in-process timed runs do not fit: its search's probes fit the batch asked for, the worker
#: reports them and ``infeasible`` (as a process whose history pushed every timed run over the budget), and
#: its runs at one batch are ``fitsN``'s. ``kind@N`` also acts in every fresh process of trial N that has no
#: ``N.K`` / ``N.*`` entry (a largest-batch trial is such processes by default, `tuner.backends.confirm`).
#: Never set it outside tests.
FAULT_ENV = "LMS_TUNER_FAULT"
FAULT_KINDS = ("kill", "oom", "hang", "hangonce", "raise", "ok", "die", "rofs", "smaller")


def injected_fault(trial: int | None, spec: str | None = None, *, confirm: int = 0) -> str | None:
    """The fault kind `LMS_TUNER_FAULT` injects into measured trial `trial` (its `confirm`-th re-measurement
    when > 0); None: none."""
    spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
    if not spec or trial is None:
        return None
    matches: dict[str, str] = {}
    for item in spec.split(","):
        kind, _, target = item.strip().partition("@")
        if kind in FAULT_KINDS or (kind.startswith(("fits", "path")) and kind[4:].isdigit()):
            matches.setdefault(target, kind)
    if confirm:  # a fresh process of trial N: its own entry, then N.*, then the trial's (all its processes)
        return (matches.get(f"{trial}.{confirm}") or matches.get(f"{trial}.*") or matches.get(str(trial))
                or matches.get("*"))
    return matches.get(str(trial)) or matches.get("*")


def act_out(fault: str, request: Any, events: Any) -> Any:
    """Test-only (`FAULT_ENV`): act out `fault` in a trial worker instead of measuring; no TensorFlow."""
    from .protocol import MeasureResult

    events.emit("fault", kind=fault)
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault in ("hang", "die"):  # "die": the parent kills itself; a worker that outlived it would finish
        time.sleep(3600)
    if fault == "hangonce" and events.path is not None:  # the trial's first process hangs, the next one is "ok"
        marker = Path(events.path).with_name("hung-once")
        if not marker.exists():
            marker.touch()
            time.sleep(3600)
    if fault == "raise":
        raise RuntimeError("injected fault: the model code raised")
    if fault == "oom":
        return MeasureResult(status="oom", reason="batch 1 does not fit: out of memory (injected fault)")
    batch = max(1, request.start_batch)  # "ok", "rofs", "smaller", "fitsN": a synthetic result
    if fault == "smaller":
        batch = max(1, batch * 3 // 4)
    if fault.startswith("path") and not request.fixed_batch:  # the probes fit, the timed runs after them do not
        return MeasureResult(status="infeasible", batch_size=0, throughput=0.0, peak_source="tf-bfc-cpu",
                             search={"batch": batch, "peak_bytes": request.usable_bytes, "converged": True,
                                     "probes": [{"batch": batch, "fits": True, "peak_bytes": request.usable_bytes,
                                                 "oom": False}]},
                             reason="the batches found by the search did not fit on their timed runs",
                             injected_fault=fault)
    if fault.startswith(("fits", "path")):  # peak = usable * batch / N
        limit = int(fault[4:])
        batch = batch if request.fixed_batch else min(batch, limit)  # a search finds N
        peak = request.usable_bytes * batch // limit
        if batch > limit:
            return MeasureResult(status="infeasible", batch_size=0, throughput=0.0, peak_device_bytes=peak,
                                 peak_source="tf-bfc-cpu", fits_budget=False, injected_fault=fault,
                                 reason=f"batch {batch} does not fit (injected fault {fault})")
        return MeasureResult(status="ok", batch_size=batch, throughput=100.0 + batch,
                             step_time_median_s=batch / (100.0 + batch), step_time_spread_s=0.0,
                             peak_device_bytes=peak, peak_source="tf-bfc-cpu", fits_budget=True,
                             injected_fault=fault)
    return MeasureResult(status="ok", batch_size=batch, throughput=100.0 + batch,
                         step_time_median_s=batch / (100.0 + batch), step_time_spread_s=0.0,
                         peak_device_bytes=request.usable_bytes // 2, peak_source="tf-bfc-cpu", fits_budget=True,
                         injected_fault=fault)
