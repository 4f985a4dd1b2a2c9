"""Workers forked from a zygote that imported TensorFlow once (`tuner.worker.zygote`): the same measurements as a
process started from nothing, and the same guarantees (killed on timeout, gone with the search process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.worker import zygote
from tuner.worker.protocol import MeasureRequest, TraceRequest
from tuner.worker.run import PARENT_PID_ENV, PARENT_PIPE_ENV, run_worker, worker_env

from .conftest import ROOT, TINY_MODEL

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote is Linux-only")

PINNED = {"n_tensors": -1, "lb": 1, "schedule": "memory"}


def _measure(tmp_path: Path, name: str, env: dict[str, str]) -> tuple:
    request = MeasureRequest(workload=TINY_MODEL, config=PINNED, backend="emulated", usable_bytes=1 << 30,
                             start_batch=8, cap=8, fixed_batch=True, warmup=1, steps=3, trial=0)
    out = run_worker(request, workdir=tmp_path / name, timeout_s=300, env=env)
    assert out.status == "ok", (out.reason, (tmp_path / name / "worker.log").read_text()[-3000:])
    line = next(ln for ln in (tmp_path / name / "worker.log").read_text().splitlines() if "measured CPU:0" in ln)
    return out.result.peak_device_bytes, line.split("over 3 steps (")[1].split(" bytes")[0]


def test_a_forked_worker_measures_what_a_worker_started_from_nothing_does(tmp_path: Path) -> None:
    fresh = _measure(tmp_path, "fresh", {**worker_env(), zygote.ZYGOTE_ENV: "0"})
    env = {**worker_env(), zygote.ZYGOTE_ENV: "1"}
    first = _measure(tmp_path, "fork1", env)
    live = zygote.pids()
    assert live, "the worker was not forked from a zygote"
    second = _measure(tmp_path, "fork2", env)
    assert zygote.pids() == live  # the same zygote forked both
    # the allocator's peak of every step, to the byte (the pinned step: the same in every process)
    assert first == second == fresh, (fresh, first, second)
    assert fresh[0] > 0


def test_a_forked_worker_is_killed_at_its_timeout_with_its_group(tmp_path: Path) -> None:
    env = {**worker_env(), zygote.ZYGOTE_ENV: "1"}
    warm = run_worker(TraceRequest(workload=TINY_MODEL, output=str(tmp_path / "g.json")), workdir=tmp_path / "warm",
                      timeout_s=300, env=env)
    assert warm.status == "ok" and zygote.pids()
    start = time.monotonic()
    out = run_worker(TraceRequest(workload="resnet50", output=str(tmp_path / "r.json")), workdir=tmp_path / "r",
                     timeout_s=1.0, env=env)
    assert out.status == "timeout" and out.returncode is not None and out.returncode != 0
    assert time.monotonic() - start < 15
    assert not (tmp_path / "r.json").exists()


_PARENT = """
import sys, threading, time
from pathlib import Path
from tuner.worker import zygote
from tuner.worker.protocol import TraceRequest
from tuner.worker.run import PARENT_PID_ENV, PARENT_PIPE_ENV, run_worker, worker_env
tmp = Path(sys.argv[1])
threading.Thread(target=run_worker, args=(TraceRequest(workload="resnet50", output=str(tmp / "r.json")),),
                 kwargs={"workdir": tmp / "w", "timeout_s": 600, "env": worker_env()}, daemon=True).start()
deadline = time.monotonic() + 120
while not zygote.pids() or not (tmp / "w" / "worker.log").exists():
    if time.monotonic() > deadline:
        print("no zygote", flush=True)
        sys.exit(1)
    time.sleep(0.1)
print(zygote.pids()[0], flush=True)
time.sleep(600)
"""


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "\nState:\tZ" in status.read_text()


def test_the_zygote_and_its_workers_die_with_the_search_process(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env[zygote.ZYGOTE_ENV] = "1"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        line = parent.stdout.readline()  # the helper prints within 120 s, or exits
        assert line.strip().isdigit(), line
        zpid = int(line)
        deadline = time.monotonic() + 60
        while not _children(zpid) and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = _children(zpid)
        assert len(workers) == 1, workers
        os.kill(parent.pid, signal.SIGKILL)  # kill -9 of the search process
        parent.wait()
        deadline = time.monotonic() + 20
        while not (_gone(zpid) and _gone(workers[0])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(zpid) and _gone(workers[0])
        assert not (tmp_path / "r.json").exists()
    finally:
        if parent.poll() is None:
            parent.kill()


def test_which_workers_are_forked() -> None:
    cpu = {**worker_env(), zygote.ZYGOTE_ENV: "1"}
    assert zygote.enabled(cpu)
    assert not zygote.enabled({**cpu, zygote.ZYGOTE_ENV: "0"})
    assert not zygote.enabled({**cpu, "CUDA_VISIBLE_DEVICES": "GPU-1234"})  # GPU workers start from nothing
    # what run_worker sets per worker does not start another zygote
    assert {PARENT_PIPE_ENV, PARENT_PID_ENV} <= set(zygote.PER_WORKER_ENV)


def test_a_zygote_with_a_running_worker_is_not_closed_for_another_environment(tmp_path: Path, monkeypatch) -> None:
    import threading

    monkeypatch.setattr(zygote, "_MAX_ZYGOTES", 1)
    zygote.close_all()
    env_a = {**worker_env(), zygote.ZYGOTE_ENV: "1", "LMS_TEST_ENV": "a"}
    env_b = {**env_a, "LMS_TEST_ENV": "b"}
    done = threading.Event()
    outcome: list = []
    # A's worker runs until the test stops it. It traced ResNet-50 once, and on a loaded machine that trace
    # ended before B's worker, started from nothing, did (CI at fbe8a64).
    held = tmp_path / "held.py"
    held.write_text("import time\n\n\ndef make_workload():\n    time.sleep(300)\n")
    long_run = threading.Thread(target=lambda: outcome.append(run_worker(
        TraceRequest(workload=f"{held}:make_workload", output=str(tmp_path / "r.json")), workdir=tmp_path / "a",
        timeout_s=300, env=env_a, should_stop=done.is_set)))
    long_run.start()
    try:
        deadline = time.monotonic() + 120
        while not (zygote.pids() and (tmp_path / "a" / "worker.log").exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        (pid_a,) = zygote.pids()
        other = run_worker(TraceRequest(workload=TINY_MODEL, output=str(tmp_path / "g.json")),
                           workdir=tmp_path / "b", timeout_s=300, env=env_b)
        assert other.status == "ok", other.reason  # started from nothing: the only zygote was busy
        assert zygote.pids() == [pid_a] and not outcome  # and A's worker still runs
    finally:
        done.set()
        long_run.join(60)
        zygote.close_all()
    assert outcome and outcome[0].status == "stopped", outcome  # stopped by us, not ended by a closed zygote
