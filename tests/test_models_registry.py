"""The workload registry and loader, without TensorFlow (fast)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tuner.models import Workload, builtin_names, describe_builtins, load_workload, parse_options
from tuner.models.transformer import GPT2_SMALL_PARAMS, gpt2_param_count

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "user_model.py"

# Small option sets: make_batch stays cheap (numpy only).
SMALL = {
    "mlp": {},
    "cnn_bn": {},
    "residual": {},
    "resnet50": {"image_size": 64},
    "unet3d": {"input_size": 16, "base_filters": 4},
    "gpt2_small": {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 16, "vocab_size": 100},
}
N_CLASSES = {"mlp": 10, "cnn_bn": 10, "residual": 10, "resnet50": 1000, "unet3d": 4, "gpt2_small": 100}


def _one_line_error(spec: str, **options) -> str:
    with pytest.raises(ValueError) as info:
        load_workload(spec, **options)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_builtin_names_and_descriptions():
    assert builtin_names() == ("mlp", "cnn_bn", "residual", "resnet50", "unet3d", "gpt2_small")
    described = describe_builtins()
    assert list(described) == list(builtin_names())
    assert all(len(line) > 20 and "\n" not in line for line in described.values())


def test_default_shapes_of_the_full_size_builtins():
    shapes = {name: (w.x_shape, w.x_dtype, w.y_shape, w.y_dtype)
              for name in builtin_names() for w in [load_workload(name)]}
    assert shapes["resnet50"] == ((224, 224, 3), "float32", (), "int32")
    assert shapes["unet3d"] == ((192, 192, 192, 4), "float32", (192, 192, 192), "int32")
    assert shapes["gpt2_small"] == ((1024,), "int32", (1024,), "int32")
    assert shapes["mlp"] == ((32,), "float32", (), "int32")


@pytest.mark.parametrize("name", list(SMALL))
def test_make_batch_shapes_dtypes_and_label_ranges(name):
    w = load_workload(name, **SMALL[name])
    assert w.spec == name and w.name == name
    for batch in (1, 3):
        x, y = w.make_batch(batch, seed=1)
        w.check_batch(x, y, batch)
        assert x.shape == (batch, *w.x_shape) and x.dtype == np.dtype(w.x_dtype)
        assert y.shape == (batch, *w.y_shape) and y.dtype == np.dtype(w.y_dtype)
        assert y.min() >= 0 and y.max() < N_CLASSES[name]
        assert np.isfinite(x).all()
    x1, y1 = w.make_batch(4, seed=7)
    x2, y2 = w.make_batch(4, 7)  # seed positional, as in the contract make_batch(batch_size, seed)
    x3, _ = w.make_batch(4, seed=8)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert not np.array_equal(x1, x3)


def test_make_batch_rejects_bad_batch_size():
    w = load_workload("mlp")
    with pytest.raises(ValueError, match="batch_size=0"):
        w.make_batch(0)


def test_gpt2_labels_are_the_next_tokens():
    w = load_workload("gpt2_small", seq_len=16, vocab_size=100)
    x, y = w.make_batch(3, seed=2)
    assert np.array_equal(x[:, 1:], y[:, :-1])
    assert len(np.unique(x)) > 20  # uses the vocabulary, not a constant


def test_unet3d_masks_are_nested_shells_every_class_present():
    w = load_workload("unet3d", input_size=32, base_filters=4)
    x, y = w.make_batch(2, seed=0)
    for i in range(2):
        counts = np.bincount(y[i].ravel(), minlength=4)
        assert (counts > 0).all(), counts
        assert counts[0] > counts[1] > 0  # background dominates
    # the input carries the label: class means differ by more than the noise would
    means = [x[y == k].mean() for k in range(4)]
    assert np.ptp(means) > 0.2


def test_mlp_labels_come_from_a_fixed_teacher():
    w = load_workload("mlp", num_classes=3)
    _, y = w.make_batch(300, seed=0)
    counts = np.bincount(y, minlength=3)
    assert counts.sum() == 300 and (counts > 30).all()


def test_options_recorded_and_describe_is_json():
    w = load_workload("unet3d", input_size=32, base_filters=4)
    assert w.options == {"input_size": 32, "in_channels": 4, "n_classes": 4, "base_filters": 4,
                         "levels": 4, "learning_rate": 1e-4}
    doc = json.loads(json.dumps(w.describe()))
    assert doc["x_shape"] == [32, 32, 32, 4] and doc["spec"] == "unet3d"
    assert w.sample_bytes() == 32 ** 3 * 4 * 4 + 32 ** 3 * 4


def test_builtin_workloads_pickle():
    # The trial worker may receive a workload from its parent process.
    w = load_workload("residual")
    clone = pickle.loads(pickle.dumps(w))
    assert clone.options == w.options
    assert np.array_equal(clone.make_batch(2)[0], w.make_batch(2)[0])


def test_gpt2_param_count_formula_gives_gpt2_small():
    assert gpt2_param_count() == GPT2_SMALL_PARAMS == 124_439_808
    # embeddings 38,597,376 + 786,432, 12 blocks of 7,087,872, final LayerNorm 1,536
    assert gpt2_param_count(n_layers=0) == 50257 * 768 + 1024 * 768 + 2 * 768
    assert gpt2_param_count(n_layers=1) - gpt2_param_count(n_layers=0) == 7_087_872


# ------------------------------------------------------------ user models

def test_user_model_from_file_and_module(monkeypatch):
    monkeypatch.chdir(ROOT)
    by_path = load_workload("examples/user_model.py:make_workload", width=8)
    by_abs_path = load_workload(f"{EXAMPLE}:make_workload")
    assert isinstance(by_path, Workload) and by_path.name == "user_cnn"
    assert by_path.options["width"] == 8 and by_abs_path.options["width"] == 16
    assert by_path.spec == "examples/user_model.py:make_workload"
    by_module = load_workload("examples.user_model:make_workload", image_size=16)
    x, y = by_module.make_batch(2)
    by_module.check_batch(x, y, 2)
    assert x.shape == (2, 16, 16, 3)


def test_light_import_and_module_spec_from_cwd():
    """With TensorFlow and Keras blocked, the package imports, every built-in and the example
    load and make batches; the module spec resolves from the current folder with -P
    (no script folder on sys.path), as under the `lms-tuner` entry point."""
    code = textwrap.dedent("""
        import sys
        sys.modules["tensorflow"] = None
        sys.modules["keras"] = None
        import time
        t0 = time.perf_counter()
        import tuner.models as m
        elapsed = time.perf_counter() - t0
        for name in m.builtin_names():
            m.load_workload(name)
        m.load_workload("unet3d", input_size=16, base_filters=4).make_batch(1)
        w = m.load_workload("examples.user_model:make_workload")
        w.check_batch(*w.make_batch(2), 2)
        m.load_workload("examples/user_model.py:make_workload")
        heavy = sorted(k for k in sys.modules if k.split(".")[0] in ("tensorflow", "keras")
                       and sys.modules[k] is not None)
        print(heavy, round(elapsed, 3))
    """)
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    heavy, elapsed = out.stdout.rsplit(" ", 1)
    assert heavy == "[]"
    assert float(elapsed) < 3.0  # numpy + our modules; TensorFlow alone takes about 3.5 s


@pytest.fixture
def user_files(tmp_path):
    files = {
        "returns_dict.py": "def make():\n    return {'name': 'x'}\n",
        "broken.py": "def make(:\n    pass\n",
        "raises.py": "def make():\n    raise RuntimeError('disk\\nfull')\n",
        "bad_option.py": "def make(*, size=3):\n    raise ValueError(f'size={size} is odd')\n",
        "constant.py": "make = 3\n",
        "imports_missing.py": "import no_such_dependency_xyz\ndef make():\n    pass\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_errors_unknown_builtin_lists_the_builtins():
    message = _one_line_error("resnet51")
    assert "unknown model 'resnet51'" in message
    assert all(name in message for name in builtin_names())
    assert "package.module:function" in message


def test_errors_file_without_function():
    assert _one_line_error("examples/user_model.py") == (
        "model spec 'examples/user_model.py' names a file but no function; "
        "use 'examples/user_model.py:function_name'")


@pytest.mark.parametrize("spec", ["", "   ", ":make", "examples.user_model:"])
def test_errors_malformed_spec(spec):
    assert "'package.module:function'" in _one_line_error(spec)


def test_errors_module_not_importable():
    message = _one_line_error("no_such_pkg_xyz.models:make")
    assert "cannot import module 'no_such_pkg_xyz.models'" in message
    assert "ModuleNotFoundError" in message and "no_such_pkg_xyz" in message


def test_errors_file(user_files):
    message = _one_line_error(f"{user_files}/missing.py:make")
    assert "no such file" in message
    message = _one_line_error(f"{user_files}/broken.py:make")
    assert "broken.py" in message and "SyntaxError" in message
    message = _one_line_error(f"{user_files}/imports_missing.py:make")
    assert "ModuleNotFoundError" in message and "no_such_dependency_xyz" in message


def test_errors_attribute_missing_lists_functions(monkeypatch):
    monkeypatch.chdir(ROOT)
    message = _one_line_error("examples/user_model.py:make_workloads")
    assert "has no attribute 'make_workloads'" in message
    assert "make_workload" in message.split("defines:")[1]


def test_errors_not_callable_and_wrong_return_type(user_files):
    message = _one_line_error(f"{user_files}/constant.py:make")
    assert "is a int, not a function" in message
    message = _one_line_error(f"{user_files}/returns_dict.py:make")
    assert "returned builtins.dict; expected tuner.models.Workload" in message


def test_errors_from_user_factories_are_one_line(user_files):
    message = _one_line_error(f"{user_files}/raises.py:make")
    assert "raised RuntimeError: disk full" in message
    message = _one_line_error(f"{user_files}/bad_option.py:make", size=5)
    assert message.endswith("bad_option.py:make: size=5 is odd")
    message = _one_line_error(f"{user_files}/bad_option.py:make", colour=5)
    assert "has no option 'colour'; options: size" in message


def test_errors_unknown_option_lists_options():
    message = _one_line_error("resnet50", image_sise=64)
    assert message == ("workload 'resnet50' has no option 'image_sise'; "
                       "options: image_size, num_classes, learning_rate, momentum")


@pytest.mark.parametrize("spec, options, expected", [
    ("unet3d", {"input_size": 100}, "unet3d: option input_size=100 does not fit the model; allowed: a multiple "
                                    "of 8 (2**(levels-1), levels=4 has 3 2x poolings), e.g. 96, 104"),
    ("unet3d", {"input_size": 24, "levels": 5}, "multiple of 16"),
    ("unet3d", {"input_size": 4}, "e.g. 8"),
    ("resnet50", {"image_size": 16}, "resnet50: option image_size=16 is too small; allowed: an integer >= 32"),
    ("resnet50", {"image_size": "64"}, "resnet50: option image_size='64' must be an integer"),
    ("resnet50", {"momentum": 1.5}, "0 <= momentum < 1"),
    ("gpt2_small", {"d_model": 100}, "d_model=100 does not fit n_heads=12"),
    ("gpt2_small", {"seq_len": 2048}, "seq_len <= n_positions=1024"),
    ("gpt2_small", {"n_layers": 0}, "n_layers=0 is too small"),
    ("mlp", {"learning_rate": -1.0}, "learning_rate=-1.0 out of range"),
    ("cnn_bn", {"image_size": True}, "must be an integer"),
])
def test_errors_options_that_do_not_fit(spec, options, expected):
    assert expected in _one_line_error(spec, **options)


# ----------------------------------------------------------- the dataclass

def _fields(**changes):
    base = dict(name="w", description="", build_model=dict, loss_fn=max, make_optimizer=dict,
                x_shape=(4,), y_shape=(), x_dtype="float32", y_dtype="int32", make_batch=dict)
    base.update(changes)
    return base


@pytest.mark.parametrize("changes, expected", [
    ({"name": ""}, "Workload.name"),
    ({"x_shape": (4, 0)}, "Workload.x_shape=(4, 0): must be a tuple of positive ints"),
    ({"y_shape": "4"}, "Workload.y_shape"),
    ({"x_dtype": "float"}, "Workload.x_dtype='float': allowed dtypes are"),
    ({"build_model": None}, "Workload.build_model=None: must be callable"),
    ({"default_batch": 0}, "Workload.default_batch=0"),
    ({"options": [1]}, "Workload.options"),
])
def test_workload_validates_fields(changes, expected):
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        Workload(**_fields(**changes))


def test_workload_normalises_and_checks_batches():
    w = Workload(**_fields(x_shape=[4, 2]))
    assert w.x_shape == (4, 2) and w.options == {}
    w.check_batch(np.zeros((3, 4, 2), np.float32), np.zeros((3,), np.int32), 3)
    with pytest.raises(ValueError, match=r"gave x of shape \(3, 4, 2\) dtype float64"):
        w.check_batch(np.zeros((3, 4, 2)), np.zeros((3,), np.int32), 3)
    with pytest.raises(ValueError, match=r"gave y of shape \(2,\)"):
        w.check_batch(np.zeros((3, 4, 2), np.float32), np.zeros((2,), np.int32), 3)


def test_parse_options():
    assert parse_options(["image_size=64", "lr=0.5", "name=abc", "flag=true", "sizes=[1,2]"]) == {
        "image_size": 64, "lr": 0.5, "name": "abc", "flag": True, "sizes": [1, 2]}
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_options(["image_size"])
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_options(["1x=2"])


def test_user_model_file_imports_a_module_beside_it(tmp_path):
    """As ``python file.py`` would: the file's folder is on the import path while it loads (only then)."""
    (tmp_path / "beside_issue11.py").write_text("WIDTH = 12\n")
    (tmp_path / "model.py").write_text(
        Path(EXAMPLE).read_text() + "\n\nfrom beside_issue11 import WIDTH  # noqa: E402\n\n\n"
        "def make_beside():\n    return make_workload(width=WIDTH)\n")
    workload = load_workload(f"{tmp_path / 'model.py'}:make_beside")
    assert workload.options["width"] == 12
    assert str(tmp_path) not in sys.path
