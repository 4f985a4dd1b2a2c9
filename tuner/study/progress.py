"""Progress on stderr: one bar across the whole search (phase, what runs now, time left), and log lines below it."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["Progress", "setup_logging", "PHASES"]

log = logging.getLogger(__name__)

#: The phases of a search, in order (`Progress.phase`).
PHASES = ("tracing", "screening", "measuring", "confirming")
#: Fresh processes a trial's bracket takes, for the estimate (ResNet-50 64x64: 4-6; small models 3-5).
PROCESSES_PER_TRIAL = 5


class _TqdmHandler(logging.Handler):
    """Writes log records above the bar (tqdm.write), to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never raise
            self.handleError(record)


def setup_logging(*, quiet: bool = False, verbose: bool = False) -> None:
    """INFO for the tuner by default, WARNING with `quiet`, DEBUG with `verbose`; Optuna's own logs quieter."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(message)s" if not verbose else "%(asctime)s %(name)s: %(message)s",
                                           datefmt="%H:%M:%S"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("tuner").setLevel(level)
    # The library's own INFO (planner, NVML probing) is detail for -v.
    logging.getLogger("lms").setLevel(logging.DEBUG if verbose else logging.WARNING)
    try:
        import optuna

        optuna.logging.disable_default_handler()
        optuna.logging.enable_propagation()
        optuna.logging.set_verbosity(logging.DEBUG if verbose else logging.WARNING)
    except ImportError:  # pragma: no cover - optuna is a dependency
        pass


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class Progress:
    """One bar on stderr for the whole search, or nothing when `disabled`.

    The bar shows the phase (`PHASES`: tracing, screening, measuring,
    confirming), its count (trials, processes), what runs now, and the time left,
    estimated from what this search has timed so far: the screen's simulations,
    the fresh processes (each remaining measured trial counted as
    `PROCESSES_PER_TRIAL` of them, each repeat as one). Until a first fresh
    process has ended it says so rather than guess. By default the bar is shown
    only when stderr is a terminal: in a log file the INFO lines carry the same
    (each phase's start logs the estimate).
    """

    def __init__(self, *, disabled: bool | None = None) -> None:
        self.disabled = (not sys.stderr.isatty()) if disabled is None else disabled
        self._bar: Any = None
        self._phase = ""
        self._count = (0, 0)
        self._postfix = ""
        self._activity = ""
        self._started = time.monotonic()
        self._plan: dict[str, int] = {}
        self._sim_s: list[float] = []
        self._process_s: list[float] = []
        self._trial_processes = 0  # fresh processes of the measured trial running now
        self._last = time.monotonic()

    # ---- the plan and the estimate ---------------------------------------------------------------
    def plan(self, *, screen: int = 0, trials: int = 0, repeats: int = 0, fresh: bool = False) -> None:
        """What is left to do: simulated screening trials, measured trials, repeat processes (`--confirm`)."""
        self._plan = {"screen": max(0, screen), "trials": max(0, trials), "repeats": max(0, repeats),
                      "fresh": int(fresh)}

    def remaining_s(self) -> float | None:
        """Seconds left, estimated from the durations seen so far (None: nothing timed yet to estimate from)."""
        p = self._plan
        if not p:
            return None
        sim = sum(self._sim_s) / len(self._sim_s) if self._sim_s else None
        proc = sum(self._process_s) / len(self._process_s) if self._process_s else None
        left = 0.0
        if p.get("screen"):
            if sim is None:
                return None
            left += p["screen"] * sim
        per_trial = PROCESSES_PER_TRIAL if p.get("fresh") else 1
        # the trial running now has used some of its processes (at least one is left while it runs)
        started = min(self._trial_processes, per_trial - 1) if p.get("trials") and p.get("fresh") else 0
        processes = p.get("repeats", 0) + p.get("trials", 0) * per_trial - started
        if processes:
            if proc is None:
                return None
            left += processes * proc
        return left

    def _estimate(self) -> str:
        left = self.remaining_s()
        if not self._plan:
            return ""
        if left is None:
            return "time left: estimated once a first " + ("simulation" if self._plan.get("screen")
                                                          else "fresh process") + " has ended"
        return f"about {_minutes(left)} left (estimated)"

    # ---- phases ----------------------------------------------------------------------------------
    def phase(self, name: str, *, total: int = 0, initial: int = 0) -> None:
        """Enter phase `name` (one of `PHASES`) with `total` items (trials, processes), `initial` done."""
        self._phase = name
        if name in PHASES:  # the phases before it are over
            for done, key in zip(PHASES[1:3], ("screen", "trials")):
                if PHASES.index(name) > PHASES.index(done) and key in self._plan:
                    self._plan[key] = 0
        self._count = (min(initial, total), total)
        self._activity = ""
        self._last = time.monotonic()
        estimate = self._estimate()
        log.info("[%s]%s", name, f" {estimate}" if estimate else "")
        self._draw()

    def start(self, *, total: int, initial: int, desc: str) -> None:
        """`tuner.study.loop.optimize`'s hook: a loop over `total` trials (`desc`: screen or measured trials)."""
        self.phase("screening" if "screen" in desc else "measuring", total=total, initial=initial)

    def advance(self, n: int = 1, *, postfix: str = "") -> None:
        done, total = self._count
        self._count = (min(total, done + n), total) if total else (done + n, total)
        now = time.monotonic()
        if self._phase == "screening":
            self._sim_s.append(now - self._last)
            self._plan["screen"] = max(0, self._plan.get("screen", 0) - n)
        elif self._phase == "measuring":
            self._plan["trials"] = max(0, self._plan.get("trials", 0) - n)
            self._trial_processes = 0
        self._last = now
        if postfix:
            self._postfix = postfix
        self._draw()

    def note(self, postfix: str) -> None:
        self._postfix = postfix
        self._draw()

    def activity(self, text: str) -> None:
        """What runs now (e.g. ``trial 3: fresh process 2, batch 180``)."""
        self._activity = text
        self._draw()

    def process_done(self, wall_s: float) -> None:
        """A fresh worker process ended after `wall_s` seconds (the estimate's unit of measured work)."""
        self._process_s.append(float(wall_s))
        if self._phase == "confirming":
            self._plan["repeats"] = max(0, self._plan.get("repeats", 0) - 1)
        else:
            self._trial_processes += 1
        self._draw()

    def close(self) -> None:
        """End a loop's phase (the bar stays until `finish`)."""
        self._draw()

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ---- drawing ---------------------------------------------------------------------------------
    def _draw(self) -> None:
        if self.disabled:
            return
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=1000, file=sys.stderr, dynamic_ncols=True, leave=True,
                             bar_format="{desc} {percentage:3.0f}%|{bar}| {postfix}")
        left = self.remaining_s()
        elapsed = time.monotonic() - self._started
        share = elapsed / (elapsed + left) if left is not None and elapsed + left > 0 else 0.0
        index = PHASES.index(self._phase) + 1 if self._phase in PHASES else 0
        done, total = self._count
        self._bar.set_description_str(f"{self._phase or 'search'} ({index}/{len(PHASES)})"
                                      + (f" {done}/{total}" if total else ""), refresh=False)
        parts = [p for p in (self._activity, self._postfix, self._estimate()) if p]
        self._bar.set_postfix_str("; ".join(parts), refresh=False)
        self._bar.n = int(1000 * min(1.0, share))
        self._bar.refresh()
