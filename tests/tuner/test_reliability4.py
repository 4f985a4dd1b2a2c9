"""Issue 52, reliability round four: eight defects found by hostile use, each with its regression test.

Each test names its defect by number (see ``issues show 52``). The CLI ones run the real command line
(`run_cli`) on the simulate backend and the tiny cached graph, or on the emulated backend's test-only
synthetic workers (``LMS_TUNER_FAULT``, no TensorFlow); the library ones that need TensorFlow are
marked ``tf`` and run their SavedModel in a fresh process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .conftest import ROOT, TINY_MODEL, run_cli

SIM = ("--backend", "simulate", "--no-report")


def _one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("lms-tuner: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ================================================================ 1 (high): the finish command masks the password

def test_01_the_command_that_finishes_a_cut_short_confirmation_masks_the_storage_password(
        postgres_url: str, tmp_path: Path, seed_graph) -> None:
    password = postgres_url.split("//", 1)[1].split("@", 1)[0].split(":", 1)[1]
    study = "finish"
    seed_graph(tmp_path / "studies", study)
    common = ["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "128MiB", "--study", study,
              "--seed", "0", "--screen-trials", "4", "--trials", "2", "--no-report", "--json"]
    done = run_cli([*common, "--storage", postgres_url, "--confirm", "1"], cwd=tmp_path, timeout=300,
                   env={"LMS_TUNER_FAULT": "fits120@*"})
    assert done.returncode == 0, done.stderr[-3000:]
    # --confirm 2 asks for one more fresh process each; they hang until the time limit ends the search. The
    # option abbreviated as argparse allows (--stor) is masked too.
    cut = run_cli([*common, "--stor", postgres_url, "--confirm", "2", "--timeout", "3"], cwd=tmp_path,
                  timeout=300, env={"LMS_TUNER_FAULT": "hang@*"})
    assert cut.returncode == 1, cut.stderr[-3000:]
    last = cut.stderr.strip().splitlines()[-1]
    finish = re.search(r"Finish it with: (.*)$", last).group(1)
    masked = postgres_url.replace(password, "***")
    assert finish.endswith(f"--stor '{masked}' --confirm 2 --timeout 0"), finish
    assert password not in cut.stdout + cut.stderr


# ================================================================ 3 (low-medium): no infinity reaches JSON

@pytest.mark.parametrize("value", ["1e400", "-1e400", "Infinity", "NaN", "[0.1, 1e999]"])
def test_03_a_model_option_that_is_not_a_finite_number_is_bad_input(value: str, tmp_path: Path) -> None:
    proc = run_cli(["search", *SIM, "--model", "mlp", "--study", "inf", "--model-option", f"learning_rate={value}"],
                   cwd=tmp_path, timeout=120)
    line = _one_line(proc, 2)
    assert f"model option learning_rate={value} is not a finite number (it reads as " in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["--timeout", "--trial-timeout"])
def test_03_a_time_limit_that_overflows_to_infinity_is_bad_input(option: str, tmp_path: Path) -> None:
    proc = run_cli(["search", *SIM, "--model", "mlp", "--study", "inf", option, "1e400"], cwd=tmp_path, timeout=120)
    assert f"argument {option}: '1e400' is not a finite number of seconds" in _one_line(proc, 2)
    assert list(tmp_path.iterdir()) == []


def test_03_a_recommendation_holding_infinity_is_not_a_valid_config(tmp_path: Path) -> None:
    """Python's json writes and reads Infinity; no other reader does, and LMSConfig.load now refuses it."""
    doc = {"schema": "lms.config", "schema_version": 1, "config": {"n_tensors": 4, "lb": 2},
           "model_options": {"learning_rate": float("inf")}}
    (tmp_path / "c.json").write_text(json.dumps(doc))  # allow_nan=True, as the tuner wrote it before
    proc = run_cli(["validate-config", "c.json"], cwd=tmp_path, timeout=60)
    assert _one_line(proc, 2).endswith("c.json: not valid JSON (Infinity is not a JSON number)")
    (tmp_path / "c.json").write_text(json.dumps(doc).replace("Infinity", "1e400"))
    proc = run_cli(["validate-config", "c.json"], cwd=tmp_path, timeout=60)
    assert _one_line(proc, 2).endswith("c.json: not valid JSON (number 1e400 is too large)")


