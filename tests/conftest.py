"""Session-wide test setup.

TensorFlow reads these variables once, at import: they must be set before any
test module imports it. The BFC allocator on CPU makes
`tf.config.experimental.get_memory_info("CPU:0")` byte-exact (TF-NOTES).
"""

import os

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
