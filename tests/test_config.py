import json
import os
from pathlib import Path

import pytest

from lms import LMSConfig


def test_defaults_match_tflms_v1():
    c = LMSConfig()
    assert (c.n_tensors, c.lb, c.ub, c.fuse_swapins, c.ctrld_strategy, c.swap_branches,
            c.branch_threshold) == (-1, 1, 10000, False, "chain_rule", False, 0)
    assert c.incl_scopes == () and c.excl_types == ()
    assert c.enabled and not LMSConfig(n_tensors=0).enabled


@pytest.mark.parametrize("kwargs, message", [
    ({"lb": 5, "ub": 4}, "lb=5 > ub=4"),
    ({"n_tensors": -2}, "n_tensors=-2"),
    ({"ctrld_strategy": "greedy"}, "'chain_rule', 'direct_order'"),
    ({"lb": 0}, "lb=0"),
    ({"ub": 0}, "ub=0"),
    ({"branch_threshold": -1}, "branch_threshold=-1"),
    ({"lb": 1.5}, "lb=1.5: must be an integer"),
    ({"n_tensors": True}, "n_tensors=True: must be an integer"),
    ({"fuse_swapins": 1}, "fuse_swapins=1"),
    ({"incl_scopes": "conv1"}, "incl_scopes='conv1'"),
    ({"excl_types": ("",)}, "excl_types contains ''"),
])
def test_invalid_values_name_the_field(kwargs, message):
    with pytest.raises(ValueError) as err:
        LMSConfig(**kwargs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_round_trip_through_file(tmp_path):
    c = LMSConfig(n_tensors=100, lb=5, ub=20, fuse_swapins=True, ctrld_strategy="direct_order",
                  swap_branches=True, branch_threshold=20, excl_scopes=["head"], incl_types=("Relu",))
    assert c.excl_scopes == ("head",)
    path = c.save(tmp_path / "cfg.json")
    doc = json.loads(path.read_text())
    assert doc["schema"] == "lms.config" and doc["schema_version"] == 3
    assert doc["config"]["excl_scopes"] == ["head"]
    assert LMSConfig.load(path) == c
    assert LMSConfig.from_dict(c.to_dict()) == c
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_load_reads_a_recommendation_in_a_process_that_never_imported_the_tuner(tmp_path):
    """lms knows no tuner schema: the tuner's ``lms.document_schemas`` entry point registers it on first meeting."""
    import subprocess
    import sys

    doc = {"schema": "tuner.recommendation", "schema_version": 1, "config": {"n_tensors": 10, "lb": 3}}
    (tmp_path / "recommended.json").write_text(json.dumps(doc))
    code = ("import sys, lms; assert 'tuner' not in sys.modules; "
            "print(lms.LMSConfig.load(sys.argv[1]).n_tensors)")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "recommended.json")], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0 and proc.stdout.strip() == "10", proc.stderr[-500:]


def test_a_file_cannot_make_load_import_a_package_by_naming_it(tmp_path):
    """Only an entry point registered under the exact schema name is loaded; a schema naming `json.tool` is refused."""
    import subprocess
    import sys

    (tmp_path / "evil.json").write_text(json.dumps({"schema": "this.is.no.schema", "schema_version": 1,
                                                    "config": {}}))
    code = ("import sys, lms\n"
            "try:\n    lms.LMSConfig.load(sys.argv[1])\nexcept ValueError as e:\n    print('refused', e)\n"
            "print('this' in sys.modules)")
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "this").mkdir()  # an importable package named like the schema's first part
    (tmp_path / "this" / "__init__.py").write_text("")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "evil.json")], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{tmp_path}:{root}"})
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("refused") and "'this.is.no.schema'" in lines[0], proc.stderr[-500:]
    assert lines[-1] == "False"


def test_integer_fields_are_bounded():
    with pytest.raises(ValueError, match=r"LMSConfig.n_tensors=<a 1329-bit integer>: must be between"):
        LMSConfig(n_tensors=10**400)
    with pytest.raises(ValueError, match=r"LMSConfig.ub=2147483648"):
        LMSConfig.from_dict({"ub": 2**31})


