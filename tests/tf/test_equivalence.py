"""Issue 33's cases 1-3 are avoided by the planners, and the equivalence check catches what is not.

Each case is the issue's minimal reproduction: the step returns its gradients,
which must equal ``tf.function``'s bit for bit. ``check=False`` shows that the
planner's rules alone avoid the case (`lms.plan.anchor`, `lms.rules`); the
harmful plans injected below show that the check (`lms.tf.equivalence`) finds
and corrects what a planner would do wrong, and that they are harmful indeed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import lms  # noqa: E402
import lms.plan.swap_planner  # noqa: E402
import lms.plan.recompute_planner  # noqa: E402
import lms.tf.rewriter  # noqa: E402
from lms.tf.equivalence import optimized_differences  # noqa: E402

pytestmark = pytest.mark.tf


def distillation():
    """Case 1: CE + the KL divergence of softened softmaxes (a Mul that Grappler folds into the division)."""
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Conv2D(8, 3, strides=2, padding="same"),
                          keras.layers.Flatten(), keras.layers.Dense(10)])
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(8, 16, 16, 1)).astype("float32")
    y = np.arange(8) % 10
    t = rng.normal(size=(8, 10)).astype("float32")

    def step(x, y, t):
        with tf.GradientTape() as tape:
            s = m(x, training=True)
            loss = 0.1 * keras.losses.sparse_categorical_crossentropy(y, s, from_logits=True)[0] \
                + 0.9 * keras.losses.KLDivergence()(tf.nn.softmax(t / 10), tf.nn.softmax(s / 10)) * 100
        return tape.gradient(loss, m.trainable_variables)

    return step, (x, y, t)


def hard_swish():
    """Case 1 in MobileNetV3: ``x * relu6(x + 3) / 6``."""
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((8, 8, 2)), keras.layers.Conv2D(4, 3), keras.layers.Activation("hard_swish"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)])
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 2)).astype("float32")

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(m(x, training=True)))
        return tape.gradient(loss, m.trainable_variables)

    return step, (x,)


def nt_xent():
    """Case 2: SimCLR's NT-Xent, ``matmul(p1, transpose(p2))`` (Grappler folds the Transpose into the MatMul)."""
    keras.utils.set_random_seed(1)
    head = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8)])
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 8)).astype("float32"), rng.normal(size=(6, 8)).astype("float32")

    def step(a, b):
        with tf.GradientTape() as tape:
            p1, p2 = tf.math.l2_normalize(head(a), axis=1), tf.math.l2_normalize(head(b), axis=1)
            sim = tf.matmul(p1, tf.transpose(p2)) / 0.1
            labels = tf.range(6)
            loss = (keras.losses.sparse_categorical_crossentropy(labels, sim, from_logits=True)
                    + keras.losses.sparse_categorical_crossentropy(labels, tf.transpose(sim), from_logits=True)) / 2
        return tape.gradient(loss, head.trainable_variables)

    return step, (a, b)


def _gradient_step(m):  # noqa: ANN001, ANN202
    """A step that returns the gradients of `m`'s sparse cross-entropy (logits) on a batch."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x, training=True))
        return tape.gradient(loss, m.trainable_variables)

    return step


def vit_mlp():
    """Case 3: a ViT MLP block's GELUs, recomputed (``0.5 * x`` keeps one reader and is reassociated)."""
    keras.utils.set_random_seed(1)
    inp = keras.Input((16, 16))
    h = keras.layers.Dense(16, activation="gelu")(keras.layers.Dense(32, activation="gelu")(inp))
    m = keras.Model(inp, keras.layers.Dense(10)(keras.layers.Flatten()(h)))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 16, 16)).astype("float32"), np.arange(4)
    return _gradient_step(m), (x, y)


