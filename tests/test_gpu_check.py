"""`benchmarks/gpu_check.py` without a GPU: its parsers on synthetic and real (CPU) traces, its checks, its CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import gpu_check as gc
from lms.machine.devices import get_device

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


# ------------------------------------------------------------------ xplane -> events

def xspace(planes: list[tuple[str, list[tuple[str, int, list[tuple[str, int, int, list[str]]]]]]]) -> SimpleNamespace:
    """An XSpace-shaped object: [(plane, [(line, timestamp_ns, [(event, offset_ps, duration_ps, [stat text])])])].

    The first stat of each event is a ``ref_value`` into ``stat_metadata`` (as TF stores repeated strings), the
    rest ``str_value``.
    """
    out = []
    for plane_name, lines in planes:
        event_md, stat_md, xlines = {}, {}, []
        for line_name, ts, events in lines:
            xevents = []
            for name, offset, duration, stats in events:
                mid = event_md.setdefault(name, len(event_md) + 1)
                xstats = []
                for k, text in enumerate(stats):
                    if k == 0:
                        ref = len(stat_md) + 100
                        stat_md[ref] = text
                        xstats.append(SimpleNamespace(metadata_id=1, str_value="", ref_value=ref))
                    else:
                        xstats.append(SimpleNamespace(metadata_id=2, str_value=text, ref_value=0))
                xevents.append(SimpleNamespace(metadata_id=mid, offset_ps=offset, duration_ps=duration, stats=xstats))
            xlines.append(SimpleNamespace(name=line_name, timestamp_ns=ts, events=xevents))
        out.append(SimpleNamespace(
            name=plane_name, lines=xlines,
            event_metadata={i: SimpleNamespace(name=n) for n, i in event_md.items()},
            stat_metadata={i: SimpleNamespace(name=n) for i, n in stat_md.items()}))
    return SimpleNamespace(planes=out)


US = 1_000_000  # ps


def gpu_step(*, copy_at_us: int) -> list[gc.TraceEvent]:
    """A step on a GPU: the trigger's kernel ends at 500 us; the swap-in's H2D copy starts at `copy_at_us`."""
    return gc.events_from_xspace(xspace([
        ("/host:CPU", [("tf_Compute", 1000, [
            ("gradient_tape/block2/ReluGrad:ReluGrad", 100 * US, 20 * US, []),
            ("ExecutorState::ProcessAsync::Start", 10 * US, 1 * US, ["t-lms_swap_in_0/_13", "_Recv"]),  # waits
            ("t-lms_swap_in_0/_12:_Send", 90 * US, 1 * US, ["t-lms_swap_in_0 ; x ; /job:localhost/device:CPU:0"]),
        ])]),
        ("/device:GPU:0", [
            ("Stream #7(Compute)", 1000, [
                ("relu_grad_kernel", 450 * US, 50 * US, ["gradient_tape/block2/ReluGrad:ReluGrad"]),
                ("other_kernel", 600 * US, 50 * US, ["gradient_tape/block1/Conv2DBackpropInput:Conv2DBackpropInput"]),
            ]),
            ("Stream #9(MemcpyH2D)", 1000, [
                ("MemcpyH2D", copy_at_us * US, 30 * US, ["t-lms_swap_in_0/_12:_Recv", "size:4096"]),
                ("MemcpyH2D", 50 * US, 5 * US, ["IteratorGetNext/_3:_Recv"]),
            ]),
        ]),
    ]))


def test_events_carry_absolute_times_and_their_string_stats() -> None:
    events = gpu_step(copy_at_us=700)
    copy = next(e for e in events if e.name == "MemcpyH2D" and "lms" in e.text)
    assert (copy.start_ps, copy.end_ps) == (1000 * 1000 + 700 * US, 1000 * 1000 + 730 * US)  # line's ns + offset
    assert copy.text == "t-lms_swap_in_0/_12:_Recv ; size:4096"  # ref_value resolved, str_value kept
    assert gc.is_h2d_copy(copy) and not gc.is_h2d_copy(events[0])


SWAP = {"swap_in": "t-lms_swap_in_0", "swap_out": "lms/swap_out/t_0", "trigger": "gradient_tape/block2/ReluGrad"}


@pytest.mark.parametrize("copy_at_us, delay_us", [(700, 200.0), (300, -200.0)])
def test_a_copy_is_timed_against_its_triggers_last_kernel(copy_at_us: int, delay_us: float) -> None:
    [row] = gc.swapin_copy_delays(gpu_step(copy_at_us=copy_at_us), [SWAP])
    assert row["delay_us"] == pytest.approx(delay_us)
    assert (row["trigger_source"], row["copy_source"]) == ("gpu kernel", "gpu memcpy")


def test_a_copy_named_after_its_swap_out_counts_too_and_unknowns_stay_none() -> None:
    events = gpu_step(copy_at_us=300)
    shared = [dict(SWAP, swap_in="u-lms_swap_in_0", swap_out="t-lms_swap_in_0")]  # the edge's source is the swap-out
    assert gc.swapin_copy_delays(events, shared)[0]["delay_us"] == pytest.approx(-200.0)
    nothing = gc.swapin_copy_delays(events, [dict(SWAP, swap_in="v-lms_swap_in_0", swap_out="lms/swap_out/v_0",
                                                  trigger="no/such/op")])
    assert nothing[0]["delay_us"] is None and nothing[0]["trigger_end_us"] is None
    # prefixes are not names: t-lms_swap_in_0 is not t-lms_swap_in_01
    assert gc.swapin_copy_delays(events, [dict(SWAP, swap_in="t-lms_swap_in_", swap_out="")])[0]["copy_start_us"] \
        is None


def test_a_copy_annotated_with_its_edge_name_is_matched() -> None:
    """On a GPU the host->device memcpy carries ``CopyTensor::ViaDMA``'s annotation, not the _Recv's name."""
    events = gc.events_from_xspace(xspace([
        ("/host:CPU", [("tf_Compute", 0, [("gradient_tape/block2/ReluGrad:ReluGrad", 100 * US, 20 * US, [])])]),
        ("/device:GPU:0", [("Stream #9(MemcpyH2D)", 0, [
            ("MemcpyH2D", 300 * US, 30 * US, ["#edge_name=edge_1234_lms/swap_out/t_0#", "size:4096"]),
            ("MemcpyH2D", 200 * US, 30 * US, ["#edge_name=edge_77_lms/swap_out/t_01#"]),  # another tensor's
        ])]),
    ]))
    [row] = gc.swapin_copy_delays(events, [SWAP])
    assert (row["copy_source"], row["copy_start_us"]) == ("gpu memcpy", pytest.approx(300.0))
    assert row["delay_us"] == pytest.approx(300 - 120)


def test_without_device_copies_the_sends_start_on_the_host_is_used() -> None:
    events = [e for e in gpu_step(copy_at_us=700) if not e.plane.startswith("/device:")]
    [row] = gc.swapin_copy_delays(events, [SWAP])
    assert (row["trigger_source"], row["copy_source"]) == ("host op", "host _Send")
    assert row["delay_us"] == pytest.approx(90 - 120)  # the _Send started before the trigger op ended


# ------------------------------------------------------------------ the optimized graph

def node(name: str, op: str, *inputs: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, op=op, input=list(inputs))


def test_transposes_next_to_swap_ops_are_found_on_both_sides() -> None:
    from lms.tf.graphdefs import is_swap_op_name

    nodes = [
        node("conv1/Conv2D", "Conv2D", "x", "w"),
        node("conv1/Conv2D-0-0-TransposeNCHWToNHWC-LayoutOptimizer", "Transpose", "conv1/Conv2D", "perm"),
        node("lms/swap_out/conv1_0", "Identity", "conv1/Conv2D-0-0-TransposeNCHWToNHWC-LayoutOptimizer"),
        node("conv1-lms_swap_in_0", "Identity", "lms/swap_out/conv1_0", "^trigger"),
        node("grad-0-TransposeNHWCToNCHW-LayoutOptimizer", "Transpose", "conv1-lms_swap_in_0:0", "perm"),
        node("unrelated-Transpose", "Transpose", "conv1/Conv2D", "perm"),
    ]
    found = gc.transposes_next_to_swaps(nodes, is_swap_op_name)
    assert found == [
        {"transpose": "conv1/Conv2D-0-0-TransposeNCHWToNHWC-LayoutOptimizer", "swap": "lms/swap_out/conv1_0",
         "side": "before"},
        {"transpose": "grad-0-TransposeNHWCToNCHW-LayoutOptimizer", "swap": "conv1-lms_swap_in_0", "side": "after"}]


# ------------------------------------------------------------------ nvidia-smi and TF's log

SMI = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5b6e4c-1b2a-7c3d-9e8f-0a1b2c3d4e5f)
  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-52a3-5d41-b2f4-7a9c3e1d2b0a)
  MIG 1g.5gb      Device  1: (UUID: MIG-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)
"""
CREATED = ("2025-01-09 10:12:03.812345: I tensorflow/core/common_runtime/gpu/gpu_device.cc:2021] Created device "
           "/job:localhost/replica:0/task:0/device:GPU:0 with 78911 MB memory:  -> device: 0, name: NVIDIA H100 80GB "
           "HBM3, pci bus id: 0000:19:00.0, compute capability: 9.0")


