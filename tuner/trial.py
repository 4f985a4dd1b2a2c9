"""Trial worker: ``python -m tuner.trial request.json`` runs TensorFlow in its own process, one job each.

The parent's side (start, follow, stop, read the result) is `tuner.worker.run`;
the messages are `tuner.worker.protocol`. Jobs:

- `DescribeRequest`: load the workload and report its description (validates a
  user's ``module:function`` without importing their code, or TF, in the parent);
- `TraceRequest`: trace the training step and write the `lms.graph.Graph` JSON the
  simulator reads (cached by the search under ``studies/<study>/``);
- `MeasureRequest`: the max-batch search for one `LMSConfig` (`tuner.policy.batch`) and a
  timed run at the batch found, on the request's backend (`tuner.backends`:
  where tensors live, swap emulation, TensorFlow's executor).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from lms.config import atomic_write_text

from .budget import format_bytes
from .errors import BadInput
from .worker.faults import act_out, injected_fault
from .worker.oom import describe_oom
from .worker.protocol import (DescribeRequest, DescribeResult, Envelope, MeasureRequest, MeasureResult, ProtocolError,
                       TraceRequest, TraceResult)
from .policy.records import corrections_summary
from .worker.run import PARENT_PID_ENV, PARENT_PIPE_ENV, die_with_parent

__all__ = ["main", "exit_now", "import_tensorflow", "HELD_BACK", "lms_summary_record"]

log = logging.getLogger(__name__)

BAD_INPUT_EXIT = 2
#: TensorFlow's cap on pinned host memory (MB), read when it makes its GPU host allocator.
HOST_LIMIT_ENV = "TF_GPU_HOST_MEM_LIMIT_IN_MB"
#: Timed runs a trial's worker tries after its probes, each at a smaller batch than the last.
TIMED_ATTEMPTS = 2


class _Events:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fh = open(path, "a", encoding="utf-8") if path else None

    def emit(self, event: str, **fields: Any) -> None:
        if self._fh is None:
            return
        self._fh.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
        self._fh.flush()


#: Imported by Keras while TensorFlow imports, for notebooks and image galleries a worker never shows: 0.5-1.2 s
#: of each worker's start when installed (MEASURED 2026-12-04: `import tensorflow` 5.7-6.1 s, 4.9-5.5 s without).
HELD_BACK = ("IPython", "matplotlib.pyplot")


def import_tensorflow() -> Any:
    """``import tensorflow`` with the `HELD_BACK` modules unimportable meanwhile (Keras imports both under
    ``except ImportError``), importable again after: a model may use them, and keeps one it imported first."""
    held = [name for name in HELD_BACK if name not in sys.modules]
    sys.modules.update(dict.fromkeys(held))  # type: ignore[arg-type]  # None: `import name` raises ImportError
    try:
        import tensorflow as tf
    finally:
        for name in held:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    return tf


def _load_workload(request: Any) -> Any:
    from tuner.models import load_workload

    try:
        return load_workload(request.workload, **dict(request.options))
    except ValueError as exc:
        raise BadInput(_first_line(exc)) from exc
    except SystemExit as exc:  # the model's code called sys.exit() while loading: it did not load
        raise BadInput(f"cannot load model {request.workload!r}: its code called sys.exit({exc.code!r}) "
                       "while loading") from None


def _describe(request: DescribeRequest) -> DescribeResult:
    workload = _load_workload(request)
    return DescribeResult(status="ok", workload=workload.describe())


def _trace(request: TraceRequest, events: _Events) -> TraceResult:
    workload = _load_workload(request)
    events.emit("phase", phase="tracing", workload=workload.name)
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # before TF's import (worker_env sets it too)
    tf = import_tensorflow()
    from lms.tf.extract import trace_train_step

    if request.profile_batches:
        # op times as the emulated trials see them: one op at a time (set before TF starts)
        tf.config.threading.set_inter_op_parallelism_threads(1)

    start = time.monotonic()
    make_args = None
    if workload.form == "step":
        model = workload.build_model()
        traced = trace_train_step(model, workload.loss_fn, workload.make_optimizer(), workload.x_spec(),
                                  workload.y_spec(), batch_size=workload.default_batch, name=workload.name)
    else:  # the user's fit or step (`tuner.worker.programs`)
        from tuner.worker.programs import trace_program

        graph, concrete, make_args = trace_program(workload, workload.default_batch)
        traced = (graph, concrete)
    graph = traced[0]
    graph.lint()
    doc = {"schema": "tuner.graph", "schema_version": 1, "key": dict(request.key),
           "workload": workload.describe(), "tensorflow": tf.__version__,
           "trace_s": round(time.monotonic() - start, 3), "graph": graph.to_dict()}
    if request.profile_batches:
        peaks: dict[int, int] = {}
        doc["op_costs"] = _profile(traced[1], workload, list(request.profile_batches), events, peaks,
                                   make_args=make_args)
        if doc["op_costs"] and len(peaks) >= 2:
            # the plain step's allocator peaks (TF's order, one inter-op thread, as the emulated trials run):
            # where the no-LMS baseline's bracket of fresh processes starts (`tuner.policy.bracket.start_from_peaks`)
            doc["plain_peaks"] = {"batches": sorted(peaks), "peak_bytes": [peaks[b] for b in sorted(peaks)]}
    atomic_write_text(request.output, json.dumps(doc, allow_nan=False) + "\n")
    return TraceResult(status="ok", n_ops=len(graph.ops), trace_s=doc["trace_s"], tensorflow=tf.__version__,
                       op_costs=bool(doc.get("op_costs")))


def _profile(step: Any, workload: Any, batches: list[int], events: _Events,
             peaks: dict[int, int] | None = None, *, make_args: Any = None) -> dict[str, Any] | None:
    """Per-op times of the traced step on this CPU (`lms.tf.profile`), or None if profiling failed.

    At ``batches`` when two are given (the search's default: fixed batches, so
    the simulator's op times do not depend on how busy the machine was); given
    one, from it at the batch whose step takes about a second and a quarter of it
    (`lms.tf.profile.profile_batches`). Run with one inter-op thread (set in
    `_trace`), as the emulated trials run; a failed profile only costs the
    simulator its measured times (it falls back to its roofline). `peaks`, when
    given, gets each batch's allocator peak over its warm-up calls.
    """
    import tensorflow as tf

    from lms.tf.profile import profile_batches, profile_op_costs

    def step_args(batch: int) -> tuple[Any, Any]:
        x, y = workload.make_batch(batch, 0)
        return tf.convert_to_tensor(x), tf.convert_to_tensor(y)

    make_args = make_args or step_args

    start = time.monotonic()
    try:
        # two batches given: exactly those (the same op times whatever the load; see `tuner.graphs`)
        batches = batches[:2] if len(batches) >= 2 else list(profile_batches(step, make_args, batches[0]))
        events.emit("phase", phase="profiling", batches=batches)
        costs = profile_op_costs(step, make_args, batches=batches, peaks=peaks)
    except Exception as exc:  # noqa: BLE001 - any failure: no measured op times, say why
        events.emit("warning", message=f"profiling the step failed ({_first_line(exc)}); "
                    "the simulator times ops with its roofline")
        return None
    doc = costs.to_dict()
    doc["profile_s"] = round(time.monotonic() - start, 3)
    return doc


def _measure(request: MeasureRequest, events: _Events) -> MeasureResult:
    from lms.config import LMSConfig
    from tuner.backends import get_backend
    from tuner.policy.batch import Measurement, search_max_batch, search_slope, smaller_timed_batch

    workload = _load_workload(request)
    config = LMSConfig.from_dict(request.config)
    backend = get_backend(request.backend)
    from lms.tf.allocator import configure_cpu_allocator

    configure_cpu_allocator()
    if request.host_memory_limit_bytes is not None:  # read when TF makes its GPU host allocator
        os.environ.setdefault(HOST_LIMIT_ENV, str(max(1, request.host_memory_limit_bytes >> 20)))
    tf = import_tensorflow()

    program = workload.form != "step"  # the user's fit or step: their executor, threads and fixed batch
    problem = backend.configure_tensorflow(tf, memory_limit_bytes=request.device_memory_limit_bytes,
                                           user_program=program)
    if problem:
        return MeasureResult(status="error", reason=problem)
    import lms
    from lms.tf.measure import device_batch, measure_step
    from lms.tf.train import make_train_step

    device = backend.tf_device
    seed = request.seed
    usable = request.usable_bytes
    timings: dict[int, Any] = {}
    run: Any
    if workload.form == "fit":
        from tuner.worker.programs import fit_runner

        run = fit_runner(workload, config, emulate=backend.emulate, bandwidth=request.bandwidth, device=device,
                         seed=seed)
        fn = run.lms_state
    elif workload.form == "train_step":
        from tuner.worker.programs import step_runner

        fn, run = step_runner(workload, config, emulate=backend.emulate, bandwidth=request.bandwidth,
                              device=device, seed=seed)
    else:
        model = workload.build_model()
        step = make_train_step(model, workload.loss_fn, workload.make_optimizer())
        # One trace serves every probed batch: the batch dim is left unknown (the plan does not depend on it).
        # autograph=False: make_train_step has no tensor-dependent Python control flow, so AutoGraph has
        # nothing to convert (and an AutoGraph-converted planner was once 10x slower on ResNet-50).
        fn = lms.function(step, config=config, emulate=backend.emulate, bandwidth=request.bandwidth,
                          input_signature=[workload.x_spec(), workload.y_spec()], autograph=False)

        def run(batch: int, *, warmup: int, steps: int, stop_after: Any = None) -> Any:
            data = device_batch(workload.make_batch(batch, seed), device)  # one copy in the device's memory
            return measure_step(fn, [data], warmup=warmup, steps=steps, device=device,
                                executor=backend.executor, stop_after=stop_after)

    def probe(batch: int) -> Measurement:
        events.emit("probe_start", batch=batch)
        try:
            m = run(batch, warmup=request.probe_warmup, steps=request.probe_steps)
        except tf.errors.ResourceExhaustedError as exc:
            return Measurement(None, oom=True, detail=_oom(exc))
        timings[batch] = m
        return Measurement(int(m.peak_device_bytes), oom=False, step_time_s=float(m.median_step_s))

    def on_probe(p: Any) -> None:
        events.emit("probe", **p.to_dict(), usable_bytes=usable)

    if request.fixed_batch:
        return _measure_fixed(request, run, events, backend=backend, tf=tf, fn=fn)
    search = search_max_batch(
        probe, usable=usable, start=request.start_batch, cap=request.cap, resolution=request.resolution,
        max_probes=request.max_probes, slope_bytes_per_sample=request.slope_bytes_per_sample, on_probe=on_probe)
    measured_on = next((m.device_name for m in timings.values() if getattr(m, "device_name", "")), "")
    out: dict[str, Any] = {"search": search.to_dict(), "tensorflow": tf.__version__,
                           "device": backend.device_label(measured_on), "lms_summary": lms_summary_record(fn)}
    if search.batch == 0:
        oom = all(p.oom for p in search.probes)
        smallest = min(p.batch for p in search.probes)
        first = next(p for p in search.probes if p.batch == smallest)
        peak = first.peak_bytes
        out.update(status="oom" if oom else "infeasible", batch_size=0, throughput=0.0,
                   reason=(f"batch {smallest} does not fit: "
                           + ((first.detail or "out of memory") if first.oom or peak is None
                              else f"peak {format_bytes(peak, digits=1)} > usable {format_bytes(usable, digits=1)}")),
                   peak_device_bytes=peak)
        return MeasureResult(**out)
    # The timed run is longer than a probe and its peak can come out higher (TF's allocator peak moves from
    # step to step): it must fit too, else a smaller batch is timed (`smaller_timed_batch`), at most twice
    # here: past that the process's history is to blame, and the parent times the trial in a fresh process
    # (`tuner.backends.confirm.retime_in_fresh_processes`; one search's four in-process timed runs all missed).
    batch, final = search.batch, None
    for _attempt in range(TIMED_ATTEMPTS):
        events.emit("phase", phase="timing", batch=batch)
        try:
            m = run(batch, warmup=request.warmup, steps=request.steps)
        except tf.errors.ResourceExhaustedError as exc:
            m, detail = None, _oom(exc)
        else:
            detail = f"peak {format_bytes(m.peak_device_bytes, digits=1)} > usable {format_bytes(usable, digits=1)}"
        if m is not None and int(m.peak_device_bytes) <= usable:
            final = m
            break
        events.emit("timed_run_too_big", batch=batch, peak_bytes=None if m is None else int(m.peak_device_bytes),
                    detail=detail)
        batch = smaller_timed_batch(batch, None if m is None else int(m.peak_device_bytes), usable,
                                    slope_bytes_per_sample=search_slope(search.probes, request.slope_bytes_per_sample),
                                    fitted_below=[p.batch for p in search.probes if p.fits])
        if batch < 1:
            break
    if final is None:
        out.update(status="infeasible", batch_size=0, throughput=0.0, peak_device_bytes=None,
                   reason="the batches found by the search did not fit on their timed runs")
        return MeasureResult(**out)
    median = float(final.median_step_s)
    out.update(
        status="ok", reason="", batch_size=batch,
        throughput=batch / median if median > 0 else 0.0,
        step_time_median_s=median, step_time_spread_s=float(final.spread_s),
        step_times_s=tuple(float(t) for t in final.step_times_s),
        peak_device_bytes=int(final.peak_device_bytes), peak_source=str(final.peak_source),
        nvml_process_peak_bytes=final.nvml_process_peak_bytes,
        nvml_device_peak_bytes=final.nvml_device_peak_bytes,
        host_peak_rss_bytes=final.host_peak_rss_bytes,
        host_copies_peak_bytes=getattr(final, "host_copies_peak_bytes", None),
        fits_budget=int(final.peak_device_bytes) <= usable)
    return MeasureResult(**out)


def _measure_fixed(request: MeasureRequest, run: Any, events: _Events, *, backend: Any, tf: Any,
                   fn: Any) -> MeasureResult:
    """``--batch N``: one timed run at N; it fits when its peak is within the usable budget (no search)."""
    batch, usable = request.start_batch, request.usable_bytes
    events.emit("phase", phase="timing", batch=batch)
    out: dict[str, Any] = {"tensorflow": tf.__version__}
    over = (lambda peak: peak > usable) if request.stop_over_budget else None  # no later step can undo it
    try:
        m = run(batch, warmup=request.warmup, steps=request.steps, stop_after=over)
    except tf.errors.ResourceExhaustedError as exc:
        events.emit("probe", batch=batch, fits=False, peak_bytes=None, oom=True, usable_bytes=usable)
        return MeasureResult(status="oom", batch_size=0, throughput=0.0, device=backend.device_label(""),
                             reason=f"batch {batch} does not fit: {_oom(exc)}", lms_summary=lms_summary_record(fn),
                             **out)
    # after the run, not before: the step traces (and LMS plans) on its first call; before it `fn.summary`
    # is None, and every fresh-process trial recorded n_swapped=0 (issue 51)
    out["lms_summary"] = lms_summary_record(fn)
    peak = int(m.peak_device_bytes)
    fits = peak <= usable
    events.emit("probe", batch=batch, fits=fits, peak_bytes=peak, oom=False, usable_bytes=usable)
    out.update(device=backend.device_label(getattr(m, "device_name", "") or ""), peak_device_bytes=peak,
               peak_source=str(m.peak_source), fits_budget=fits, host_peak_rss_bytes=m.host_peak_rss_bytes,
               host_copies_peak_bytes=getattr(m, "host_copies_peak_bytes", None),
               nvml_process_peak_bytes=m.nvml_process_peak_bytes, nvml_device_peak_bytes=m.nvml_device_peak_bytes)
    if not fits:
        return MeasureResult(status="infeasible", batch_size=0, throughput=0.0,
                             reason=(f"batch {batch} does not fit: peak {format_bytes(peak, digits=1)} > usable "
                                     f"{format_bytes(usable, digits=1)}"), **out)
    median = float(m.median_step_s)
    return MeasureResult(status="ok", batch_size=batch, throughput=batch / median if median > 0 else 0.0,
                         step_time_median_s=median, step_time_spread_s=float(m.spread_s),
                         step_times_s=tuple(float(t) for t in m.step_times_s), **out)


def lms_summary_record(fn: Any) -> dict[str, Any]:
    """What a trial records of the LMS its step ran with: counts, whether the memory schedule ran exactly, and
    what the equivalence check corrected (`tuner.policy.records.corrections_summary`)."""
    summary = getattr(fn, "summary", None)
    if summary is None:  # not traced yet: nothing is known, not "nothing swapped"
        return {}
    data = summary.to_dict() if hasattr(summary, "to_dict") else dict(summary)
    out = {k: data[k] for k in ("n_swapped", "n_swap_ins", "swapped_bytes", "n_candidates", "swap_ops", "n_clones")
           if k in data}
    out["n_recomputed"] = len(data.get("recomputed") or ())
    out.update(corrections_summary(data.get("corrections") or ()))  # what the equivalence check changed
    if getattr(fn, "config", None) is not None and fn.config.schedule == "memory":
        # whether the memory schedule ran exactly (the executed graph pinned whole, lms.tf.exact) or
        # through the pinnable ops only, and why
        whole = getattr(fn, "pinned_whole", None)
        out["pinned_whole"] = whole is not None
        if whole is None and getattr(fn, "whole_reason", ""):
            out["whole_reason"] = fn.whole_reason[:300]
    return out


def _summary(exc: BaseException) -> str:
    """First and last line of an error: TensorFlow's "in user code:" errors put the cause on the last line."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if len(lines) <= 1:
        return _first_line(exc)
    first, last = lines[0][:150], lines[-1][:300]
    return first if first == last else f"{first} ... {last}"


def _oom(exc: BaseException) -> str:
    """What ran out (`tuner.worker.oom`): the GPU's memory, or the pinned host memory swapped tensors live in."""
    return describe_oom(str(exc), host_limit_mb=os.environ.get(HOST_LIMIT_ENV))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


_RESULT_OF = {"describe": DescribeResult, "trace": TraceResult, "measure": MeasureResult}


def main(argv: list[str] | None = None) -> int:
    """Worker entry point: ``python -m tuner.trial request.json``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tuner.trial REQUEST.json (started by the tuner)", file=sys.stderr)
        return BAD_INPUT_EXIT
    _watch_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        envelope = Envelope.from_json(Path(args[0]).read_text(encoding="utf-8"))
    except (ProtocolError, json.JSONDecodeError) as exc:
        print(f"tuner.trial: {exc}", file=sys.stderr)
        return 1
    request = envelope.request
    events = _Events(envelope.events or None)
    start = time.monotonic()
    fault = injected_fault(request.trial, confirm=request.confirm) if isinstance(request, MeasureRequest) else None
    result: Any
    try:
        if isinstance(request, DescribeRequest):
            result = _describe(request)
        elif isinstance(request, TraceRequest):
            result = _trace(request, events)
        else:
            result = act_out(fault, request, events) if fault else _measure(request, events)
    except BadInput as exc:
        result = _RESULT_OF[request.mode](status="bad_input", reason=str(exc))
    except Exception as exc:
        result = _RESULT_OF[request.mode](status="error", reason=f"{type(exc).__name__}: {_summary(exc)}")
        log.exception("worker failed")
    doc = {**result.to_dict(), "wall_s": round(time.monotonic() - start, 3)}
    if fault == "rofs":
        import errno  # test-only: the study folder turned read-only under the worker

        raise OSError(errno.EROFS, os.strerror(errno.EROFS), envelope.result)
    if envelope.result:
        atomic_write_text(envelope.result, json.dumps(doc, indent=2, allow_nan=False) + "\n")
    else:
        print(json.dumps(doc, allow_nan=False))
    return BAD_INPUT_EXIT if result.status == "bad_input" else 0


def _watch_parent() -> None:
    """Worker side: exit when the search process that started this worker is gone (`run_worker`).

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill the worker
    when its parent dies, ``kill -9`` included. (It is set here, at the
    worker's start, rather than in a ``preexec_fn``, which is unsafe with the
    parent's threads; a parent that died before the call is caught by the
    ``getppid`` check.) Everywhere, as a second line: a thread reads the pipe
    the parent holds open (`PARENT_PIPE_ENV`) and exits on end of file.
    """
    import threading

    parent = os.environ.pop(PARENT_PID_ENV, "")
    fd_text = os.environ.pop(PARENT_PIPE_ENV, "")
    die_with_parent()
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)  # the parent died before the kernel was asked to tell us
    if not fd_text.isdigit():
        return
    fd = int(fd_text)

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os._exit(1)  # the search process is gone: nobody would read this trial's result

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()



def exit_now(code: int) -> None:
    """End this worker process with `code` without the interpreter's teardown.

    Exit handlers (``atexit``, the model's and TensorFlow's) and logging still
    run and stdout/stderr are flushed; what is skipped is the interpreter's
    finalisation of every module and object TensorFlow left behind, which took
    1.9-2.0 s after a ResNet-50 64x64 step had run against 0.1 s this way
    (MEASURED, 2026-12-04, 2-core CPU), paid by every fresh process of a search.
    Only for a normal return from `main`: its result is written (atomically) by then.
    """
    import atexit

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's; elsewhere exit the usual way
    if run_exit_handlers is None:
        sys.exit(code)
    run_exit_handlers()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
