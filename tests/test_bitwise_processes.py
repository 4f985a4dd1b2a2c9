"""benchmarks/bitwise_processes.py: the comparison of two runs' files, and its bad arguments. No TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bitwise_processes  # noqa: E402


def test_one_changed_bit_is_one_differing_array(tmp_path):
    a = {"losses": np.asarray([2.5, 2.25], "float32"), "v0": np.ones((3, 3), "float32"), "v1": np.zeros(4, "int64")}
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "b.npz", **a)
    assert bitwise_processes.compare(tmp_path / "a.npz", tmp_path / "b.npz") == {
        "arrays": 3, "differ": 0, "losses_equal": True, "max_abs_difference": 0.0}
    changed = dict(a, v0=a["v0"].copy())
    changed["v0"][1, 2] = np.nextafter(np.float32(1), np.float32(2))  # one ulp
    np.savez(tmp_path / "c.npz", **changed)
    got = bitwise_processes.compare(tmp_path / "a.npz", tmp_path / "c.npz")
    assert got["differ"] == 1 and got["losses_equal"] and 0 < got["max_abs_difference"] < 1e-6


def test_bad_arguments_exit_2_in_one_line(tmp_path):
    for args, says in ((["--batch", "0"], "--batch and --steps must be >= 1"),
                       (["--config", str(tmp_path / "none.json")], "--config")):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bitwise_processes.py"), *args],
                              capture_output=True, text=True, timeout=60, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr
