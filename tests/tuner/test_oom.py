"""What ran out (`tuner.worker.oom`): TensorFlow 2.21's own ResourceExhaustedError texts, GPU and pinned host memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tuner.worker.oom import DEVICE_OOM, HOST_OOM, describe_oom, oom_memory

# The formats of op_kernel.cc (OpKernelContext::allocate_tensor) and rendezvous_mgr.cc (SameWorkerRecvDone),
# as TF 2 functions raise them: "Graph execution error:" first, the node after.
KERNEL_GPU = ("Graph execution error:\n\nDetected at node gradient_tape/conv2_block1_1_conv/Conv2DBackpropInput "
              "defined at (most recent call last):\n  File \"train.py\", line 10, in <module>\n\n"
              "OOM when allocating tensor with shape[256,64,56,56] and type float on "
              "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n"
              "\t [[{{node gradient_tape/conv2_block1_1_conv/Conv2DBackpropInput}}]]\n"
              "Hint: If you want to see a list of allocated tensors when OOM happens, add "
              "report_tensor_allocations_upon_oom to RunOptions for current allocation info. [Op:__inference_step_1234]")
KERNEL_PINNED = ("OOM when allocating tensor with shape[256,64,112,112] and type float on "
                 "/job:localhost/replica:0/task:0/device:CPU:0 by allocator gpu_host_bfc\n\t [[{{node lms/swap_out/x}}]]")
TF1_PINNED = ("OOM when allocating tensor with shape[128,64,112,112] and type float on "
              "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cuda_host_bfc")
RECV_TO_HOST = ("Graph execution error:\n\nSameWorkerRecvDone unable to allocate output tensor. Key: "
                "/job:localhost/replica:0/task:0/device:GPU:0;9c2f3a1be0d4f7a1;"
                "/job:localhost/replica:0/task:0/device:CPU:0;edge_1803_lms/swap_out/conv1_relu/Relu_0;0:0\n"
                "\t [[{{node lms/swap_out/conv1_relu/Relu_0/_112}}]] [Op:__inference_step_1234]")
RECV_TO_GPU = ("SameWorkerRecvDone unable to allocate output tensor. Key: "
               "/job:localhost/replica:0/task:0/device:CPU:0;9c2f3a1be0d4f7a1;"
               "/job:localhost/replica:0/task:0/device:GPU:0;edge_2210_lms/swap_in/conv1_relu/Relu_0;0:0")
RECV_CPU_TO_CPU = ("SameWorkerRecvDone unable to allocate output tensor. Key: "
                   "/job:localhost/replica:0/task:0/device:CPU:1;1;/job:localhost/replica:0/task:0/device:CPU:0;"
                   "edge_7_x;0:0")


@pytest.mark.parametrize("message, memory", [
    (KERNEL_GPU, "device"), (KERNEL_PINNED, "host"), (TF1_PINNED, "host"), (RECV_TO_HOST, "host"),
    (RECV_TO_GPU, "device"), (RECV_CPU_TO_CPU, "device"), ("some other ResourceExhaustedError", "device"),
])
def test_what_ran_out(message: str, memory: str) -> None:
    assert oom_memory(message) == memory


def test_a_pinned_host_oom_is_not_reported_as_the_gpu_running_out() -> None:
    text = describe_oom(RECV_TO_HOST, host_limit_mb="16384")
    assert text.startswith(f"{HOST_OOM} (gpu_host_bfc, TF_GPU_HOST_MEM_LIMIT_IN_MB=16384; not the GPU's memory): "
                           "SameWorkerRecvDone unable to allocate output tensor.")
    assert "TF's default limit, 128 GiB" in describe_oom(KERNEL_PINNED)
    gpu = describe_oom(KERNEL_GPU)  # the line that says what, not "Graph execution error:"
    assert gpu == (f"{DEVICE_OOM}: OOM when allocating tensor with shape[256,64,56,56] and type float on "
                   "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")
    assert len(describe_oom(RECV_TO_HOST + "x" * 1000)) <= 300


@pytest.mark.tf
def test_a_real_tensorflow_oom_message_is_parsed() -> None:
    """TF 2.21 on this CPU: a tensor larger than the BFC allocator's limit, its message read like a GPU's."""
    code = ("import tensorflow as tf\n"
            "try:\n    tf.zeros([2**40], tf.float32)\n"
            "except tf.errors.ResourceExhaustedError as exc:\n    print(str(exc))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                         env={"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin"})
    message = out.stdout.strip()
    assert "OOM when allocating tensor with shape[1099511627776] and type float on " in message
    assert oom_memory(message) == "device"
    assert describe_oom(message).startswith(f"{DEVICE_OOM}: OOM when allocating tensor with shape[1099511627776]")
