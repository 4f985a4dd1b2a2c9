"""TFLMS v2's resolution row: the largest cubic 3D U-Net input at batch 1, without and with LMS (PREDICTED).

TFLMS v2 (IBM's Large Model Support for TensorFlow) headlined a larger image
resolution for the 3D U-Net rather than a larger batch: 5.6x, as issue 16
quotes it (not re-read here). This module answers the same question with the
tuner's own ``search --batch 1 --grow input_size`` (`tuner.grow.run_grow`, simulate
backend): the zoo's 3D U-Net (Cicek et al., 32 base filters, 4 modalities, 4
classes), budget 16 GiB with the tuner's 5% margin, P100-16GB profile, cubic
inputs in steps of 16 voxels; each size is traced once (a worker) and searched
at batch 1. Every figure is PREDICTED by the simulator.

`benchmarks/paper.py` adds it to the paper table (`resolution_row`, `markdown_lines`);
on its own::

    python benchmarks/resolution.py          # writes benchmarks/results/resolution.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lms.config import atomic_write_text  # noqa: E402
from lms.machine.devices import GiB  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CACHE = RESULTS / "cache" / "resolution"
LABEL = "PREDICTED"
V2_VOLUME_RATIO = 5.6
V2_SOURCE = ("TFLMS v2 (IBM Large Model Support for TensorFlow): '5.6x larger image resolution' for the 3D U-Net, "
             "as quoted in issue 16 (not re-read here)")


def resolution_row(*, budget_bytes: int = int(16 * GiB), device: str = "P100-16GB", batch: int = 1,
                   start: int = 192, trials: int = 40, seed: int = 0, cache: Path = CACHE) -> dict[str, Any]:
    """The grow search's answer for the 3D U-Net's ``input_size`` (`tuner.grow` document plus the v2 figure)."""
    import optuna

    from tuner.grow import run_grow
    from tuner.models import load_workload
    from tuner.study.settings import SearchSettings
    from tuner.study.storage import resolve_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = f"unet3d-b{batch}-{budget_bytes // (1 << 20)}MiB-{device}"
    settings = SearchSettings(
        study=study, model="unet3d", model_options={"input_size": start}, backend="simulate",
        budget_bytes=budget_bytes, budget_source="16 GiB, the paper's GPU", device=device, trials=trials,
        screen_trials=0, storage=resolve_storage(None, study, studies_dir=cache), studies_dir=cache, seed=seed,
        batch=batch, grow="input_size", workload=load_workload("unet3d", input_size=start).describe(),
        trial_timeout_s=1800)
    t0 = time.monotonic()
    outcome = run_grow(settings)
    doc = dict(outcome.doc)
    doc.update(v2_volume_ratio=V2_VOLUME_RATIO, v2_source=V2_SOURCE, wall_s=round(time.monotonic() - t0, 1),
               label=LABEL, trials_per_value=trials)
    return doc


def markdown_lines(row: Mapping[str, Any]) -> list[str]:
    """The paper table's resolution section."""
    lms_v, base_v = row["with_lms"], row["without_lms"]

    def cube(v: Any) -> str:
        return f"{v}^3" if v else "none"

    ratio = f"{row['size_ratio_3d']:.2f}x ({row['value_ratio']:.2f}x per side)" if row.get("size_ratio_3d") else "-"
    return [
        f"## Largest input at a fixed batch: 3D U-Net ({LABEL}; TFLMS v2's resolution figure beside it)", "",
        f"| workload | batch | largest cube without LMS ({LABEL}) | largest cube with LMS ({LABEL}) | "
        f"volume ratio ({LABEL}) | TFLMS v2 |",
        "|---|---:|---:|---:|---:|---:|",
        f"| 3D U-Net (Cicek), 4 modalities, 32 base filters | {row['batch']} | {cube(base_v)} | {cube(lms_v)} | "
        f"{ratio} | {row['v2_volume_ratio']}x |", "",
        f"`tuner search --model unet3d --batch {row['batch']} --grow input_size --backend simulate --device "
        f"{row['device']} --budget 16GiB` ({LABEL}): cubic inputs in steps of {row['step']} voxels from "
        f"{row['start']}, bracketed then bisected; each size traced and searched with {row['trials_per_value']} "
        f"configs; the next step fails ({cube(row['without_lms_first_failing'])} without LMS, "
        f"{cube(row['with_lms_first_failing'])} with). Source of v2's figure: {row['v2_source']}. "
        f"Computed in {row['wall_s']:.0f} s by `benchmarks/resolution.py`.", ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=40, help="configs searched per input size (default: %(default)s)")
    p.add_argument("--out", type=Path, default=RESULTS / "resolution.json", help="JSON output")
    args = p.parse_args(argv)
    row = resolution_row(trials=args.trials)
    atomic_write_text(args.out, json.dumps(row, indent=1, default=str) + "\n")
    print("\n".join(markdown_lines(row)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
