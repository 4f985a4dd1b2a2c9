"""Synthetic training graphs for planner/simulator tests (no TensorFlow).

`training_graph` takes a forward graph (name, type, inputs) and adds what
autodiff would: a loss, and per forward op a gradient op that reads the
incoming gradient(s) and the op's saved inputs, named ``gradient_tape/<op>/Grad``
with ``grad_of`` set, plus ``AddN`` where a tensor has several readers.
"""

from __future__ import annotations

from lms.graph import Graph, GraphBuilder, Role

MiB = 1 << 20


def training_graph(forward: list[tuple[str, str, tuple[str, ...]]], *, per_sample_bytes: int = MiB,
                   batch_size: int = 4, name: str = "synthetic") -> Graph:
    b = GraphBuilder(batch_size=batch_size, name=name)
    b.op("x", "Placeholder", per_sample_bytes=per_sample_bytes)
    readers: dict[str, list[tuple[str, int]]] = {"x": []}
    for op, typ, inputs in forward:
        b.op(op, typ, *(f"{i}:0" for i in inputs), per_sample_bytes=per_sample_bytes)
        readers[op] = []
        for k, i in enumerate(inputs):
            readers[i].append((op, k))
    last = forward[-1][0]
    b.op("loss", "Sum", f"{last}:0", shape=(), fixed_bytes=4)
    readers[last].append(("loss", 0))
    b.op("gradient_tape/loss/Fill", "Fill", "loss:0", role=Role.BACKWARD, grad_of="loss",
         per_sample_bytes=per_sample_bytes)
    grad_out = {"loss": "gradient_tape/loss/Fill"}  # op -> grad op (one output per input)

    def grad_of_tensor(op: str) -> str:
        parts = [f"{grad_out[c]}:{k}" for c, k in readers[op]]
        if len(parts) == 1:
            return parts[0]
        return b.op(f"gradient_tape/{op}/AddN", "AddN", *parts, role=Role.BACKWARD, grad_of=op,
                    per_sample_bytes=per_sample_bytes)

    for op, typ, inputs in reversed(forward):
        saved = tuple(f"{i}:0" for i in inputs if i != "x") or ("x:0",)
        name_ = f"gradient_tape/{op}/Grad"
        b.op(name_, f"{typ}Grad", grad_of_tensor(op), *saved, role=Role.BACKWARD, grad_of=op,
             per_sample_bytes=per_sample_bytes, n_outputs=len(inputs))
        grad_out[op] = name_
    return b.build()


def chain(n: int, **kw) -> Graph:
    fwd = [("f0", "Relu", ("x",))] + [(f"f{i}", "Relu", (f"f{i-1}",)) for i in range(1, n)]
    return training_graph(fwd, name=f"chain{n}", **kw)


def diamond(**kw) -> Graph:
    fwd = [("a", "Conv2D", ("x",)), ("b", "Relu", ("a",)), ("c", "Tanh", ("a",)),
           ("d", "AddV2", ("b", "c")), ("e", "Relu", ("d",))]
    return training_graph(fwd, name="diamond", **kw)


def residual(blocks: int, **kw) -> Graph:
    """`blocks` residual blocks: in -> conv1 -> relu1 -> conv2 -> add(conv2, in) -> relu."""
    fwd = [("stem", "Conv2D", ("x",))]
    prev = "stem"
    for i in range(blocks):
        p = f"block{i}"
        fwd += [(f"{p}/conv1", "Conv2D", (prev,)), (f"{p}/relu1", "Relu", (f"{p}/conv1",)),
                (f"{p}/conv2", "Conv2D", (f"{p}/relu1",)), (f"{p}/add", "AddV2", (f"{p}/conv2", prev)),
                (f"{p}/out", "Relu", (f"{p}/add",))]
        prev = f"{p}/out"
    return training_graph(fwd, name=f"residual{blocks}", **kw)


