"""Session-wide test setup.

TensorFlow reads these variables when its runtime starts (first op or device
query): they must be set before any test runs TensorFlow. The BFC allocator on CPU makes
`tf.config.experimental.get_memory_info("CPU:0")` byte-exact (TF-NOTES).
"""

import os

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
