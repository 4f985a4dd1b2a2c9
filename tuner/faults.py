"""TEST-ONLY fault injection into trial workers (`FAULT_ENV`); read by both sides of the worker protocol."""

from __future__ import annotations

import os

__all__ = ["FAULT_ENV", "FAULT_KINDS", "injected_fault"]

#: TEST-ONLY hook. ``LMS_TUNER_FAULT="kill@3,oom@4,hang@5,raise@6,die@7,ok@*"``: in the worker of
#: measured trial N, ``kill`` SIGKILLs itself, ``oom`` reports a (simulated) out-of-memory result,
#: ``hang`` sleeps until the parent's --trial-timeout (``hangonce``: only in the trial's first process, the
#: next one is ``ok``), ``raise`` makes the model code raise,
#: ``ok`` returns a synthetic fitting result at once without TensorFlow (so a fault study takes
#: seconds), ``die`` SIGKILLs the *search process* (parent) while the worker runs (which then
#: hangs, so a worker that outlived its parent would be seen), ``rofs`` fails to write its result
#: as on a study folder turned read-only (a fault of the machine, not the config). ``*`` matches
#: every trial without its own entry; ``N.K`` (e.g. ``smaller@3.1``) targets the K-th re-measurement of
#: trial N in a fresh process (`tuner.confirm`), where ``smaller`` returns a synthetic fitting result at
#: 3/4 of the batch asked for (as a process whose op order peaks higher would); ``fitsN`` (e.g. ``fits120@3.*``,
#: where ``N.*`` targets every re-measurement of trial N) acts out a config whose peak grows linearly to the
#: usable budget at batch N: its search finds N, a run at one batch fits when that is at most N; ``pathN`` is
#: ``fitsN`` whose in-process timed runs do not fit: its search's probes fit the batch asked for, the worker
#: reports them and ``infeasible`` (as a process whose history pushed every timed run over the budget), and
#: its runs at one batch are ``fitsN``'s. ``kind@N`` also acts in every fresh process of trial N that has no
#: ``N.K`` / ``N.*`` entry (a largest-batch trial is such processes by default, `tuner.confirm`).
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