def test_03_a_worker_request_holding_infinity_is_refused_when_written() -> None:
    """A worker's request is JSON the tuner writes and reads back: no Infinity goes into it (nor into its result,
    recommended.json, grow.json, graph.json, which are written with the same allow_nan=False)."""
    import math

    from tuner.worker.protocol import Envelope, MeasureRequest

    request = MeasureRequest(workload="mlp", config={}, backend="emulated", usable_bytes=1 << 30,
                             options={"learning_rate": math.inf})
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        Envelope(request).to_json()
    assert json.loads(Envelope(MeasureRequest(workload="mlp", config={}, backend="emulated", usable_bytes=1 << 30,
                                              options={"learning_rate": 0.5})).to_json())["request"]["options"] == {
        "learning_rate": 0.5}


# ================================================================ 6, 7 (low): empty and too long folders

@pytest.mark.parametrize("args", [["search", *SIM, "--model", "mlp", "--trials", "1"], ["list"],
                                  ["best", "--study", "s"], ["report", "--study", "s"]], ids=lambda a: a[0])
def test_06_an_empty_studies_dir_is_bad_input(args: list[str], tmp_path: Path) -> None:
    proc = run_cli([*args, "--studies-dir", ""], cwd=tmp_path, timeout=120)
    assert "argument --studies-dir: '' is empty (an unset variable?); give a folder" in _one_line(proc, 2)
    assert list(tmp_path.iterdir()) == []


def test_06_an_empty_reports_dir_is_bad_input(tmp_path: Path) -> None:
    for args in (["search", *SIM[:2], "--model", "mlp", "--trials", "1"], ["report", "--study", "s"]):
        proc = run_cli([*args, "--reports-dir", ""], cwd=tmp_path, timeout=120)
        assert "argument --reports-dir: '' is empty (an unset variable?); give a folder" in _one_line(proc, 2)
    assert list(tmp_path.iterdir()) == []


def _long_path(nbytes: int) -> str:
    """A relative path of about `nbytes` bytes whose names are each short enough (150 bytes)."""
    return "/".join(["d" * 150] * (nbytes // 151 + 1))


@pytest.mark.parametrize("folder, fragment", [
    (_long_path(5000), "bytes long as a full path; this system allows"),
    ("n" * 300, "holds a name of 300 bytes; this system allows 255 per name"),
    (_long_path(4000), "less 160 for the files under it"),  # the study's own files would not fit under it
], ids=["over-path-max", "over-name-max", "no-room-under-it"])
def test_07_a_studies_dir_too_long_for_the_system_is_bad_input(folder: str, fragment: str, tmp_path: Path) -> None:
    proc = run_cli(["search", *SIM, "--model", "mlp", "--trials", "1", "--studies-dir", folder], cwd=tmp_path,
                   timeout=120)
    line = _one_line(proc, 2)
    assert line.startswith("lms-tuner: argument --studies-dir: ") and fragment in line, line
    assert len(line) < 300 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["list", "--storage", "journal:{long}"],
                                  ["best", "--study", "s", "--storage", "sqlite:///{long}/s.db"]],
                         ids=["journal", "sqlite"])
def test_07_a_storage_file_too_long_for_the_system_is_bad_input(args: list[str], tmp_path: Path) -> None:
    proc = run_cli([a.format(long=_long_path(5000)) for a in args], cwd=tmp_path, timeout=120)
    line = _one_line(proc, 2)
    assert line.startswith("lms-tuner: a path is too long for this system (") and len(line) < 300, line
    assert list(tmp_path.iterdir()) == []


# ================================================================ 8 (low): a foreign study is refused by every command

def _foreign_study(tmp_path: Path, name: str = "foo") -> None:
    """A plain Optuna study where the tuner keeps its own, whose trials hold a `config` the tuner cannot read."""
    import optuna

    folder = tmp_path / "studies" / name
    folder.mkdir(parents=True)
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{folder / 'study.db'}")

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("config", {"n_tensors": "x"})
        return trial.suggest_float("a", 0, 1)

    study.optimize(objective, n_trials=2)


def test_08_report_best_and_list_refuse_a_study_lms_tuner_did_not_make(tmp_path: Path) -> None:
    _foreign_study(tmp_path)
    before = _files(tmp_path)
    said = "study 'foo' in sqlite:///{}/studies/foo/study.db was not made by lms-tuner (2 trials, no tuner settings)"
    said = said.format(tmp_path)
    for args in (["report", "--study", "foo"], ["best", "--study", "foo"], ["best", "--study", "foo", "--json"]):
        proc = run_cli(args, cwd=tmp_path, timeout=120)
        assert _one_line(proc, 2) == f"lms-tuner: {said}; lms-tuner reads only the studies it made", args
    search = run_cli(["search", *SIM, "--model", "mlp", "--study", "foo"], cwd=tmp_path, timeout=120)
    assert f"{said} and is not taken over" in _one_line(search, 2)
    listed = run_cli(["list"], cwd=tmp_path, timeout=120)
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert listed.stdout.splitlines()[1].split() == ["foo", "2", "?", "?", "-", "(not", "made", "by", "lms-tuner)"]
    assert _files(tmp_path) == before


