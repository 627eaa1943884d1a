"""CPU numerics pinned to AVX2 before torch starts: what the kernels then are, that an operator's
own choice is kept, and that pinning after torch has started is refused."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core_engine.numerics import PINNED, has_avx2, pin_cpu_numerics

ROOT = Path(__file__).resolve().parents[2]


def _fresh(code: str, **env: str) -> str:
    """``code``'s output in a new interpreter whose environment has none of `PINNED`."""
    clean = {k: v for k, v in os.environ.items() if k not in PINNED} | env
    result = subprocess.run(
        [sys.executable, "-c", code], env=clean, cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


PIN_THEN_TORCH = (
    "from core_engine.numerics import pin_cpu_numerics; import os;"
    "pinned = pin_cpu_numerics(); import torch;"
    "print(pinned, torch.backends.cpu.get_cpu_capability(), os.environ.get('MKL_CBWR'))"
)


def test_pinning_before_torch_selects_the_avx2_kernels():
    out = _fresh(PIN_THEN_TORCH)
    if has_avx2():
        assert out == "True AVX2 AVX2"
    else:  # another architecture: nothing to pin, nothing changed
        assert out.startswith("False") and "AVX2" not in out


def test_an_operators_own_choice_is_kept():
    out = _fresh(PIN_THEN_TORCH, ATEN_CPU_CAPABILITY="default", MKL_CBWR="COMPATIBLE")
    assert out == "False DEFAULT COMPATIBLE"


def test_pinning_after_torch_started_is_refused():
    if not has_avx2():
        assert not pin_cpu_numerics()
        return
    code = "import torch; from core_engine.numerics import pin_cpu_numerics; pin_cpu_numerics()"
    clean = {k: v for k, v in os.environ.items() if k not in PINNED}
    result = subprocess.run(
        [sys.executable, "-c", code], env=clean, cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode != 0 and "before torch is imported" in result.stderr


def test_this_suite_runs_pinned():
    """tests/conftest.py pins before it imports torch, as the worker's entry points do."""
    import torch

    if has_avx2():
        assert torch.backends.cpu.get_cpu_capability() == "AVX2"
        assert os.environ["MKL_CBWR"] == "AVX2"
    else:
        pytest.skip("not an x86-64 CPU with AVX2: nothing is pinned")
