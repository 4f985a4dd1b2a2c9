"""The core (graph model, planner, simulator, devices, tuner parent modules) imports without TensorFlow."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

CORE = ["lms", "lms.config", "lms.jsonfile", "lms.graph", "lms.optypes", "lms.simulator",
        "lms.plan", "lms.plan.swap_plan", "lms.plan.swap_planner", "lms.plan.candidates", "lms.plan.triggers",
        "lms.plan.recompute", "lms.plan.recompute_planner", "lms.plan.anchor", "lms.rules",
        "lms.machine", "lms.machine.devices", "lms.machine.nvml", "lms.machine.hostmem",
        "lms.schedule", "lms.schedule.scheduler", "lms.schedule.edges", "lms.schedule.models",
        "lms.schedule.candidate_orders", "lms.schedule.exact_order",
        "lms.sim", "lms.sim.compiled", "lms.order", "lms.sim.result", "lms.sim.costs", "lms.sim.interpreter",
        "lms.sim.search", "lms.sim.bfc", "lms.sim.bound", "lms.sim.layout", "lms.auto", "lms.sizes", "lms.shapes",
        "lms.pipeline"]
TUNER = ["tuner", "tuner.cli", "tuner.search", "tuner.study.settings", "tuner.policy.knobs", "tuner.policy.space",
         "tuner.study.loop", "tuner.policy.records", "tuner.study.recovery", "tuner.policy.pareto", "tuner.graphs",
         "tuner.worker.run", "tuner.worker.protocol",
         "tuner.backends", "tuner.outputs", "tuner.policy.selection", "tuner.study.study",
         "tuner.report", "tuner.report.schedule", "tuner.report.recompute"]  # parent-process modules, when they exist


def _present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_core_modules_import_with_tensorflow_blocked():
    modules = CORE + [m for m in TUNER if _present(m)]
    code = textwrap.dedent(f"""
        import sys
        sys.modules["tensorflow"] = None  # any "import tensorflow" now raises ImportError
        sys.modules["keras"] = None
        import importlib
        for name in {modules!r}:
            importlib.import_module(name)
        from lms.simulator import simulate
        from tests.synthetic import chain
        assert simulate(chain(3), batch=2).peak_device_bytes > 0
        loaded = [m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras") and sys.modules[m]]
        assert not loaded, loaded
        print("ok", len({modules!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")