# ================================================================ also: a full disk during `report` names the folder

def _adoptable_study(tmp_path: Path, name: str) -> None:
    """An empty study with the tuner's directions (what a search leaves when it dies right after creating it)."""
    import optuna

    (tmp_path / "studies" / name).mkdir(parents=True)
    optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / 'studies' / name / 'study.db'}",
                        directions=["maximize", "maximize"])


def test_a_full_disk_during_report_names_the_folder(tmp_path: Path) -> None:
    """The report goes to a 16 KiB tmpfs (a private mount namespace: root with unshare -m)."""
    import shutil
    import sys

    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "-m", "true"], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no private mount namespace (unshare -m, as root): cannot mount a small tmpfs")
    _adoptable_study(tmp_path, "full")
    full = tmp_path / "full"
    full.mkdir()
    script = 'mount -t tmpfs -o size=16k tmpfs "$1" && shift && exec "$@"'
    proc = subprocess.run([unshare, "-m", "sh", "-c", script, "sh", str(full), sys.executable, "-m", "tuner", "report",
                           "--study", "full", "--reports-dir", str(full)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=_env())
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (f"lms-tuner: cannot write the report in {full / 'full'}: No space left on device; make room "
                    "there or give another --reports-dir, and run the report again"), proc.stderr


def test_a_failed_atomic_write_names_its_file(tmp_path: Path) -> None:
    """write() and fsync() name no file when the disk is full: atomic_write_bytes adds its path (here: a file size
    limit, EFBIG, in a child process)."""
    import sys

    code = ("import resource, signal, sys\n"
            "from lms.config import atomic_write_bytes\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "try:\n"
            "    atomic_write_bytes(sys.argv[1], b'x' * 100_000)\n"
            "except OSError as exc:\n"
            "    print(exc.errno, exc.filename)\n")
    target = tmp_path / "out" / "big.bin"
    proc = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=60,
                          env=_env())
    import errno

    assert proc.stdout.split() == [str(errno.EFBIG), str(target)], proc.stdout + proc.stderr
    assert list((tmp_path / "out").iterdir()) == []  # no temporary file left


# ================================================================ 2 (medium): tf.saved_model.save keeps an lms.function

#: Three tf.Modules whose `train` is an lms.function (an attribute; a decorated method; one without an
#: input_signature), trained one step each with LMS (emulated swap ops: tf.numpy_function), saved, then trained
#: one more step: the figures a loaded `train` must match.
SAVE_SCRIPT = '''
import json, sys
import numpy as np
import tensorflow as tf
import lms

SPEC = [tf.TensorSpec([16, 32], tf.float32), tf.TensorSpec([16, 1], tf.float32)]
CONFIG = lms.LMSConfig(n_tensors=-1)


class Net(tf.Module):
    def __init__(self):
        rng = np.random.default_rng(0)
        self.w1 = tf.Variable(rng.normal(size=(32, 64)).astype("float32") * 0.1)
        self.w2 = tf.Variable(rng.normal(size=(64, 1)).astype("float32") * 0.1)

    def step(self, x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, self.w1))
            loss = tf.reduce_mean(tf.square(tf.matmul(h, self.w2) - y))
        g1, g2 = tape.gradient(loss, [self.w1, self.w2])
        self.w1.assign_sub(0.1 * g1)
        self.w2.assign_sub(0.1 * g2)
        return loss


class ByAttribute(Net):
    def __init__(self):
        super().__init__()
        self.train = lms.function(self.step, config=CONFIG, input_signature=SPEC, check=False)


class ByMethod(Net):
    @lms.function(config=CONFIG, input_signature=SPEC, check=False)
    def train(self, x, y):
        return self.step(x, y)


class Untyped(Net):  # no input_signature: exported for the signature it was traced with
    def __init__(self):
        super().__init__()
        self.train = lms.function(self.step, config=CONFIG, check=False)


rng = np.random.default_rng(1)
x = tf.constant(rng.normal(size=(16, 32)).astype("float32"))
y = tf.constant(rng.normal(size=(16, 1)).astype("float32"))
out = {}
for name, cls in (("attribute", ByAttribute), ("method", ByMethod), ("untyped", Untyped)):
    net = cls()
    net.train(x, y)
    assert net.train.swap_ops == "emulated" and net.train.summary.n_swapped > 0, net.train.summary
    tf.saved_model.save(net, f"{sys.argv[1]}/{name}")
    loss = net.train(x, y)
    out[name] = {"loss": float(loss), "w1": net.w1.numpy().tolist(), "swapped": net.train.summary.n_swapped}
np.save(f"{sys.argv[1]}/x.npy", x.numpy())
np.save(f"{sys.argv[1]}/y.npy", y.numpy())
print(json.dumps(out))
'''

