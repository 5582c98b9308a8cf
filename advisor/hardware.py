"""Probe the machine into a `HardwareProfile`.

`probe()` imports torch in the calling process (and initialises CUDA where present);
`probe_isolated()` runs it in a child so that the tuning parent holds no CUDA context.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.results import GpuInfo, HardwareProfile

__all__ = ["child_env", "probe", "probe_isolated", "usable_cores"]


def probe() -> HardwareProfile:
    import psutil
    import torch

    from advisor.peak import matmul_flops

    cuda = torch.cuda.is_available()
    return HardwareProfile(
        cpu_model=_cpu_model(),
        cores=usable_cores(),
        memory_bytes=psutil.virtual_memory().total,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_bf16=_cpu_has_bf16(),
        python_version=platform.python_version(),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cudnn_version=torch.backends.cudnn.version() if cuda else None,
        gpus=tuple(_gpu(index) for index in range(torch.cuda.device_count())) if cuda else (),
        cpu_peak_flops=matmul_flops(torch.device("cpu"), _cpu_dtypes()),
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not the machine's total."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def probe_isolated() -> HardwareProfile:
    """`probe()` in a fresh interpreter; its JSON comes back on stdout."""
    code = "from advisor.hardware import probe; print(probe().model_dump_json())"
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=child_env()
    )
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise AdvisorError(
            f"probing the hardware failed ({last}): check that torch imports "
            f"with {sys.executable} -c 'import torch'"
        )
    return HardwareProfile.model_validate_json(lines[-1])


def child_env() -> dict[str, str]:
    """The environment for advisor's child processes: unbuffered, importing this advisor."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


def _gpu(index: int) -> GpuInfo:
    import torch as _torch

    properties = _torch.cuda.get_device_properties(index)
    from advisor.peak import matmul_flops

    with _torch.cuda.device(index):
        bf16 = _torch.cuda.is_bf16_supported()
    dtypes = (_torch.float32, _torch.float16, *((_torch.bfloat16,) if bf16 else ()))
    tf32 = _torch.backends.cuda.matmul.allow_tf32
    _torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as trials run it: no TF32
    try:
        peak = matmul_flops(_torch.device("cuda", index), dtypes)
    finally:
        _torch.backends.cuda.matmul.allow_tf32 = tf32
    return GpuInfo(
        name=properties.name,
        memory_bytes=properties.total_memory,
        capability=f"{properties.major}.{properties.minor}",
        bf16=bf16,
        peak_flops=peak,
    )


def _cpu_dtypes() -> tuple[Any, ...]:
    import torch as _torch

    return (_torch.float32, _torch.bfloat16) if _cpu_has_bf16() else (_torch.float32,)


def _cpu_has_bf16() -> bool:
    import torch as _torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(_torch.cpu, name, lambda: False)() for name in checks)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