def test_load_reads_a_recommendation(tmp_path):
    doc = {"schema": "tuner.recommendation", "schema_version": 1, "batch_size": 64,
           "throughput": 12.5, "config": {"n_tensors": 10, "lb": 3}}
    (tmp_path / "recommended.json").write_text(json.dumps(doc))
    assert LMSConfig.load(tmp_path / "recommended.json") == LMSConfig(n_tensors=10, lb=3)


def test_load_logs_what_a_recommendation_was_tuned_for(tmp_path, caplog):
    doc = {"schema": "tuner.recommendation", "schema_version": 1, "batch_size": 32,
           "tuned_for": {"batch_size": 32, "image_size": 512}, "config": {"n_tensors": -1, "lb": 4}}
    (tmp_path / "recommended.json").write_text(json.dumps(doc))
    with caplog.at_level("INFO", logger="lms.config"):
        assert LMSConfig.load(str(tmp_path / "recommended.json")) == LMSConfig(lb=4)
    assert [r.getMessage() for r in caplog.records] == [
        f"LMS config from {tmp_path / 'recommended.json'} was tuned for batch 32, image_size 512"]


@pytest.mark.parametrize("text, message", [
    ('{"schema": "lms.config", "schema_version": 1, "config": {"n_tensors": 3', "not valid JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"schema": "other", "schema_version": 1, "config": {}}', "key 'schema'='other'"),
    ('{"schema": "lms.config", "schema_version": 7, "config": {}}', "key 'schema_version'=7"),
    ('{"schema": "lms.config", "schema_version": 1}', "missing key 'config'"),
    ('{"schema": "lms.config", "schema_version": 1, "config": {"lbb": 3}}', "unknown LMS config key 'lbb'"),
    ('{"schema": "lms.config", "schema_version": 1, "config": {"lb": "3"}}', "'3': must be an integer"),
    ('{"schema": "lms.config", "schema_version": 1, "config": {"fuse_swapins": "yes"}}',
     "'fuse_swapins'='yes': must be true or false"),
    ('{"schema": "lms.config", "schema_version": 1, "config": {"excl_scopes": "a"}}',
     "'excl_scopes'='a': must be a list of strings"),
    ('{"schema": "lms.config", "schema_version": 1, "config": {"lb": 9, "ub": 2}}', "lb=9 > ub=2"),
    ('{"schema": "lms.config", "schema_version": 1, "extra": 1, "config": {}}', "unknown key 'extra'"),
])
def test_bad_files_give_one_line_errors(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        LMSConfig.load(path)
    assert message in str(err.value), str(err.value)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        LMSConfig.load(tmp_path / "nope.json")


def test_replace_validates():
    with pytest.raises(ValueError, match="lb=50 > ub=10"):
        LMSConfig(ub=10).replace(lb=50)


def test_saved_file_has_the_usual_mode(tmp_path):
    import os
    mask = os.umask(0o022)
    try:
        path = LMSConfig().save(tmp_path / "c.json")
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644


# ---- the scheduling knobs (schema version 2) -----------------------------------------------------

def test_scheduling_knobs_round_trip_and_default_to_tf_order(tmp_path):
    assert LMSConfig().schedule == "tf" and not LMSConfig().pins_order
    c = LMSConfig(schedule="memory", serialization=[1, "3:5", "7:"], serialization_by_size=0.5, sync_mode=3)
    assert c.serialization == (1, "3:5", "7:") and c.pins_order
    path = c.save(tmp_path / "cfg.json")
    doc = json.loads(path.read_text())
    assert doc["config"]["serialization"] == [1, "3:5", "7:"] and doc["config"]["sync_mode"] == 3
    assert LMSConfig.load(path) == c


def test_version_1_files_are_still_read_with_the_tf_order(tmp_path):
    path = tmp_path / "old.json"
    path.write_text('{"schema": "lms.config", "schema_version": 1, "config": {"n_tensors": 7, "lb": 2}}')
    c = LMSConfig.load(path)
    assert c == LMSConfig(n_tensors=7, lb=2) and c.schedule == "tf" and c.sync_mode == 0


def test_version_2_files_are_still_read_with_swap_ins_placed_by_lb(tmp_path):
    path = tmp_path / "v2.json"
    path.write_text('{"schema": "lms.config", "schema_version": 2, "config": {"n_tensors": 7, "schedule": "memory"}}')
    c = LMSConfig.load(path)
    assert c == LMSConfig(n_tensors=7, schedule="memory") and c.prefetch == "lb"


def test_prefetch_round_trips_through_a_file(tmp_path):
    c = LMSConfig(n_tensors=-1, schedule="memory", prefetch="headroom", sync_mode=1)
    path = c.save(tmp_path / "c.json")
    assert json.loads(path.read_text())["config"]["prefetch"] == "headroom"
    assert LMSConfig.load(path) == c


def test_serialization_levels_are_inclusive_and_open_ranges_reach_the_last_level():
    from lms.config import serialization_levels
    assert serialization_levels((1, "3:5", 7), 10) == (1, 3, 4, 5, 7)
    assert serialization_levels(("8:",), 10) == (8, 9)
    assert serialization_levels((12,), 10) == ()


@pytest.mark.parametrize("kwargs, message", [
    (dict(schedule="fast"), "LMSConfig.schedule='fast': allowed values are 'tf', 'memory'"),
    (dict(sync_mode=4), "LMSConfig.sync_mode=4: allowed values are 0 (off)"),
    (dict(sync_mode=-1), "LMSConfig.sync_mode=-1: allowed values are 0 (off)"),
    (dict(sync_mode=True), "LMSConfig.sync_mode=True"),
    (dict(serialization=["5:3"]), "LMSConfig.serialization contains '5:3': each entry must be a level"),
    (dict(serialization=[-1]), "LMSConfig.serialization contains -1"),
    (dict(serialization=["a"]), "LMSConfig.serialization contains 'a'"),
    (dict(serialization="1:3"), "LMSConfig.serialization='1:3': must be a list"),
    (dict(serialization_by_size=-0.5), "LMSConfig.serialization_by_size=-0.5: must be a finite number of GiB"),
    (dict(serialization_by_size="1"), "LMSConfig.serialization_by_size='1'"),
    (dict(schedule="memory", prefetch="early"), "LMSConfig.prefetch='early': allowed values are 'lb', 'headroom'"),
    (dict(prefetch="headroom"), "LMSConfig.prefetch='headroom' needs schedule='memory' (got 'tf')"),
    (dict(schedule="memory", prefetch="headroom", sync_mode=2),
     "LMSConfig.prefetch='headroom' needs asynchronous swap-ins: sync_mode=2"),
])
def test_bad_scheduling_knobs_give_one_line_errors_naming_field_value_and_allowed(kwargs, message):
    with pytest.raises(ValueError) as err:
        LMSConfig(**kwargs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_scheduling_knobs_in_a_file_name_the_key(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"schema": "lms.config", "schema_version": 2, "config": {"serialization": "1"}}')
    with pytest.raises(ValueError, match="'serialization'='1': must be a list"):
        LMSConfig.load(path)


# ---- recompute ------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["none", "cheap", ("Relu", "AddV2"), ["Mul", "BiasAdd"]])
def test_recompute_values_round_trip_through_json(tmp_path, value):
    config = LMSConfig(recompute=value)
    path = config.save(tmp_path / "c.json")
    doc = json.loads(path.read_text())
    assert doc["config"]["recompute"] == (value if isinstance(value, str) else list(value))
    loaded = LMSConfig.load(path)
    assert loaded == config and loaded.recompute == (value if isinstance(value, str) else tuple(value))


@pytest.mark.parametrize("value,match", [
    ("all", "recompute='all': allowed values are 'none', 'cheap'"),
    ([], "recompute=(\\[\\]|\\(\\)): allowed values"),
    (["RandomUniform"], "random and stateful ops are never recomputed"),
    (["ReadVariableOp"], "random and stateful"),
    (["Conv2D"], "not a cheap op type"),
    ([3], "every entry must be an op type name"),
    (True, "recompute=True"),
])
def test_bad_recompute_values_name_the_field(value, match):
    with pytest.raises(ValueError, match=match):
        LMSConfig(recompute=value)
    with pytest.raises(ValueError, match=match):
        LMSConfig.from_dict({"recompute": value})


def test_recompute_alone_enables_lms():
    assert not LMSConfig(n_tensors=0).enabled
    assert LMSConfig(n_tensors=0, recompute="cheap").enabled