def convnext_block():
    """A ConvNeXt block whose depthwise convolution is a grouped ``Conv2D``: Keras runs it as an XLA-compiled
    function call, whose outputs' shapes Grappler does not know (Python does)."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 4, strides=4)(inp)
    h = keras.layers.Conv2D(16, 7, padding="same", groups=16)(x)
    h = keras.layers.Dense(16)(keras.layers.Dense(64, activation="gelu")(keras.layers.LayerNormalization()(h)))
    m = keras.Model(inp, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(keras.layers.Add()([x, h]))))
    x = np.random.default_rng(0).normal(size=(8, 32, 32, 3)).astype("float32")
    y = np.arange(8) % 10
    return _gradient_step(m), (x, y)


def _differing(step, args, fn) -> list[int]:
    expected = tf.function(step)(*args)
    got = fn(*args)
    return [i for i, (a, b) in enumerate(zip(expected, got)) if not np.array_equal(a.numpy(), b.numpy())]


@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize("emulate", [True, False], ids=["emulated", "device"])
@pytest.mark.parametrize("case, swapped, folded", [
    ("distillation", "Reshape", "gradient_tape/mul_1"),
    ("hard_swish", "Relu6", "gradient_tape/sequential_1/activation_1/mul/Mul_1"),
])
def test_a_trigger_stays_off_an_op_grappler_folds(case, swapped, folded, emulate, check):
    """The trigger was a ``Mul`` with two readers, one of them the pruned gradient of a constant divisor."""
    step, args = globals()[case]()
    fn = lms.function(step, config=lms.LMSConfig(incl_types=[swapped]), emulate=emulate, check=check)
    assert _differing(step, args, fn) == []
    (s,) = fn.summary.swapped
    assert s.trigger is not None and not s.trigger.endswith(folded.rsplit("/", 1)[1]) or s.trigger != folded
    assert fn.summary.corrections == ()  # avoided by the planner, not corrected


@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize("emulate", [True, False], ids=["emulated", "device"])
def test_a_transpose_read_by_a_matmul_is_not_swapped(emulate, check):
    step, args = nt_xent()
    fn = lms.function(step, config=lms.LMSConfig(incl_types=["Transpose"]), emulate=emulate, check=check)
    assert _differing(step, args, fn) == []
    assert fn.summary.n_swapped == 0
    assert any("Grappler reads MatMul" in k.reason for k in fn.plan.skipped if k.tensor == "transpose:0")


@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize("emulate", [True, False], ids=["emulated", "device"])
def test_gelu_recompute_keeps_grapplers_rewrites(emulate, check):
    step, args = vit_mlp()
    fn = lms.function(step, config=lms.LMSConfig(n_tensors=0, recompute="cheap"), emulate=emulate, check=check)
    assert _differing(step, args, fn) == []
    recomputed = fn.summary.recomputed
    assert recomputed and all(t.endswith("Gelu/mul_1:0") for t in recomputed)  # not the 0.5 * x of each GELU
    skipped = {k.tensor: k.reason for k in fn.plan.recompute.skipped}
    assert any(t.endswith("Gelu/mul:0") and "Grappler folds it into" in r for t, r in skipped.items())


# ---- the check fires: harmful plans are detected and corrected --------------------------------

def _harmful_trigger(monkeypatch):
    original = lms.tf.rewriter.plan_swaps

    def plan(graph, config, **kw):
        p = original(graph, config, **kw)
        (s,) = p.swaps
        si = dataclasses.replace(s.swap_ins[0], trigger="gradient_tape/mul_1")
        return dataclasses.replace(p, swaps=(dataclasses.replace(s, swap_ins=(si,)),))

    monkeypatch.setattr(lms.tf.rewriter, "plan_swaps", plan)
    return distillation(), lms.LMSConfig(incl_types=["Reshape"]), "trigger moved"


def _harmful_swap_in(monkeypatch):
    monkeypatch.setattr(lms.plan.swap_planner, "hides_rewrite", lambda *a, **k: "")
    return nt_xent(), lms.LMSConfig(incl_types=["Transpose"]), "swap-in dropped"


def _harmful_recompute(monkeypatch):
    monkeypatch.setattr(lms.plan.recompute_planner, "recompute_changes_readers", lambda *a: "")
    return vit_mlp(), lms.LMSConfig(n_tensors=0, recompute="cheap"), "recompute dropped"


@pytest.mark.parametrize("harm", ["trigger", "swap_in", "recompute"])
@pytest.mark.parametrize("emulate", [True, False], ids=["emulated", "device"])
def test_the_check_corrects_a_harmful_plan(monkeypatch, harm, emulate):
    (step, args), config, kind = globals()[f"_harmful_{harm}"](monkeypatch)
    unchecked = lms.function(step, config=config, emulate=emulate, check=False)
    differing = _differing(step, args, unchecked)
    if harm == "swap_in" and not differing:
        # the swap-in hides the Transpose from the MatMul Grappler would fold it into; on some CPUs oneDNN's
        # MatMul gives the same bits either way (an AVX2-only AMD EPYC, 2026-12-03), so there the optimized
        # graphs are the evidence (the correction's reason below) and the plan is checked to be that one
        assert [s.consumers for s in unchecked.summary.swapped if s.tensor == "transpose:0"] == [
            ("gradient_tape/MatMul/MatMul",)]
    else:
        assert differing != []  # the plan is harmful
    checked = lms.function(step, config=config, emulate=emulate)
    assert _differing(step, args, checked) == []
    corrections = checked.summary.corrections
    assert corrections and {c.kind for c in corrections} == {kind}
    assert all(c.reason for c in corrections)
    if harm == "swap_in":
        assert "FoldTransposeIntoMatMul" in corrections[0].reason  # without LMS Grappler folds it; with it, not
    if harm == "trigger":  # re-anchored, not dropped: the tensor is still swapped
        (c,) = corrections
        assert c.detail.startswith("trigger gradient_tape/mul_1 -> ")
        assert checked.summary.swapped[0].trigger == c.detail.rsplit(" -> ", 1)[1]
    assert checked.timings["check_s"] > 0


def test_optimized_differences_compare_by_value():
    """Two optimized graphs that differ only in names and in which of two equal nodes was kept are equal."""
    from tensorflow.core.framework import graph_pb2, node_def_pb2

    def graph(const_names, order):
        g = graph_pb2.GraphDef()
        for name in const_names:
            c = g.node.add(name=name, op="Const")
            c.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(1.0))
        g.node.add(name="x", op="_Arg")
        add = node_def_pb2.NodeDef(name="add", op="AddV2", input=[order[0], order[1]])
        g.node.append(add)
        return g

    plan = lms.SwapPlan(config=lms.LMSConfig())
    assert optimized_differences(graph(["a/y"], ["a/y", "x"]), graph(["b/y"], ["x", "b/y"]), plan) == []
    g = graph(["a/y"], ["a/y", "x"])
    g.node[-1].op = "Sub"
    assert [d.node for d in optimized_differences(graph(["a/y"], ["a/y", "x"]), g, plan)] == ["add", "add"]


def test_an_identity_grappler_kept_on_one_side_only_is_no_difference():
    """Seen on GPT-2 with ``recompute="cheap"``: without LMS Grappler turned a no-op ``Sum`` into an
    ``Identity``, with LMS it bypassed it; the same bits either way, but the check once dropped every
    swap and recompute of the step over it."""
    from tensorflow.core.framework import graph_pb2

    def graph(identity: bool, reader_op: str = "Neg"):
        g = graph_pb2.GraphDef()
        g.node.add(name="x", op="_Arg")
        g.node.add(name="m", op="Mul", input=["x", "x"])
        src = "m"
        if identity:
            g.node.add(name="grad/Sum_1", op="Identity", input=["m", "^x"])
            src = "grad/Sum_1"
        g.node.add(name="out", op=reader_op, input=[src])
        return g

    plan = lms.SwapPlan(config=lms.LMSConfig())
    assert optimized_differences(graph(True), graph(False), plan) == []
    assert optimized_differences(graph(False), graph(True), plan) == []
    # what is computed after the identity still counts
    assert [d.node for d in optimized_differences(graph(True), graph(False, "Abs"), plan)] == ["out", "out"]


def test_the_trial_record_carries_the_checks_corrections(monkeypatch):
    """What a tuner trial records of the step it measured (`tuner.trial`): the check's corrections, counted by
    kind, and the warning every output shows, so that a config whose plan was cut is not taken for its name."""
    from tuner.policy.records import corrections_warning
    from tuner.trial import lms_summary_record

    (step, args), config, kind = _harmful_swap_in(monkeypatch)
    fn = lms.function(step, config=config, emulate=True)
    fn(*args)
    summary = lms_summary_record(fn)
    n = len(fn.summary.corrections)
    assert n >= 1 and summary["n_corrections"] == n
    assert summary["corrections_by_kind"] == {kind: n}
    assert summary["corrections"][0]["tensor"] == fn.summary.corrections[0].tensor
    assert summary["n_swapped"] == 0 and summary["n_recomputed"] == 0  # its only swap was dropped
    assert corrections_warning(summary).startswith(
        f"the equivalence check dropped this config's whole plan, {n} correction")

    step, args = distillation()
    whole = lms.function(step, config=lms.LMSConfig(incl_types=["Reshape"]), emulate=True)
    whole(*args)
    assert "n_corrections" not in lms_summary_record(whole) and corrections_warning(lms_summary_record(whole)) == ""


# ---- the check sees the finished rewrite: the memory schedule's pins too ------------------------------------

def _pinned_residual_step():
    from tests.tf.test_inspect import ARGS, _residual_step

    return _residual_step(), ARGS


def _control_inputs(fn, args) -> int:  # noqa: ANN001
    return sum(len(op.control_inputs) for op in fn.get_concrete_function(*args).graph.get_operations())


def test_the_pins_are_checked_even_when_nothing_is_swapped(monkeypatch):
    """With ``n_tensors=0, schedule="memory"`` nothing is swapped, only ordered: the check still runs, on the
    pinned graph. Here Grappler optimizes it as without LMS: no correction, the pins stay."""
    import lms.tf.equivalence as equivalence

    calls = []
    original = equivalence.order_differences
    monkeypatch.setattr(equivalence, "order_differences", lambda *a, **k: calls.append(1) or original(*a, **k))
    step, args = _pinned_residual_step()
    fn = lms.function(step, config=lms.LMSConfig(n_tensors=0, schedule="memory"), pin_whole=False)
    fn.get_concrete_function(*args)
    assert calls == [1]
    assert fn.summary.corrections == () and fn.schedule is not None and len(fn.schedule.edges) > 5


def test_pins_that_change_what_grappler_does_are_dropped_with_a_correction(monkeypatch):
    """A schedule whose ordering edges Grappler would optimize differently (planted: the comparison reports a
    difference) is taken out again: every control input it added is gone, the step runs in TF's order."""
    import lms.tf.equivalence as equivalence
    from lms.tf.canonical import Difference

    step, args = _pinned_residual_step()
    plain = _control_inputs(tf.function(step), args)
    pinned = lms.function(step, config=lms.LMSConfig(n_tensors=0, schedule="memory"), pin_whole=False, check=False)
    assert _control_inputs(pinned, args) > plain
    planted = Difference("gradient_tape/mul_1", "Mul(a, b)", "Mul(b, c)")
    monkeypatch.setattr(equivalence, "order_differences", lambda *a, **k: [planted])
    fn = lms.function(step, config=lms.LMSConfig(n_tensors=0, schedule="memory"), pin_whole=False)
    assert _control_inputs(fn, args) == plain  # every pin taken out, TF's own control edges kept
    (c,) = fn.summary.corrections
    assert c.kind == "order dropped" and c.reason == str(planted) and c.detail.endswith("ordering edges")
    assert fn.schedule is None
    assert not fn.summary.note.startswith("LMS did nothing")  # nothing was planned to be swapped: only the order