def long_skip(depth: int, **kw) -> Graph:
    """A U-Net-like skip: `enc` is read right away and again `depth` levels later."""
    fwd = [("enc", "Conv2D", ("x",)), ("m0", "Relu", ("enc",))]
    fwd += [(f"m{i}", "Relu", (f"m{i-1}",)) for i in range(1, depth)]
    fwd += [("dec", "AddV2", (f"m{depth-1}", "enc")), ("out", "Relu", ("dec",))]
    return training_graph(fwd, name=f"long_skip{depth}", **kw)


def bn_relu_blocks(blocks: int, *, dropout: bool = False, per_sample_bytes: int = MiB,
                   batch_size: int = 4) -> Graph:
    """Keras-3-like conv blocks with what their backward pass really saves.

    Forward, per block: ``conv -> BiasAdd -> Mul(scale) -> AddV2(shift) -> Relu``
    (an unfused BatchNorm's normalisation by tiny per-channel tensors), with
    ``dropout``: ``-> Mul(relu, Cast(GreaterEqual(RandomUniform)))``. Backward
    reads the BiasAdd output (BatchNorm's gradient), the Relu output
    (``ReluGrad`` and the next conv's filter gradient) and the dropout mask.
    """
    b = GraphBuilder(batch_size=batch_size, name=f"bn_relu{blocks}{'_dropout' if dropout else ''}")
    ps = per_sample_bytes
    prev = b.op("x", "Placeholder", per_sample_bytes=ps)
    saved: list[dict[str, str]] = []
    for i in range(blocks):
        p = f"block{i}"
        w = b.op(f"{p}/kernel", "Const", fixed_bytes=256)
        bias = b.op(f"{p}/bias", "Const", fixed_bytes=64)
        scale = b.op(f"{p}/bn/scale", "Const", fixed_bytes=64)
        shift = b.op(f"{p}/bn/shift", "Const", fixed_bytes=64)
        conv = b.op(f"{p}/conv", "Conv2D", prev, w, per_sample_bytes=ps)
        biased = b.op(f"{p}/BiasAdd", "BiasAdd", conv, bias, per_sample_bytes=ps)
        mul = b.op(f"{p}/bn/mul_1", "Mul", biased, scale, per_sample_bytes=ps)
        add = b.op(f"{p}/bn/add_1", "AddV2", mul, shift, per_sample_bytes=ps)
        relu = b.op(f"{p}/relu", "Relu", add, per_sample_bytes=ps)
        entry = {"in": prev, "w": w, "scale": scale, "biased": biased, "relu": relu}
        out = relu
        if dropout:
            draw = b.op(f"{p}/dropout/RandomUniform", "RandomUniform", shape=(None, 4), per_sample_bytes=ps)
            keep = b.op(f"{p}/dropout/GreaterEqual", "GreaterEqual", draw, shape=(None, 4), per_sample_bytes=ps // 4,
                        dtype="bool")
            mask = b.op(f"{p}/dropout/Cast", "Cast", keep, per_sample_bytes=ps)
            out = b.op(f"{p}/dropout/Mul", "Mul", relu, mask, per_sample_bytes=ps)
            entry["mask"] = mask
        saved.append(entry)
        prev = out
    loss = b.op("loss", "Sum", prev, shape=(), fixed_bytes=4)
    grad = b.op("gradient_tape/loss/Fill", "Fill", loss, role=Role.BACKWARD, grad_of="loss", per_sample_bytes=ps)
    for i in reversed(range(blocks)):
        p, s = f"gradient_tape/block{i}", saved[i]
        if dropout:
            grad = b.op(f"{p}/dropout/Mul", "Mul", grad, s["mask"], role=Role.BACKWARD,
                        grad_of=f"block{i}/dropout/Mul", per_sample_bytes=ps)
        grad = b.op(f"{p}/ReluGrad", "ReluGrad", grad, s["relu"], role=Role.BACKWARD, grad_of=f"block{i}/relu",
                    per_sample_bytes=ps)
        grad = b.op(f"{p}/bn/mul_1/Mul", "Mul", grad, s["scale"], role=Role.BACKWARD, grad_of=f"block{i}/bn/mul_1",
                    per_sample_bytes=ps)
        b.op(f"{p}/bn/mul_1/Mul_1", "Mul", grad, s["biased"], role=Role.BACKWARD, grad_of=f"block{i}/bn/mul_1",
             per_sample_bytes=ps)
        b.op(f"{p}/Conv2DBackpropFilter", "Conv2DBackpropFilter", s["in"], grad, role=Role.BACKWARD,
             grad_of=f"block{i}/conv", fixed_bytes=256)
        grad = b.op(f"{p}/Conv2DBackpropInput", "Conv2DBackpropInput", s["w"], grad, role=Role.BACKWARD,
                    grad_of=f"block{i}/conv", per_sample_bytes=ps)
    return b.build()