def test_nvidia_smi_and_tensorflows_device_line_are_read() -> None:
    assert gc.parse_smi_list(SMI) == {
        "GPU-5d5b6e4c-1b2a-7c3d-9e8f-0a1b2c3d4e5f": "NVIDIA A100-SXM4-40GB",
        "MIG-c6d4f1ef-52a3-5d41-b2f4-7a9c3e1d2b0a": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        "MIG-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9": "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "GPU-11111111-2222-3333-4444-555555555555": "NVIDIA H100 80GB HBM3"}
    assert gc.parse_created_device("noise\n" + CREATED + "\nmore") == {
        "memory_mib": 78911, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "0000:19:00.0",
        "compute_capability": "9.0"}
    assert gc.parse_created_device("nothing") is None
    assert gc.same_pci_bus("0000:19:00.0", "00000000:19:00.0") and not gc.same_pci_bus("0000:19:00.0", "0:1A:00.0")


# ------------------------------------------------------------------ checks name what to fix

H100 = {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:19:00.0"}


def test_device_checks_pass_when_tf_uses_the_chosen_gpu() -> None:
    checks = gc.check_devices({"tf_gpu_names": ["NVIDIA H100 80GB HBM3"], "context_bytes": 400 << 20}, CREATED,
                              chosen=H100, smi=gc.parse_smi_list(SMI))
    assert [c.status for c in checks] == ["PASS"] * 4 and all(not c.fix for c in checks)


def test_device_checks_name_the_fix() -> None:
    other = dict(H100, pci_bus_id="00000000:3B:00.0", name="NVIDIA L4")
    checks = gc.check_devices({"tf_gpu_names": ["NVIDIA H100 80GB HBM3"], "context_bytes": 900 << 20}, CREATED,
                              chosen=other, smi={})
    assert [c.status for c in checks] == ["FAIL", "FAIL", "FAIL", "WARN"]
    assert "tuner/worker/gpus.py" in checks[0].fix and "CUDA_CONTEXT_BYTES" in checks[3].fix
    [none] = gc.check_devices({"tf_gpu_names": []}, "W gpu_device.cc:2344] Cannot dlopen some GPU libraries. x",
                              chosen=H100, smi=None)
    assert none.status == "FAIL" and "Cannot dlopen some GPU libraries" in none.detail and ".[gpu]" in none.fix


def test_the_memory_limit_is_the_budget_exactly() -> None:
    """The devices child runs under a memory_limit: TF's device and config='auto' must both take it as it is."""
    limited = CREATED.replace("with 78911 MB memory", "with 1024 MB memory")
    child = {"tf_gpu_names": ["NVIDIA H100 80GB HBM3"], "memory_limit_bytes": 1024 << 20,
             "auto_budget_bytes": 1024 << 20, "context_bytes": 400 << 20}
    checks = {c.name: c for c in gc.check_devices(child, limited, chosen=H100, smi=gc.parse_smi_list(SMI))}
    assert checks["devices: memory_limit"].status == "PASS"
    wrong = {c.name: c for c in gc.check_devices(dict(child, auto_budget_bytes=(80 << 30) - (2 << 30)), limited,
                                                 chosen=H100, smi=None)}
    assert wrong["devices: memory_limit"].status == "FAIL" and "default_gpu_budget" in wrong["devices: memory_limit"].fix
    ignored = {c.name: c for c in gc.check_devices(child, CREATED, chosen=H100, smi=None)}  # TF took the whole GPU
    assert ignored["devices: memory_limit"].status == "FAIL"


def test_lms_checks() -> None:
    off = {"peak_bytes": 10 << 30, "nvml_process_peak_bytes": 11 << 30}
    two = [{"transpose": "a", "swap": "s", "side": "before"}, {"transpose": "b", "swap": "s-in", "side": "after"}]
    good = {"peak_bytes": 6 << 30, "nvml_process_peak_bytes": 7 << 30, "swap_ops_after_grappler": 40, "n_swaps": 20,
            "transfers_gated": 20, "transfers_ungated": [], "swapin_delays": [{"delay_us": 12.0}, {"delay_us": None}],
            "transposes": two, "transposes_simulated": 2}
    assert [c.status for c in gc.check_lms(off, good)] == ["PASS"] * 5
    bad = dict(good, peak_bytes=int(9.8 * (1 << 30)), swapin_delays=[{"delay_us": -5000.0}, {"delay_us": 3.0}],
               transfers_ungated=["lms/swap_out/t_0/_12"], transposes=two[:1])
    saves, survive, gated, wait, transposes = gc.check_lms(off, bad)
    assert (saves.status, survive.status, gated.status, wait.status, transposes.status) == (
        "FAIL", "PASS", "FAIL", "FAIL", "WARN")
    assert "1 of 2 swap-in copies began before" in wait.detail and "lms/tf/apply.py" in wait.fix
    assert "20 host->device transfers depend on their trigger" in gated.detail and "1 do not" in gated.detail
    assert "put 1 Transposes" in transposes.detail and "counts 2" in transposes.detail
    assert "lms/sim/layout.py" in transposes.fix
    dropped = gc.check_lms(off, dict(good, swap_ops_after_grappler=0, n_swaps=0, n_planned=20,
                                     corrections=["swap-in dropped: x (y): z"]))[1]
    assert dropped.status == "FAIL" and "the equivalence check dropped the plan" in dropped.detail
    assert "lms/tf/canonical.py" in dropped.fix and "_grappler_do_not_remove" not in dropped.fix
    unknown = gc.check_lms(off, dict(good, swapin_delays=[{"delay_us": None}], logdir="/tmp/x"))[3]
    assert unknown.status == "WARN" and "/tmp/x" in unknown.fix
    assert gc.check_lms(off, {"error": "ResourceExhaustedError: ..."})[0].status == "FAIL"


def test_bandwidth_check_compares_with_the_profile() -> None:
    profile = get_device("H100-80GB")  # PCIe 5.0: 53.6 GB/s effective
    ok = gc.check_bandwidth({"d2h_bytes_per_s": 50e9, "h2d_bytes_per_s": 52e9, "bytes": 1}, profile=profile)[0]
    slow = gc.check_bandwidth({"d2h_bytes_per_s": 12e9, "h2d_bytes_per_s": 25e9, "bytes": 1}, profile=profile)[0]
    assert ok.status == "PASS" and slow.status == "WARN" and "H100-80GB" in slow.fix


# ------------------------------------------------------------------ the script here, on a machine without a GPU

def run_script(*args: str) -> subprocess.CompletedProcess:
    code = ("import sys, runpy; sys.modules['pynvml'] = None; "  # as on a machine without NVML, whatever this one has
            f"sys.argv = ['gpu_check.py', *{list(args)!r}]; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2() -> None:
    for args in ((), ("--dry-run",)):
        out = run_script(*args)
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip().splitlines() == [
            "gpu_check: no GPU: NVML lists none (no driver, no nvidia-ml-py, or no device); nothing measured"]
        assert "TensorFlow:" in out.stdout and "nvidia-smi -L:" in out.stdout


def test_bad_arguments_exit_2() -> None:
    out = run_script("--batch", "0")
    assert out.returncode == 2 and "--batch 0" in out.stderr
    out = run_script("--batch", "many")
    assert out.returncode == 2 and "invalid int value" in out.stderr


# ------------------------------------------------------------------ the measuring steps, on this CPU

@pytest.mark.tf
@pytest.mark.slow
def test_the_lms_step_runs_and_its_trace_parses_on_cpu(tmp_path: Path) -> None:
    """The "on" step end to end on a small model on the CPU: plan, executed graph, profiler trace, parser."""
    out = tmp_path / "on.json"
    subprocess.run([sys.executable, str(SCRIPT), "--child", "on", "--child-out", str(out), "--child-device", "CPU",
                    "--child-model", "residual", "--batch", "4"], check=True, timeout=600, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3",
                        "TF_CPU_ALLOCATOR_USE_BFC": "true", "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    doc = json.loads(out.read_text())
    assert "error" not in doc, doc
    assert doc["n_swaps"] > 0 and doc["swap_ops_after_grappler"] >= doc["n_swaps"] and doc["peak_bytes"] > 0
    assert doc["n_trace_events"] > 100
    assert doc["transposes"] == [] and doc["transposes_simulated"] == 0  # no layout optimizer on the CPU
    assert doc["transfers_gated"] == 0 and doc["transfers_ungated"] == []  # one device: no transfers
    triggered = [r for r in doc["swapin_delays"] if r["trigger"]]
    # the triggers are found in the trace (here 26 of 29: Grappler removes a few no-op Reshape triggers)
    assert triggered and sum(r["trigger_end_us"] is not None for r in triggered) >= 0.8 * len(triggered)


TWO_CPUS = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import lms
    from lms.config import LMSConfig
    from lms.tf.train import make_train_step
    from tuner.models import load_workload
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    from benchmarks import gpu_check as gc
    w = load_workload("residual")
    with tf.device("/CPU:1"):  # the model on the "device"; swaps through /CPU:0, the host
        model = w.build_model()
        fn = lms.function(make_train_step(model, w.loss_fn, w.make_optimizer()), config=LMSConfig(n_tensors=-1, lb=1),
                          emulate=False, device="/CPU:1", input_signature=[w.x_spec(), w.y_spec()], autograph=False)
        x, y = (tf.constant(a) for a in w.make_batch(4, 0))
        fn(x, y)
        logdir = tempfile.mkdtemp()
        tf.profiler.experimental.start(logdir)
        fn(x, y).numpy()
        tf.profiler.experimental.stop()
    events = []
    for p in Path(logdir).rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(p.read_bytes())
        events += gc.events_from_xspace(space)
    swaps = [{"swap_in": si.name, "swap_out": s.swap_out, "trigger": si.trigger}
             for s in fn.plan.swaps for si in s.swap_ins]
    print(json.dumps(gc.swapin_copy_delays(events, swaps)))
""")


@pytest.mark.tf
@pytest.mark.slow
def test_swap_in_copies_are_found_in_a_real_trace_between_two_devices(tmp_path: Path) -> None:
    """Two logical CPU devices partition the step as a GPU does: the parser finds each swap-in's copy (its _Send).

    And tells early from late: before the host-side gating (3a081c2) 23 of the 26 timed copies started before
    their trigger ended; since b14ecaa none does (the earliest 8 us after).
    """
    out = subprocess.run([sys.executable, "-c", TWO_CPUS], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT),
                              "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [r for r in json.loads(out.stdout.strip().splitlines()[-1]) if r["trigger"]]
    matched = [r for r in rows if r["delay_us"] is not None]
    assert rows and len(matched) >= 0.8 * len(rows), rows
    assert {r["copy_source"] for r in matched} == {"host _Send"} and {r["trigger_source"] for r in matched} == {"host op"}
    # main since b14ecaa gates the host-side swap-in: no copy starts before its trigger ended
    assert [r for r in matched if r["delay_us"] < 0] == []


# ------------------------------------------------------------------ a real trial worker

def test_a_real_trial_worker_runs_under_its_budget_and_is_checked(tmp_path: Path) -> None:
    """The trial phase runs the tuner's own worker (here on the emulated backend: no GPU) and the check reads it."""
    from tuner.worker.run import worker_env

    trial = {"workload": "cnn_bn", "options": {}, "batch": 4, "memory_limit_mib": 256,
             "config": {"n_tensors": -1, "lb": 1}}
    t = gc.run_trial(worker_env(), tmp_path, timeout_s=240, backend="emulated", trial=trial)
    assert t["status"] == "ok", t
    assert t["batch"] == 4 and t["n_swapped"] > 0 and t["usable_bytes"] == int(256 * (1 << 20) * 0.95)
    [check] = gc.check_trial(t)
    assert check.status == "PASS", check.detail
    over = dict(t, peak_device_bytes=t["usable_bytes"] + 1)
    assert gc.check_trial(over)[0].status == "FAIL"
    unlimited = dict(t, backend="gpu", tf_device_memory_mib=80000)  # TF took the whole GPU
    assert "memory_limit did not take" in gc.check_trial(unlimited)[0].fix
    assert gc.check_trial({"error": "timed out after 60 s"})[0].status == "FAIL"
