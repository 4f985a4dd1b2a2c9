"""More bad input (config files, output folders, option values): one line on stderr, exit 2, nothing written.

tests/tuner/test_cli.py::test_bad_input covers 21 kinds (unknown model, bad
module:function, budgets 0 / -1GiB / 16XB / abc, unknown storage scheme,
unreachable storage folders, study names with path separators, bad options,
unknown device / backend, --trials 0, missing studies); these add 24 more,
among them LMS config files checked by ``lms-tuner validate-config``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .conftest import run_cli

GOOD = {"schema": "lms.config", "schema_version": 1, "config": {"n_tensors": 4, "lb": 2}}


def _config(**changes) -> str:
    return json.dumps({**GOOD, "config": {**GOOD["config"], **changes}})


CONFIG_FILES = {
    "malformed": ("{'schema': 'lms.config'}", "not valid JSON"),
    "truncated": (json.dumps(GOOD)[:40], "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "not-an-object": ("[1, 2, 3]", "expected a JSON object, got list"),
    "wrong-type": (_config(lb="3"), "LMSConfig.lb='3': must be an integer"),
    "bool-for-int": (_config(n_tensors=True), "must be an integer"),
    "lb-gt-ub": (_config(lb=50, ub=10), "lb=50 > ub=10"),
    "n-tensors-below-minus-one": (_config(n_tensors=-2), "n_tensors=-2: must be -1"),
    "unknown-strategy": (_config(ctrld_strategy="fastest"), "ctrld_strategy='fastest'"),
    "unknown-key": (_config(n_tensor=3), "unknown LMS config key 'n_tensor'"),
    "wrong-schema": (json.dumps({**GOOD, "schema": "other"}), "key 'schema'='other'"),
    "binary": (None, "invalid LMS config"),
    "deeply-nested": ("[" * 100_000 + "]" * 100_000, "not valid JSON (nested too deeply)"),
}


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("lms-tuner: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_valid_config_file_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps(GOOD))
    proc = run_cli(["validate-config", "c.json", "--json"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["n_tensors"] == 4 and doc["lb"] == 2 and doc["ub"] == 10000


@pytest.mark.parametrize("name", sorted(CONFIG_FILES))
def test_bad_config_file(name: str, tmp_path: Path) -> None:
    text, fragment = CONFIG_FILES[name]
    path = tmp_path / "c.json"
    if text is None:
        path.write_bytes(b"\xff\xfe\x00garbage\x80")
    else:
        path.write_text(text)
    before = _files(tmp_path)
    proc = run_cli(["validate-config", "c.json"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert fragment in _one_line(proc)
    assert proc.stdout == "" and _files(tmp_path) == before


@pytest.mark.parametrize("args, fragment", [
    (["validate-config", "missing.json"], "config file missing.json does not exist"),
    (["validate-config", "."], ". is not a file"),
    (["search", "--model", "mlp", "--studies-dir", "/proc/lms-tuner-out"], "is not a writable folder"),
    (["search", "--model", "mlp", "--studies-dir", "afile/studies"], "is not a writable folder"),
    (["search", "--model", "mlp", "--workers", "0"], "must be >= 1"),
    (["search", "--model", "mlp", "--confirm", "11"], "--confirm: 11 must be between 0 and 10"),
    (["search", "--model", "mlp", "--confirm", "-1"], "--confirm: -1 must be between 0 and 10"),
    (["search", "--model", "mlp", "--timeout", "-5"], "must be >= 0 seconds"),
    (["search", "--model", "mlp", "--safety-margin", "0.9"], "must be between 0 and 0.5"),
    (["search", "--model", "mlp", "--gpus", "0,0"], "distinct GPU indices"),
    (["search", "--model", "mlp", "--storage", "sqlite:///:memory:"], "in-memory database would lose the study"),
    (["search", "--model", "mlp", "--storage", "not a url"], "is not a URL"),
    (["search", "--model", "mlp", "--study", ".hidden"], "is not allowed"),
    (["search", "--model", "mlp:"], "mlp:"),
    (["search", "--model", "mlp", "--batch", "0"], "--batch: 0 must be between 1 and 2147483647"),
    (["search", "--model", "mlp", "--batch", "600", "--max-batch", "512"], "--batch 600 is larger than --max-batch 512"),
    (["search", "--model", "mlp", "--grow", "input_dim"], "--grow input_dim needs --batch N"),
    (["search", "--model", "mlp", "--batch", "8", "--grow", "hidden"],
     "--grow hidden: model mlp does not declare 'hidden' growable; growable: input_dim"),
    (["search", "--model", "resnet50", "--batch", "8", "--grow", "image_sizes"], "growable: image_size"),
])
def test_bad_cli_input(args: list[str], fragment: str, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("a file, not a folder\n")
    before = _files(tmp_path)
    full = [*args, "--backend", "simulate"] if args[0] == "search" else args
    proc = run_cli(full, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert fragment in _one_line(proc)
    assert proc.stdout == "" and _files(tmp_path) == before
