"""The scheduling pass gives the same answer as when its digests were recorded: same plans, orders, pins. No TF.

`lms.schedule.schedule_ops` was made faster (integer indexes, vectorized
liveness); a speed-up must not change which order is chosen or which edges
are pinned. Each case hashes the plan summary and the whole `Schedule` (order,
constraints, pins, dropped, candidate peaks, chosen) and compares with
``tests/fixtures/schedule_digests.json``, recorded from the code before the
speed-up (two graphs have a creation order that is not topological: buffers
and ops are numbered differently there). After an intended change of
behaviour, rewrite the file with ``python -m tests.test_schedule_regression``
and say why in the commit. The candidates are scored with TF's executor models
run over op indexes; a second test checks those against `executed_order`.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any, Callable

import pytest

from lms import LMSConfig, plan_swaps, rewrite_graph
from lms.graph import Graph
from lms.schedule import schedule_ops
from tests.synthetic import bn_relu_blocks, chain, diamond, long_skip, residual
from tests.test_schedule import two_branches

DIGESTS = Path(__file__).parent / "fixtures" / "schedule_digests.json"

def shuffled(graph: Graph, seed: int) -> Graph:
    """`graph` with its ops in another creation order (creation order no longer topological)."""
    ops = list(graph.ops.values())
    random.Random(seed).shuffle(ops)
    return Graph(ops, graph.tensors.values(), batch_size=graph.batch_size, name=graph.name)


GRAPHS: dict[str, Callable[[], Graph]] = {
    "chain6": lambda: chain(6), "diamond": diamond, "residual2": lambda: residual(2),
    "residual4": lambda: residual(4), "two_branches": two_branches, "long_skip6": lambda: long_skip(6),
    "bn_relu3": lambda: bn_relu_blocks(3), "bn_relu3_dropout": lambda: bn_relu_blocks(3, dropout=True),
    "residual4_shuffled": lambda: shuffled(residual(4), 0),
    "bn_relu3_dropout_shuffled": lambda: shuffled(bn_relu_blocks(3, dropout=True), 1),
}
CONFIGS: dict[str, dict[str, Any]] = {
    "memory": {"n_tensors": 0, "schedule": "memory"},
    "memory_all_lb1": {"n_tensors": -1, "lb": 1, "schedule": "memory"},
    "memory_all_lb3": {"n_tensors": -1, "lb": 3, "schedule": "memory"},
    "memory_all_sync1": {"n_tensors": -1, "lb": 3, "schedule": "memory", "sync_mode": 1},
    "memory_all_sync2": {"n_tensors": -1, "lb": 3, "schedule": "memory", "sync_mode": 2},
    "memory_all_sync3": {"n_tensors": -1, "lb": 3, "schedule": "memory", "sync_mode": 3},
    "memory_recompute": {"n_tensors": -1, "lb": 1, "schedule": "memory", "recompute": "cheap"},
    "memory_serialization": {"n_tensors": -1, "lb": 2, "schedule": "memory", "serialization": ["2:"]},
    "memory_prefetch": {"n_tensors": -1, "lb": 3, "schedule": "memory", "prefetch": "headroom"},
    "memory_prefetch_recompute": {"n_tensors": -1, "lb": 1, "schedule": "memory", "prefetch": "headroom",
                                  "recompute": "cheap"},
    "tf_sync3": {"n_tensors": -1, "lb": 3, "sync_mode": 3},
    "tf_recompute": {"n_tensors": -1, "lb": 1, "recompute": "cheap"},
}


def case_digest(graph: Graph, fields: dict[str, Any]) -> str:
    """sha256 of the plan summary and every field of the schedule but its wall time."""
    plan = plan_swaps(graph, LMSConfig(**fields))
    sched = schedule_ops(graph, plan)
    doc = {"plan": plan.summary(), "kind": sched.kind, "order": sched.order, "constraints": sched.constraints,
           "pins": sched.pins, "dropped": sched.dropped, "candidates": dict(sched.candidates),
           "chosen": sched.chosen, "batch": sched.batch, "serialized_levels": sched.serialized_levels}
    if sched.prefetch_share:
        doc["prefetch_share"] = sched.prefetch_share
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _all_digests() -> dict[str, str]:
    return {f"{g}/{c}": case_digest(make(), fields) for g, make in GRAPHS.items() for c, fields in CONFIGS.items()}


@pytest.fixture(scope="module")
def recorded() -> dict[str, str]:
    return json.loads(DIGESTS.read_text())


@pytest.mark.parametrize("graph", list(GRAPHS))
def test_plans_and_schedules_match_the_recorded_digests(graph, recorded):
    make = GRAPHS[graph]
    changed = [c for c, fields in CONFIGS.items() if case_digest(make(), fields) != recorded[f"{graph}/{c}"]]
    assert not changed, f"{graph}: plan or schedule changed for {changed}"


if __name__ == "__main__":
    DIGESTS.write_text(json.dumps(_all_digests(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {DIGESTS}")


@pytest.mark.parametrize("graph", list(GRAPHS))
def test_index_executor_model_runs_the_orders_of_executed_order(graph):
    """`ExecutorModel` (op indexes, pins merged in) and `executed_order` over `pin_graph` agree, op for op."""
    from lms.schedule import pin_graph
    from lms.schedule.models import ExecutorModel, buffer_model
    from lms.order import executed_order

    g = GRAPHS[graph]()
    plan = plan_swaps(g, LMSConfig(n_tensors=-1, lb=1, schedule="memory"))
    sched = schedule_ops(g, plan)
    rewritten = rewrite_graph(g, plan) if plan.rewrites else g
    m = buffer_model(rewritten, 4)
    executor = ExecutorModel(rewritten, m)
    for pins in ((), sched.pins, sched.pins[::2]):
        pinned = pin_graph(rewritten, pins)
        expected = tuple(executed_order(pinned, kind) for kind in ("executor", "single_threaded"))
        got = tuple(tuple(m.names[i] for i in order) for order in executor.orders(tuple(pins)))
        assert got == expected


def test_group_pairs_keeps_the_order_of_values_per_key_short_and_long():
    from lms.graph import group_pairs

    pairs = [("a", 1), ("b", 2), ("a", 3)] + [("c", i) for i in range(100)] + [("a", 4)]
    grouped = group_pairs(pairs, into={"z": ()})
    assert list(grouped) == ["z", "a", "b", "c"]
    assert grouped == {"z": (), "a": (1, 3, 4), "b": (2,), "c": tuple(range(100))}
