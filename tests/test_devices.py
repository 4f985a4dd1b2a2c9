"""Device profiles: lookup, validation, and that each figure is sane and sourced."""

from __future__ import annotations

import pytest

from lms.machine.devices import DEVICES, GiB, DeviceProfile, get_device

GPUS = ["P100-16GB", "V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"]


def test_every_required_profile_exists():
    assert set(GPUS) | {"cpu"} <= set(DEVICES)


@pytest.mark.parametrize("name,gib", [("P100-16GB", 16), ("V100-16GB", 16), ("V100-32GB", 32),
                                      ("A100-40GB", 40), ("A100-80GB", 80), ("H100-80GB", 80),
                                      ("H200-141GB", 141)])
def test_memory_is_the_nominal_capacity(name, gib):
    assert DEVICES[name].memory_bytes == gib * GiB


@pytest.mark.parametrize("name", GPUS)
def test_gpu_figures_are_plausible_and_cited(name):
    d = DEVICES[name]
    assert 5e12 <= d.peak_flops <= 1e14  # fp32 dense, 10.6 (P100) .. 67 TFLOPS (H100/H200)
    assert 5e11 <= d.mem_bandwidth <= 5e12
    assert 1e10 <= d.link_bandwidth < d.link_peak_bandwidth <= 1e11  # effective below theoretical
    assert d.link and "datasheet" in d.source
    assert d.async_copies and d.expensive_op_bytes is None and d.kernels == "gpu"  # kernels only enqueued


def test_link_generations_are_ordered():
    assert DEVICES["P100-16GB"].link.startswith("NVLink 1.0")
    assert DEVICES["V100-16GB"].link.startswith("NVLink 2.0")
    assert DEVICES["A100-40GB"].link.startswith("PCIe 4.0")
    assert DEVICES["H100-80GB"].link.startswith("PCIe 5.0")
    # NVLink 2.0 (AC922) beats PCIe 4.0; PCIe 5.0 doubles PCIe 4.0
    assert DEVICES["V100-16GB"].link_bandwidth > DEVICES["A100-40GB"].link_bandwidth
    assert DEVICES["H100-80GB"].link_bandwidth == pytest.approx(2 * DEVICES["A100-40GB"].link_bandwidth, rel=0.01)


def test_cpu_profile_is_the_emulated_device():
    cpu = DEVICES["cpu"]
    assert not cpu.async_copies and cpu.expensive_op_bytes == 32 << 10 and cpu.kernels == "cpu"
    assert cpu.memory_bytes > 0
    # its measurements run under TF's single-threaded executor, and the simulator follows it
    assert cpu.order == "single_threaded"
    assert {d.order for name, d in DEVICES.items() if name != "cpu"} == {"executor"}


def test_profile_orders_are_the_simulators():
    from lms.machine.devices import _ORDERS
    from lms.order import ORDERS

    assert _ORDERS == ORDERS
    with pytest.raises(ValueError, match="DeviceProfile.order='lifo': allowed 'executor', 'single_threaded'"):
        DEVICES["cpu"].replace(order="lifo")


def test_simulate_takes_the_devices_order_unless_told():
    from lms.simulator import simulate
    from tests.synthetic import diamond

    g = diamond()  # its two branches b, c run in a different order under each model

    def ops(**kw):
        return simulate(g, None, batch=2, **kw).timeline.op_names

    assert ops(device="cpu") == ops(device="cpu", order="single_threaded") != ops(device="cpu", order="fifo")
    assert ops(device="V100-16GB") == ops(device="V100-16GB", order="executor") == ops() != ops(device="cpu")


@pytest.mark.parametrize("spelling", ["v100-16gb", "V100-16GB", " v100-16GB "])
def test_lookup_is_case_insensitive(spelling):
    assert get_device(spelling) is DEVICES["V100-16GB"]


def test_a_profile_is_returned_as_is():
    d = DEVICES["P100-16GB"].replace(link_bandwidth=30e9)
    assert get_device(d) is d and d.link_bandwidth == 30e9 and d.name == "P100-16GB"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        get_device("TPUv4")
    message = str(info.value)
    assert "'TPUv4'" in message and all(name in message for name in GPUS)


@pytest.mark.parametrize("field,value", [("memory_bytes", 0), ("peak_flops", -1.0), ("link_bandwidth", 0.0),
                                         ("compute_efficiency", 1.5), ("memory_efficiency", 0.0),
                                         ("op_overhead_s", -1e-6)])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"DeviceProfile.{field}="):
        DEVICES["V100-16GB"].replace(**{field: value})


def test_to_dict_round_trips():
    d = DEVICES["A100-80GB"]
    assert DeviceProfile(**d.to_dict()) == d