def test_an_overlapping_maxpool_output_keeps_its_direct_edge_to_the_maxpool_gradient():
    """Issue 55's distillation, reduced: swapping the output of an overlapping MaxPool made oneDNN's MaxPoolGrad
    lose its forward op's workspace and run TF's own kernel (another argmax among equal values): the conv's
    gradients differed. The MaxPoolGrad now reads the original (the rule `ONEDNN_WORKSPACE`), bitwise."""
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Conv2D(8, 3, strides=2, padding="same"),
                          keras.layers.MaxPooling2D(pool_size=(2, 2), strides=(1, 1), padding="same"),
                          keras.layers.Flatten(), keras.layers.Dense(10)])
    rng = np.random.default_rng(0)
    x = rng.random((8, 16, 16, 1)).astype("float32")
    y = rng.integers(0, 10, (8,)).astype("int32")
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x, training=True))
        return tape.gradient(loss, m.trainable_variables)

    fn = lms.function(step, config=lms.LMSConfig(incl_types=["MaxPool"]))
    assert _differing(step, (x, y), fn) == []
    assert fn.summary.n_swapped == 0 and fn.summary.corrections == ()  # avoided by the planner, not corrected
    assert any("workspace" in k.reason for k in fn.plan.skipped)


@pytest.mark.parametrize("emulate", [True, False], ids=["emulated", "device"])
def test_swap_ops_tell_grappler_no_more_of_a_shape_than_it_knows(emulate):
    """Emulated swap-outs once put Python's static shape back (EnsureShape): below the grouped convolution
    Grappler then knew the swap-ins' shapes but not the originals', removed the gradients' no-op Reshapes
    with LMS only, and the check dropped every swap."""
    step, args = convnext_block()
    fn = lms.function(step, config=lms.LMSConfig(n_tensors=-1, lb=1), emulate=emulate)
    assert _differing(step, args, fn) == []
    assert fn.summary.corrections == ()
    assert any("layer_normalization" in s.tensor for s in fn.summary.swapped)


