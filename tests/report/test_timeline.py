"""The memory-timeline data: hand-built timelines, and the simulator on synthetic graphs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lms.config import LMSConfig
from lms.plan import plan_swaps
from lms.simulator import simulate
from tests.synthetic import MiB, chain, residual
from tuner.report.timeline import (Timeline, load_measured_series, series_from_timeline,
                                   simulated_timeline)

# Five ops with times; one swap-out during the forward pass, one swap-in in the backward pass.
HAND = {
    "op_names": ["x", "f", "lms/swap_out/f_0", "g", "lms/swap_in/f_0_0"],
    "roles": ["forward", "forward", "forward", "backward", "backward"],
    "start_s": [0.0, 1.0, 2.0, 3.0, 4.0],
    "device_bytes": [10, 30, 20, 40, 25],
    "host_bytes": [0, 0, 20, 20, 20],
    "forward_end_index": 2,
    "backward_start_index": 3,
    "events": [
        {"kind": "swap_out", "index": 2, "op": "lms/swap_out/f_0", "tensor": "f:0", "bytes": 20,
         "start_s": 2.0, "end_s": 2.5},
        {"kind": "backward_start", "index": 3, "op": "g", "tensor": "", "bytes": 0, "start_s": 3.0, "end_s": 3.0},
        {"kind": "swap_in", "index": 4, "op": "lms/swap_in/f_0_0", "tensor": "f:0", "bytes": 20,
         "start_s": 4.0, "end_s": 6.0},
    ],
}


def test_series_from_a_hand_built_timeline():
    s = series_from_timeline(HAND, label="recommended", source="simulated", batch_size=8)
    assert s.x_is_time
    # one point per op, plus the end of the step: the last copy ends at 6.0 s
    assert s.time_s.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 6.0]
    assert s.device_bytes.tolist() == [10, 30, 20, 40, 25, 25]
    assert (s.peak_bytes, s.peak_time_s, s.step_time_s) == (40, 3.0, 6.0)
    assert (s.forward_end_s, s.backward_start_s) == (3.0, 3.0)  # forward ends where the next op starts
    assert [(t.tensor, t.nbytes, t.start_s, t.end_s, t.index) for t in s.swap_outs] == [("f:0", 20, 2.0, 2.5, 2)]
    assert [(t.tensor, t.nbytes, t.start_s, t.end_s, t.index) for t in s.swap_ins] == [("f:0", 20, 4.0, 6.0, 4)]
    assert s.swapped_bytes == 20
    # a given step time later than every event sets the end
    assert series_from_timeline(HAND, label="r", source="measured", batch_size=8, step_time_s=9.0).time_s[-1] == 9.0


def test_without_times_positions_stand_in():
    untimed = {**HAND, "start_s": [0.0] * 5,
               "events": [{**e, "start_s": 0.0, "end_s": 0.0} for e in HAND["events"]]}
    s = series_from_timeline(untimed, label="r", source="simulated", batch_size=8)
    assert not s.x_is_time and s.step_time_s is None
    assert s.time_s.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert (s.swap_outs[0].start_s, s.swap_outs[0].end_s) == (2.0, 3.0)
    assert (s.swap_ins[0].start_s, s.swap_ins[0].end_s) == (4.0, 5.0)
    assert s.backward_start_s == 3.0 and s.forward_end_s == 3.0 and s.peak_time_s == 3.0


def test_bad_timelines_are_refused():
    with pytest.raises(ValueError, match="source"):
        series_from_timeline(HAND, label="r", source="guessed", batch_size=1)
    with pytest.raises(ValueError, match="5 start times but 4"):
        series_from_timeline({**HAND, "device_bytes": [1, 2, 3, 4]}, label="r", source="simulated", batch_size=1)


def test_measured_trace_file(tmp_path):
    path = tmp_path / "trial-3.json"
    path.write_text(json.dumps({**HAND, "batch_size": 16, "step_time_s": 7.0}))
    s = load_measured_series(path, label="recommended, trial #3")
    assert s.source == "measured" and s.batch_size == 16 and s.step_time_s == 7.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"start_s": [0.0], "device_bytes": [1]}))
    with pytest.raises(ValueError, match="batch_size"):
        load_measured_series(bad, label="x")
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON trace"):
        load_measured_series(bad, label="x")


def test_chain_no_lms_vs_swapping_the_first_three_known_peaks():
    """chain(6) at batch 4: x and f0..f5 are 4 MiB each, all read by the backward pass.

    No LMS holds all seven at the loss (plus the loss scalar, however the allocator
    rounds it): 28 MiB + a little. Swapping f0, f1, f2 leaves x, f3, f4, f5 on the
    device then: exactly 12 MiB less.
    """
    graph = chain(6)
    tl = simulated_timeline(graph, [("no LMS", LMSConfig(n_tensors=0)),
                                    ("recommended", LMSConfig(n_tensors=3, lb=1))], batch=4)
    base, rec = tl.series
    assert 7 * 4 * MiB < base.peak_bytes < 7 * 4 * MiB + 4096
    assert base.peak_bytes - rec.peak_bytes == 3 * 4 * MiB
    assert base.peak_bytes == simulate(graph, None, batch=4).peak_device_bytes
    assert rec.peak_bytes == simulate(graph, LMSConfig(n_tensors=3, lb=1), batch=4).peak_device_bytes
    assert (base.swap_outs, base.swap_ins) == ((), ())
    assert [t.tensor for t in rec.swap_outs] == ["f0:0", "f1:0", "f2:0"]  # forward order
    assert [t.tensor for t in rec.swap_ins] == ["f2:0", "f1:0", "f0:0"]  # backward order
    assert all(t.nbytes == 4 * MiB for t in rec.swap_outs + rec.swap_ins)
    assert rec.swapped_bytes == 12 * MiB
    # swap-outs happen in the forward pass, swap-ins in the backward pass
    assert rec.backward_start_s is not None and rec.forward_end_s is not None
    assert max(t.index for t in rec.swap_outs) < rec.forward_end_s <= rec.backward_start_s
    assert min(t.index for t in rec.swap_ins) >= rec.forward_end_s
    # no device profile: positions, and the rewritten graph has 6 more ops (3 out + 3 in)
    assert not tl.x_is_time
    assert len(rec.time_s) == len(base.time_s) + 6


@pytest.mark.parametrize("blocks, n_tensors", [(1, 2), (2, -1), (3, 5)])
def test_simulated_events_match_the_plan(blocks, n_tensors):
    graph = residual(blocks)
    config = LMSConfig(n_tensors=n_tensors, lb=2)
    plan = plan_swaps(graph, config)
    tl = simulated_timeline(graph, [("recommended", config)], batch=2, device="V100-16GB")
    (s,) = tl.series
    assert tl.x_is_time and s.step_time_s is not None and s.step_time_s > 0
    assert sorted(t.tensor for t in s.swap_outs) == sorted(sw.tensor for sw in plan.swaps)
    assert len(s.swap_ins) == plan.n_swap_ins
    assert sum(t.nbytes for t in s.swap_outs) == sum(graph.tensor_bytes(sw.tensor, 2) for sw in plan.swaps)
    # every copy lies inside the step and takes time on the link
    for t in s.swap_outs + s.swap_ins:
        assert 0.0 <= t.start_s < t.end_s <= s.step_time_s
    assert np.all(np.diff(s.time_s) >= 0)
    assert isinstance(tl, Timeline)
