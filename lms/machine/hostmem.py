"""This process's host memory (resident set size); no TensorFlow.

- `peak_rss_bytes()`: ``getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux, bytes
  on macOS) in bytes.
- `current_rss_bytes()` / `window_peak_rss_bytes()`: ``VmRSS`` / ``VmHWM`` from
  ``/proc/self/status`` (Linux; ``None`` elsewhere).
- `reset_peak_rss()`: writes ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0),
  which sets the high-water mark back to the current RSS, so the next peak
  covers a window (e.g. the timed steps) instead of the whole process life.
  On Linux ``ru_maxrss`` follows the same high-water mark, so it is reset too.
"""

from __future__ import annotations

import logging
import resource
import sys
from pathlib import Path

__all__ = ["current_rss_bytes", "peak_rss_bytes", "reset_peak_rss", "window_peak_rss_bytes"]

log = logging.getLogger(__name__)

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process, in bytes (``ru_maxrss``)."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss) if sys.platform == "darwin" else int(maxrss) * 1024


def _status_kib(key: str) -> int | None:
    try:
        text = _STATUS.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * 1024
    return None


def current_rss_bytes() -> int | None:
    """Resident set size now (``VmRSS``), or ``None`` without /proc."""
    return _status_kib("VmRSS")


def window_peak_rss_bytes() -> int | None:
    """Peak RSS since the last `reset_peak_rss` (``VmHWM``), or ``None`` without /proc."""
    return _status_kib("VmHWM")


def reset_peak_rss() -> bool:
    """Reset the RSS high-water mark to the current RSS; False where the kernel refuses."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError as exc:
        log.debug("cannot reset the RSS high-water mark: %s", exc)
        return False
    return True
