"""Round three of the real-world corpus (issue 55, `tests/tf/realworld3.py`): bitwise under every config class.

Each pattern trains `tests.tf.realworld.K_STEPS` steps under plain ``tf.function`` (or plain ``fit``) and
under LMS with each configuration class of `tests.tf.realworld2.CONFIG_CLASSES`; losses and every model,
optimizer and metric variable must be equal bit for bit, and LMS must have done something the check
left alone: a run where the check dropped swaps ("LMS did nothing" at the extreme) fails here, it is not
counted as bitwise. ConvNeXt's grouped-conv block runs every class with emulated and with device swap ops
(the emulated ops once told Grappler more of a shape than it knew, and the check dropped every swap);
the others alternate.
"""

from __future__ import annotations

import gc

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import lms  # noqa: E402
from tests.tf import realworld, realworld3  # noqa: E402
from tests.tf.realworld2 import CONFIG_CLASSES  # noqa: E402

pytestmark = [pytest.mark.tf, pytest.mark.slow]

PROGRAMS = {**realworld3.LOOPS, **realworld3.FITS}


def _cases():
    for i, name in enumerate(PROGRAMS):
        for j, cls in enumerate(CONFIG_CLASSES):
            emulates = (True, False) if name == "convnext_grouped" else ((i + j) % 2 == 0,)
            for emulate in emulates:
                yield pytest.param(name, cls, emulate, id=f"{name}-{cls}-{'emulated' if emulate else 'device'}")


@pytest.fixture(scope="module")
def built():
    cache: dict = {}

    def get(name):
        if name not in cache:
            program = PROGRAMS[name]()
            baseline = program.run(tf.function)[0] if isinstance(program, realworld.Loop) else program.run()[0]
            cache[name] = (program, baseline)
        return cache[name]

    yield get
    cache.clear()
    gc.collect()


@pytest.mark.parametrize("name,cls,emulate", list(_cases()))
def test_round_three_trains_bitwise_with_lms_doing_something(built, name, cls, emulate):
    program, baseline = built(name)
    config = lms.LMSConfig(**CONFIG_CLASSES[cls])
    if isinstance(program, realworld.Loop):
        got, step = program.run(lambda f: lms.function(f, config=config, emulate=emulate))
        summary = step.summary
    else:
        got, model = program.run(lambda m: lms.enable_lms(m, config, emulate=emulate))
        summary = model.lms.summary
    assert baseline.differences(got) == []
    assert summary.n_swapped > 0, summary.note
    assert summary.corrections == (), [str(c) for c in summary.corrections[:2]]
    assert summary.note == ""
    if config.recompute != "none" and name in ("convnext_grouped", "masked_text_transformer"):
        assert summary.recomputed  # a GELU MLP: cheap tensors to recompute
