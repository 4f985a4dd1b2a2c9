"""The parent side of trial workers: timeouts, stops, bad input, outcome -> trial record."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lms import LMSConfig
from tuner.policy.batch import Prediction
from tuner.backends import get_backend
from tuner.worker.protocol import DescribeRequest, MeasureResult, TraceRequest
from tuner.backends.measured import measured_record
from tuner.worker.run import WorkerOutcome, run_worker, worker_env

MiB = 1 << 20


def test_worker_env_per_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # which GPU an index names is tuner.worker.gpus' business (tests/tuner/test_gpus.py); here: the env it builds
    gpu = get_backend("gpu").worker_env(gpu="GPU-1111")
    assert gpu["CUDA_VISIBLE_DEVICES"] == "GPU-1111" and gpu["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in gpu  # the budget is a logical device's memory_limit
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the user's choice: index 1 of their order
    monkeypatch.setattr("tuner.environment.gpus", lambda: [
        {"index": i, "uuid": f"GPU-{i}{i}{i}", "name": "NVIDIA L4", "total_bytes": 24 << 30, "pci_bus_id": f"0:{i}"}
        for i in range(3)])
    assert get_backend("gpu").worker_env()["CUDA_VISIBLE_DEVICES"] == "GPU-111"  # not "0"
    emulated = get_backend("emulated").worker_env()
    assert emulated["CUDA_VISIBLE_DEVICES"] == "" and emulated["TF_CPU_ALLOCATOR_USE_BFC"] == "true"


def test_cpu_workers_run_onednn_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """TF turns oneDNN on by default only on AVX-512 VNNI/BF16 or AMX CPUs: the emulated device says which."""
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    assert worker_env()["TF_ENABLE_ONEDNN_OPTS"] == "1"
    assert "TF_ENABLE_ONEDNN_OPTS" not in worker_env(gpu="0")  # a GPU job keeps TensorFlow's default
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert worker_env()["TF_ENABLE_ONEDNN_OPTS"] == "0"


def test_timeout_kills_the_worker(tmp_path: Path) -> None:
    start = time.monotonic()
    out = run_worker(TraceRequest(workload="resnet50", output=str(tmp_path / "g.json")), workdir=tmp_path,
                     timeout_s=1.0, env=worker_env())
    assert out.status == "timeout" and "timed out" in out.reason
    assert out.returncode is not None and out.returncode != 0
    assert time.monotonic() - start < 15
    assert not (tmp_path / "g.json").exists() and (tmp_path / "worker.log").exists()


def test_should_stop_stops_the_worker(tmp_path: Path) -> None:
    out = run_worker(TraceRequest(workload="resnet50", output=str(tmp_path / "g.json")), workdir=tmp_path,
                     timeout_s=60, env=worker_env(), should_stop=lambda: True)
    assert out.status == "stopped"


def test_bad_workload_is_bad_input(tmp_path: Path) -> None:
    out = run_worker(DescribeRequest(workload="no_such_model"), workdir=tmp_path, timeout_s=60, env=worker_env())
    assert out.status == "bad_input" and out.returncode == 2
    assert "unknown model 'no_such_model'" in out.reason and "resnet50" in out.reason


def test_describe_user_workload(tmp_path: Path) -> None:
    out = run_worker(DescribeRequest(workload="examples.user_model:make_workload", options={"image_size": 16}),
                     workdir=tmp_path, timeout_s=60, env=worker_env())
    assert out.status == "ok", out.reason
    assert out.result.workload["x_shape"] == [16, 16, 3]


PRED = Prediction(batch=40, peak_bytes=90 * MiB, step_time_s=0.1, throughput=400.0, slope_bytes_per_sample=MiB)


def _outcome(status: str, result: dict | None = None, events=(), reason: str = "") -> WorkerOutcome:
    typed = None if result is None else MeasureResult.from_dict(result)
    return WorkerOutcome(status, typed, tuple(events), 0, reason, Path("/tmp/w.log"), 3.0)


def test_ok_outcome_becomesmeasured_record() -> None:
    result = {"status": "ok", "batch_size": 36, "throughput": 300.0, "peak_device_bytes": 94 * MiB,
              "peak_source": "tf-bfc-cpu", "step_time_median_s": 0.12, "step_time_spread_s": 0.01,
              "host_peak_rss_bytes": 500 * MiB}
    events = [{"event": "probe", "batch": 40, "fits": False, "peak_bytes": 99 * MiB},
              {"event": "probe", "batch": 36, "fits": True, "peak_bytes": 94 * MiB}]
    r = measured_record(LMSConfig(), _outcome("ok", result, events), PRED, backend=get_backend("emulated"),
                         usable=95 * MiB, trial_dir=Path("/t"))
    assert (r.status, r.measured, r.batch_size, r.throughput) == ("ok", True, 36, 300.0)
    assert r.peak_device_bytes == 94 * MiB and r.constraint <= 0
    assert r.predicted_peak_bytes == 90 * MiB and r.extra["predicted_batch"] == 40
    assert [p["batch"] for p in r.extra["probes"]] == [40, 36]
    assert not r.failed


@pytest.mark.parametrize("status", ["infeasible", "oom"])
def test_oom_and_infeasible_violate_the_constraint(status: str) -> None:
    r = measured_record(LMSConfig(), _outcome(status, {"status": status, "peak_device_bytes": 120 * MiB},
                                               reason="batch 1 does not fit"),
                         PRED, backend=get_backend("gpu"), usable=100 * MiB, trial_dir=Path("/t"))
    assert r.status == status and r.batch_size == 0 and r.constraint == pytest.approx(0.2)
    assert not r.failed and r.measured


@pytest.mark.parametrize("status", ["timeout", "killed"])
def test_timeout_and_killed_are_infeasible_results(status: str) -> None:
    events = [{"event": "probe", "batch": 8, "fits": True, "peak_bytes": 50 * MiB}]
    r = measured_record(LMSConfig(), _outcome(status, None, events, reason=f"worker {status}"), PRED,
                         backend=get_backend("emulated"), usable=100 * MiB, trial_dir=Path("/t"))
    assert r.status == status and r.constraint > 0 and not r.failed
    assert "largest batch seen to fit: 8" in r.reason


def test_error_fails_the_trial() -> None:
    r = measured_record(LMSConfig(), _outcome("error", {"status": "error", "reason": "boom"}, reason="boom"), PRED,
                         backend=get_backend("emulated"), usable=100 * MiB, trial_dir=Path("/t"))
    assert r.failed and not r.requeue and r.status == "error" and "/tmp/w.log" in r.reason


def test_worker_without_a_result_is_a_machine_error_queued_again() -> None:
    """It wrote no result (e.g. the study folder turned read-only): nothing is known about the config."""
    r = measured_record(LMSConfig(), _outcome("error", None, reason="worker exited with code 1 without a result"),
                         PRED, backend=get_backend("emulated"), usable=100 * MiB, trial_dir=Path("/t"))
    assert r.failed and r.requeue and r.status == "machine_error"
    assert "not the config" in r.reason and "/tmp/w.log" in r.reason


def test_exit_now_runs_exit_handlers_flushes_and_keeps_the_code(tmp_path: Path) -> None:
    """A worker ends without the interpreter's teardown, but nothing it was to say or write is lost."""
    import subprocess
    import sys

    code = f"""
import atexit, logging, sys
from tuner.trial import exit_now
atexit.register(lambda: open({str(tmp_path / 'atexit')!r}, 'w').write('ran'))
handler = logging.FileHandler({str(tmp_path / 'log')!r})
logging.getLogger().addHandler(handler)
logging.getLogger().warning('last log line')
sys.stdout.write('unflushed stdout')
sys.stderr.write('unflushed stderr')
exit_now(3)
raise SystemExit('not reached')
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "unflushed stdout" and proc.stderr == "unflushed stderr"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "log").read_text() == "last log line\n"


def test_import_tensorflow_holds_back_what_keras_only_needs_in_notebooks_and_only_while_it_imports(
        tmp_path: Path) -> None:
    """A stand-in `tensorflow` package imports both held-back modules as Keras does (under ``except
    ImportError``): it gets neither; afterwards both import, and one imported before is left as it was."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(
        "GOT = {}\n"
        "for name in ('IPython', 'matplotlib.pyplot'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "        GOT[name] = True\n"
        "    except ImportError:\n"
        "        GOT[name] = False\n")
    (tmp_path / "IPython").mkdir()
    (tmp_path / "IPython" / "__init__.py").write_text("")
    code = """
import json, sys
if sys.argv[1] == 'before':
    import IPython
from tuner.trial import import_tensorflow
tf = import_tensorflow()
import IPython, matplotlib.pyplot
print(json.dumps(tf.GOT))
"""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(root)]), MPLBACKEND="Agg")
    got = {}
    for when in ("fresh", "before"):
        proc = subprocess.run([sys.executable, "-c", code, when], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got[when] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["fresh"] == {"IPython": False, "matplotlib.pyplot": False}
    assert got["before"] == {"IPython": True, "matplotlib.pyplot": False}
