"""Environment of a measurement: the base fields plus torch version, device, threads and world size."""

from __future__ import annotations

from typing import Any

import torch

from stepscope.measure.device import device_name
from stepscope.results.environment import base_environment


def torch_environment(device: torch.device | str = "cpu", world_size: int = 1, *,
                      threads: int | None = None) -> dict[str, Any]:
    """The record's `env`; `threads` is the intra-op thread count the point ran with (None: the current one,
    which is only right when called inside the point's `cpu_threads` context)."""
    device = torch.device(device)
    env = base_environment()
    env.update({
        "torch": torch.__version__,
        "device": device.type,
        "device_name": device_name(device),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "world_size": world_size,
    })
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["gpus"] = torch.cuda.device_count()
    return env
