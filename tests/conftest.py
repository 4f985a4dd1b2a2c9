"""Session-wide test setup.

TensorFlow reads these variables when its runtime starts (first op or device
query): they must be set before any test runs TensorFlow. The BFC allocator on CPU makes
`tf.config.experimental.get_memory_info("CPU:0")` byte-exact (docs/tf-notes.md).

oneDNN is switched on explicitly (``TF_ENABLE_ONEDNN_OPTS=1``): TensorFlow turns it on by
default only on CPUs with AVX-512 VNNI/BF16 or AMX, so on an AVX2-only CPU the suite would
otherwise run Eigen's kernels, whose ``Conv2DBackpropFilter`` takes a 32 MiB buffer at any
batch (a small CNN peaks at 67 MiB at batch 4 instead of 4 MiB) and whose convolutions are
about 3x slower here. The emulated backend's workers do the same (`tuner.worker.run.worker_env`).
Set ``TF_ENABLE_ONEDNN_OPTS=0`` to run the suite on Eigen's kernels (it passed so, except the
test that peaks grow with the batch).

The equivalence check's disk cache (`lms.tf.equivalence.cache_dir`) goes to a folder of this
session (inherited by the tuner's worker processes), not to the user's ``~/.cache/lms``: a
test checks the graphs of the code it runs, and leaves nothing behind.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
if "LMS_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="lms-test-cache-")
    os.environ["LMS_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)


# ---------------------------------------------------------------- fault-suite figures
# Here, not in tests/tuner/conftest.py: under pytest-xdist only this conftest is loaded by the
# controlling process, which prints the summary from the reports its workers send.

from tests.figures import FIGURES_PROPERTY, format_figures, total  # noqa: E402

_FAULT_FIGURES: list[dict] = []


def pytest_runtest_logreport(report) -> None:
    _FAULT_FIGURES.extend(f for key, f in report.user_properties if key == FIGURES_PROPERTY)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    if not _FAULT_FIGURES:
        return
    terminalreporter.section("tuner fault-injection figures")
    for f in _FAULT_FIGURES:
        terminalreporter.write_line(f"{f['test']}: {format_figures(f)}")
    terminalreporter.write_line(f"TOTAL: {format_figures(total(_FAULT_FIGURES))}")


# ---------------------------------------------------------------- parallel runs (pytest-xdist)


def pytest_xdist_auto_num_workers(config) -> int:  # noqa: ARG001
    """``-n auto``: one worker per core the process may use (its affinity, not the machine's count).

    Three workers on two cores were tried: 921 s instead of 1,059 s for the suite, but two
    load-sensitive tests failed (the emulated device's swap-lowers-the-peak bound and two searches
    sharing a journal study), so one per core. Tried again once both were fixed (2026-12-03): every
    test passed with three, in 1,114.7 s against 1,030-1,226 s with two, so no gain. Nor did one
    intra-op thread per worker (``TF_NUM_INTRAOP_THREADS=1``) change a two-file run's time.

    Tests of one file run in one worker (``--dist loadfile``): the models and studies a file
    traces once stay shared by its tests. The files go out longest first (`pytest_collection_modifyitems`).
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# Seconds each file took in one worker, measured with the suite on an idle 2-core machine at bc59be7 (2026-12-04,
# a timeline of every test's start and end per worker, kept outside the repository): files of 10 s or more. With
# ``--no-loadscope-reorder`` (pyproject.toml) pytest-xdist hands out files in collection order, and this order puts
# the longest first. By its own rule (most tests first) a file of two 25-second tests ran last, and one worker
# finished 31 s before the other.
FILE_SECONDS = {
    "tests/tf/test_inspect.py": 40,
    "tests/tf/test_realworld.py": 119, "tests/tf/test_bitwise.py": 79, "tests/tuner/test_faults.py": 58,
    "tests/tuner/test_cli.py": 57, "tests/tf/test_models.py": 56, "tests/tuner/test_reliability3.py": 44,
    "tests/tuner/test_reliability4.py": 41,
    "tests/tf/test_realworld3.py": 33,
    "tests/tf/test_pin.py": 42, "tests/tuner/test_confirm.py": 38, "tests/tf/test_measure.py": 36,
    "tests/tf/test_exact.py": 28, "tests/tuner/test_one_truth.py": 28, "tests/tuner/test_fixed_batch.py": 23,
    "tests/tf/test_auto.py": 22, "tests/test_zoo_search.py": 19, "tests/tuner/test_zygote.py": 19,
    "tests/tuner/test_postgres.py": 19, "tests/test_simulator.py": 16, "tests/tuner/test_oom.py": 15,
    "tests/tf/test_recompute.py": 14, "tests/tf/test_keras_fit.py": 13, "tests/tuner/test_forked_cli.py": 12,
    "tests/tuner/test_reliability.py": 12, "tests/tuner/test_host_budget.py": 11, "tests/test_gpu_check.py": 11,
    "tests/tf/test_apply.py": 10,
}


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: ARG001
    """The longest files first (`FILE_SECONDS`), then the rest in collection order; a file's tests keep theirs."""
    items.sort(key=lambda item: -FILE_SECONDS.get(item.nodeid.split("::", 1)[0], 0))
