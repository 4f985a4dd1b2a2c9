"""The training run of the fit examples (`unet_fit.py`, `dcgan_fit.py`): a script's ``fit``, each step's peak printed.

``run_fit(workload, [CONFIG, BATCH, STEPS])``: builds the program's model, turns LMS on with CONFIG (a
``recommended.json``, a config file, ``auto`` or ``off``), and trains with ``model.fit`` on a ``tf.data``
pipeline at a fixed batch (BATCH; default: the batch the recommendation was tuned for), under TensorFlow's
default executor, with every step's allocator peak read (`lms.tf.fit_peaks.StepPeaks`). Prints one JSON line.
"""

from __future__ import annotations

import json
import os


def run_fit(workload, argv: list[str]) -> int:
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # TF's allocator statistic on a CPU
    import lms
    from lms.tf.fit_peaks import StepPeaks
    from tuner.worker.programs import fit_dataset

    if not argv:
        print("usage: CONFIG [BATCH] [STEPS]  (CONFIG: recommended.json, a config file, auto or off)")
        return 2
    config = lms.LMSConfig(n_tensors=0) if argv[0] == "off" else argv[0] if argv[0] == "auto" \
        else lms.LMSConfig.load(argv[0])
    tuned = getattr(config, "tuned", None) or {}
    batch = int(argv[1]) if len(argv) > 1 else int(tuned.get("batch_size") or workload.default_batch)
    steps = int(argv[2]) if len(argv) > 2 else 6
    model = lms.enable_lms(workload.fit_model(), config, batch_size=batch)
    peaks = StepPeaks()
    model.fit(fit_dataset(workload.make_batch(batch, 0), batch), steps_per_epoch=steps, epochs=1, verbose=0,
              callbacks=[peaks], shuffle=False)
    summary = model.lms.summary
    print(json.dumps({"batch": batch, "peaks_bytes": peaks.peaks, "max_after_first_bytes": max(peaks.peaks[1:]),
                      "n_swapped": summary.n_swapped if summary else 0,
                      "usable_bytes": tuned.get("usable_bytes")}))
    return 0