def gan_step(batch_size: int = 16, *, static: bool = True, row_bytes: int = 256 << 10) -> Graph:
    """A GAN discriminator step as extracted from a trace at a static batch (`static`) or an unknown one.

    ``z = RandomStandardNormal([B, w])`` (the batch size a Python int, as Keras 3's ``ops.shape`` gives it)
    -> generator MatMul -> Relu; ``concat([fake, x])`` (2B rows) -> discriminator MatMul -> Relu -> loss,
    and the backward pass. With `static`, the extraction sees the batch only in the input ``x``: every
    tensor after the random draw or the concatenation is fixed-size. Without it, each tensor is per-sample
    (the concatenated ones two rows per sample). The kernels lead with 2 * 16 rows, like a weight whose
    first dimension happens to be a multiple of the batch; their gradients have the kernels' shape.
    """
    b = GraphBuilder(batch_size=batch_size, name=f"gan_{'static' if static else 'symbolic'}{batch_size}")

    def rows(n: int) -> dict:  # `n` rows per sample
        if static:
            return dict(shape=(n * batch_size, row_bytes // 4), fixed_bytes=n * batch_size * row_bytes)
        return dict(shape=(None, row_bytes // 4), per_sample_bytes=n * row_bytes)

    kernel = dict(shape=(32, 8), fixed_bytes=32 * 8 * 4)
    x = b.op("x", "Placeholder", shape=(batch_size if static else None, row_bytes // 4), per_sample_bytes=row_bytes)
    g_kernel = b.op("generator/kernel", "Const", **kernel)
    d_kernel = b.op("discriminator/kernel", "Const", **kernel)
    z = b.op("random_normal", "RandomStandardNormal", **rows(1))
    g1 = b.op("generator/MatMul", "MatMul", z, g_kernel, **rows(1))
    fake = b.op("generator/Relu", "Relu", g1, **rows(1))
    both = b.op("concat", "ConcatV2", fake, x, **rows(2))
    d1 = b.op("discriminator/MatMul", "MatMul", both, d_kernel, **rows(2))
    d2 = b.op("discriminator/Relu", "Relu", d1, **rows(2))
    loss = b.op("loss", "Sum", d2, shape=(), fixed_bytes=4)
    back = dict(role=Role.BACKWARD)
    grad = b.op("gradient_tape/loss/Fill", "Fill", loss, grad_of="loss", **back, **rows(2))
    grad = b.op("gradient_tape/discriminator/ReluGrad", "ReluGrad", grad, d2, grad_of="discriminator/Relu", **back,
                **rows(2))
    b.op("gradient_tape/discriminator/MatMul_1", "MatMul", both, grad, grad_of="discriminator/MatMul", **back,
         **kernel)
    grad = b.op("gradient_tape/discriminator/MatMul", "MatMul", grad, d_kernel, grad_of="discriminator/MatMul",
                **back, **rows(2))
    grad = b.op("gradient_tape/concat/Slice", "Slice", grad, grad_of="concat", **back, **rows(1))
    grad = b.op("gradient_tape/generator/ReluGrad", "ReluGrad", grad, fake, grad_of="generator/Relu", **back,
                **rows(1))
    b.op("gradient_tape/generator/MatMul_1", "MatMul", z, grad, grad_of="generator/MatMul", **back, **kernel)
    return b.build()
