"""The same CPU float results on every x86-64 machine with AVX2.

Training a small model is chaotic: a 1e-7 change to one step's rounding makes the demo policy's
warm-up learn addition hundreds of steps earlier or later (measured: seed 0 reached its target
in 340 steps on one machine, 960 on another; a 1e-7 weight perturbation alone moves it as
much). PyTorch's vectorised kernels and MKL's GEMMs choose their instructions per CPU (AVX2,
AVX-512), which round differently. Pinning both to their AVX2 paths (``ATEN_CPU_CAPABILITY``,
MKL's conditional numerical reproducibility ``MKL_CBWR``) gives every machine with AVX2 the same
CPU arithmetic. Both are read once, when torch and MKL start, so `pin_cpu_numerics` must run
before torch is imported; it never overrides a value the operator set. CUDA is not affected.
"""

import os
import platform
import re
import sys
from pathlib import Path

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def has_avx2() -> bool:
    """Whether this is an x86-64 CPU with AVX2 (read from ``/proc/cpuinfo``; Linux only)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        return re.search(r"\bavx2\b", Path("/proc/cpuinfo").read_text()) is not None
    except OSError:
        return False


def pin_cpu_numerics() -> bool:
    """Pin the CPU kernels to AVX2 for this process and its children; whether they are pinned.
    `RuntimeError` if torch is already imported (too late: the kernels are chosen)."""
    if not has_avx2():
        return False
    missing = {name: value for name, value in PINNED.items() if name not in os.environ}
    if missing and "torch" in sys.modules:
        raise RuntimeError("pin_cpu_numerics() must run before torch is imported")
    os.environ.update(missing)
    return all(os.environ[name] == value for name, value in PINNED.items())
