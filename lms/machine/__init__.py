"""The machine a step runs on: what the simulator assumes of it, and what is read from it. No TensorFlow.

- `devices`: accelerator profiles for the simulator (memory, peak rates, host link; `get_device`,
  `profile_for_gpu` matching a GPU's name).
- `nvml`: GPU memory as the driver sees it (`NvmlSampler`), and the GPUs NVML lists (`gpu_inventory`).
- `hostmem`: this process's host memory (resident set size, its peak over a window).
- `reachable`: the GPU memory a TensorFlow process can reach (the tuner's default budget and
  ``config="auto"``'s).

Nothing is imported here: ``nvml`` loads nvidia-ml-py only when asked.
"""