LOAD_SCRIPT = '''
import json, sys
import numpy as np
import tensorflow as tf

x, y = (tf.constant(np.load(f"{sys.argv[1]}/{n}.npy")) for n in ("x", "y"))
out = {}
for name in ("attribute", "method", "untyped"):
    loaded = tf.saved_model.load(f"{sys.argv[1]}/{name}")
    loss = loaded.train(x, y)
    out[name] = {"loss": float(loss), "w1": loaded.w1.numpy().tolist()}
print(json.dumps(out))
'''


@pytest.mark.tf
def test_02_a_saved_lms_function_loads_as_the_plain_step_in_a_fresh_process(tmp_path: Path) -> None:
    from tests import forked_cli

    for name, text in (("save.py", SAVE_SCRIPT), ("load.py", LOAD_SCRIPT)):
        (tmp_path / name).write_text(text)
    env = dict(_env(), TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    saved = forked_cli.run_python([str(tmp_path / "save.py"), str(tmp_path)], cwd=tmp_path, env=env, timeout=300)
    assert saved.returncode == 0, saved.stderr[-3000:]
    trained = json.loads(saved.stdout.strip().splitlines()[-1])
    # a process started from nothing: no tf.numpy_function callback of the saving process exists in it
    import sys

    loaded = subprocess.run([sys.executable, str(tmp_path / "load.py"), str(tmp_path)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    again = json.loads(loaded.stdout.strip().splitlines()[-1])
    for name in ("attribute", "method", "untyped"):
        assert trained[name]["swapped"] > 0
        # LMS moves tensors, not values: the loaded plain step takes the same step from the saved weights
        assert again[name]["loss"] == trained[name]["loss"], (name, again[name]["loss"], trained[name]["loss"])
        assert again[name]["w1"] == trained[name]["w1"], name


# ================================================================ 4 (low): gradients in a loop or a nested function

MISUSE_SCRIPT = '''
import json
import numpy as np
import tensorflow as tf
import lms

CONFIG = lms.LMSConfig(n_tensors=-1)
w = tf.Variable(np.ones((8, 4), "float32"))
x = tf.constant(np.ones((16, 8), "float32"))
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :4])).batch(4)


def one_batch(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.nn.relu(tf.matmul(xb, w)) - yb))
    w.assign_sub(0.1 * tape.gradient(loss, w))
    return loss


def epoch(dataset):
    total = tf.constant(0.0)
    for xb, yb in dataset:
        total += one_batch(xb, yb)
    return total


inner = lms.function(one_batch, config=CONFIG, check=False)


def outer(xb, yb):
    return inner(xb, yb) * 2.0


def forward_only(xb, yb):
    return tf.reduce_mean(tf.matmul(xb, w))


said = {}
for name, fn, args in (("loop", epoch, (ds,)), ("nested", outer, (x[:4], x[:4, :4])),
                       ("none", forward_only, (x[:4], x[:4, :4]))):
    try:
        lms.function(fn, config=CONFIG, check=False)(*args)
        said[name] = "no error"
    except ValueError as exc:
        said[name] = str(exc)
print(json.dumps(said))
'''


@pytest.mark.tf
def test_04_gradients_in_a_loop_or_a_nested_lms_function_are_named_as_such(tmp_path: Path) -> None:
    from tests import forked_cli

    (tmp_path / "misuse.py").write_text(MISUSE_SCRIPT)
    env = dict(_env(), TF_CPP_MIN_LOG_LEVEL="2")
    proc = forked_cli.run_python([str(tmp_path / "misuse.py")], cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    limitation = ("the step computes its gradients only inside a loop or a nested function (a `for` over a dataset, "
                  "tf.while_loop, tf.cond, a tf.function or lms.function it calls); LMS rewrites only the gradients "
                  "of the decorated step's own graph: decorate the per-batch step and loop over the data outside it")
    assert said["loop"] == f"lms.function(epoch): {limitation}", said["loop"]
    assert said["nested"] == f"lms.function(outer): {limitation}", said["nested"]
    # a step with no tape at all keeps its own message
    assert said["none"].startswith("lms.function(forward_only): the step computed no gradients with "
                                   "tf.GradientTape"), said["none"]


# ================================================================ 5 (low): float and numpy budgets, numpy knob values

@pytest.mark.parametrize("budget, nbytes", [(16e9, 16_000_000_000), (0.9 * 16 * 2**30, 15_461_882_265),
                                            (np.int64(2**34), 2**34), (np.float32(2**30), 2**30)],
                         ids=["16e9", "0.9*16GiB", "np.int64", "np.float32"])
def test_05_a_float_or_numpy_budget_is_bytes_rounded_down(budget, nbytes: int) -> None:
    from lms.auto import choose_config
    from tests.synthetic import chain

    choice = choose_config(chain(4, per_sample_bytes=1024), batch=4, budget=budget, device="cpu")
    assert choice.budget_bytes == nbytes and type(choice.budget_bytes) is int


def test_05_a_numpy_integer_budget_below_a_mib_is_bytes_like_an_int() -> None:
    from lms.auto import choose_config
    from tests.synthetic import chain

    graph = chain(4, per_sample_bytes=1024)
    for budget in (500_000, np.int64(500_000)):
        assert choose_config(graph, batch=4, budget=budget, device="cpu").budget_bytes == 500_000


@pytest.mark.parametrize("budget, message", [
    (float("inf"), "budget inf is not a finite number of bytes"),
    (float("nan"), "budget nan is not a finite number of bytes"),
    (b"16GiB", "budget b'16GiB' (bytes) is not a size"),
    ([16], "budget [16] (list) is not a size"),
])
def test_05_a_budget_of_another_type_is_named(budget, message: str) -> None:
    from lms.sizes import SizeError, parse_size

    with pytest.raises(SizeError) as info:
        parse_size(budget, what="budget")
    assert str(info.value).startswith(message), str(info.value)


def test_05_lms_config_takes_numpy_integers_and_names_the_type_it_refuses() -> None:
    from lms.config import LMSConfig

    config = LMSConfig(lb=np.int64(3), n_tensors=np.int32(5), ub=np.uint16(40), sync_mode=np.int64(1))
    assert (config.lb, config.n_tensors, config.ub, config.sync_mode) == (3, 5, 40, 1)
    assert {type(v) for v in (config.lb, config.n_tensors, config.ub, config.sync_mode)} == {int}
    assert json.loads(config.to_json())["config"]["lb"] == 3
    assert config == LMSConfig(lb=3, n_tensors=5, ub=40, sync_mode=1)
    with pytest.raises(ValueError, match=r"^LMSConfig.lb=3.0: must be an integer \(got float\)$"):
        LMSConfig(lb=3.0)
    with pytest.raises(ValueError, match=r"^LMSConfig.lb='3': must be an integer \(got str\)$"):
        LMSConfig(lb="3")


def test_08_report_reads_a_screening_study_only_when_the_search_made_it_one(tmp_path: Path, seed_graph) -> None:
    """Neighbour of 8: `<study>.simulated` beside a study is read as its screening only when a measured search of
    that study made it (a foreign one made report fail like 8); a real one still shows."""
    import optuna

    seed_graph(tmp_path / "studies", "m")
    measured = run_cli(["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "1GiB", "--study", "m",
                        "--trials", "1", "--screen-trials", "2", "--confirm", "0", "--no-report", "-q"],
                       cwd=tmp_path, env={"LMS_TUNER_FAULT": "ok@*"}, timeout=300)
    assert measured.returncode == 0, measured.stderr[-3000:]
    proc = run_cli(["report", "--study", "m"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "of the simulated screening study m.simulated" in (tmp_path / "reports" / "m" / "index.html").read_text()
    # an empty study the tuner may adopt, beside a plain Optuna study named as its screening
    _adoptable_study(tmp_path, "e")
    storage = f"sqlite:///{tmp_path / 'studies' / 'e' / 'study.db'}"
    other = optuna.create_study(study_name="e.simulated", storage=storage, directions=["maximize", "maximize"])
    other.optimize(lambda t: (t.set_user_attr("config", {"n_tensors": "x"}), t.suggest_float("a", 0, 1), 1.0)[1:],
                   n_trials=2)
    proc = run_cli(["report", "--study", "e"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("study 'e.simulated' is not the screening study of study 'e' (lms-tuner did not make it so); the report "
            "leaves it out") in proc.stderr
    assert "e.simulated" not in (tmp_path / "reports" / "e" / "index.html").read_text()
