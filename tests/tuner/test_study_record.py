"""tuner.study.record: the study's settings record, typed, as the search writes it and its readers read it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.search import _settings_record  # noqa: PLC2701 - the writer whose output the schema must cover
from tuner.study.record import StudyRecord
from tuner.study.settings import SearchSettings
from tuner.study.storage import resolve_storage
from tuner.study.study import TUNER_ATTR, study_record

MiB = 1 << 20


def _settings(tmp_path: Path) -> SearchSettings:
    return SearchSettings(study="s", model="resnet50", model_options={"image_size": 64}, backend="emulated",
                          budget_bytes=576 * MiB, budget_source="--budget", device="cpu", trials=2, screen_trials=20,
                          storage=resolve_storage(None, "s", studies_dir=tmp_path), studies_dir=tmp_path, steps=5,
                          warmup=2, batch=16, host_budget_bytes=8 << 30, host_budget_source="--host-budget")


def test_every_key_the_search_writes_is_a_typed_field_and_reads_back(tmp_path):
    written = {**_settings_record(_settings(tmp_path)), "space": {"n_candidates": 266}, "role": "main"}
    record = StudyRecord.from_dict(written)
    assert dict(record.extra) == {}, "a key the search writes that the schema does not name"
    assert (record.model, dict(record.model_options), record.backend, record.device) == \
        ("resnet50", {"image_size": 64}, "emulated", "cpu")
    assert (record.budget_bytes, record.batch, record.safety_margin, record.host_budget_bytes) == \
        (576 * MiB, 16, 0.05, 8 << 30)
    assert (record.prefer, record.min_throughput_ratio) == ("batch", 0.8)
    assert {k: v for k, v in record.to_dict().items() if k in written} == written  # written back as written


def test_unknown_keys_survive_a_round_trip_and_a_wrong_type_is_named():
    record = StudyRecord.from_dict({"model": "mlp", "from_a_newer_tuner": [1, 2]})
    assert record.to_dict()["from_a_newer_tuner"] == [1, 2]
    for key, value, says in (("budget_bytes", 1.5, "budget_bytes=1.5: must be an integer or null"),
                             ("safety_margin", "5%", "safety_margin='5%': must be a number"),
                             ("model_options", [1], "model_options=[1]: must be an object"),
                             ("device", 7, "device=7: must be a string")):
        with pytest.raises(ValueError, match="^" + re.escape(says)):
            StudyRecord.from_dict({key: value})


def test_a_study_without_the_tuners_attribute_has_no_record():
    assert study_record({}) is None and study_record({TUNER_ATTR: "not a dict"}) is None
    assert study_record({TUNER_ATTR: {"device": "V100-16GB"}}).device == "V100-16GB"
