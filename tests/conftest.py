"""Session-wide test setup.

TensorFlow reads these variables when its runtime starts (first op or device
query): they must be set before any test runs TensorFlow. The BFC allocator on CPU makes
`tf.config.experimental.get_memory_info("CPU:0")` byte-exact (TF-NOTES).

oneDNN is switched on explicitly (``TF_ENABLE_ONEDNN_OPTS=1``): TensorFlow turns it on by
default only on CPUs with AVX-512 VNNI/BF16 or AMX, so on an AVX2-only CPU the suite would
otherwise run Eigen's kernels, whose ``Conv2DBackpropFilter`` takes a 32 MiB buffer at any
batch (a small CNN peaks at 67 MiB at batch 4 instead of 4 MiB) and whose convolutions are
about 3x slower here. The emulated backend's workers do the same (`tuner.worker.worker_env`).
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