def test_a_swap_in_triggered_by_a_dropped_recompute_s_clone_waits_for_the_recompute_s_trigger(monkeypatch):
    """Fused swap-ins can wait for a recompute's clone; when the check dropped that recompute the swap-in kept
    the clone as its trigger, and the step failed to trace (PlanError: unknown trigger op, seen on a ConvNeXt
    block with ``recompute="cheap", fuse_swapins=True`` before the swap ops' shape fix)."""
    from lms.tf import corrections as corrections_module
    from lms.tf.equivalence import EquivalenceResult

    dropped = []

    def drop_the_triggering_recompute(graph, plain_def, model, plan, **kwargs):
        clones = {c.name: r for r in plan.recompute.recomputes for c in r.clones}
        triggered = [(si, clones[si.trigger]) for s in plan.swaps for si in s.swap_ins if si.trigger in clones]
        assert triggered, "no swap-in waits for a clone: the premise of this test is gone"
        si, r = triggered[0]
        fixes: list = []
        new = corrections_module._drop_recompute(graph, plan, r, fixes, "planted")  # noqa: SLF001
        dropped.append((si.name, r))
        return EquivalenceResult(plan=new, corrections=tuple(fixes), rounds=1)

    monkeypatch.setattr(lms.tf.rewriter, "ensure_equivalent", drop_the_triggering_recompute)
    step, args = convnext_block()
    fn = lms.function(step, config=lms.LMSConfig(recompute="cheap", fuse_swapins=True), emulate=True)
    assert _differing(step, args, fn) == []
    (name, r), = dropped
    (si,) = [i for s in fn.plan.swaps for i in s.swap_ins if i.name == name]
    assert si.trigger == r.trigger and si.trigger is not None
    assert si.strategy.endswith("+its trigger's recompute dropped by the check")
    assert r.tensor not in fn.summary.recomputed
