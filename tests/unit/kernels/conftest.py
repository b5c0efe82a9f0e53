"""Fixtures for the kernel tests: run each op on its PyTorch path and on its Triton kernel.

The Triton kernels run on CPU in triton's interpreter. `kernels` jits lazily and reads
TRITON_INTERPRET at every launch (kernels.dispatch.LazyKernel), so setting the variables
here works even though this pytest process imported `kernels` earlier without them.
"""

import pytest

from kernels.dispatch import LazyKernel


@pytest.fixture
def launches(monkeypatch):
    """Names of the Triton kernels launched during the test."""
    names: list[str] = []
    original = LazyKernel.__getitem__

    def spy(self, grid):
        names.append(self.fn.__name__)
        return original(self, grid)

    monkeypatch.setattr(LazyKernel, "__getitem__", spy)
    return names


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch, launches):
    """'torch': the memory-lean PyTorch path; 'triton': the kernels in the CPU interpreter.

    After the test, checks that the chosen path really ran (Triton launched iff 'triton').
    """
    if request.param == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setenv("BRORL_TRITON", "1")
    else:
        monkeypatch.setenv("BRORL_TRITON", "0")
    yield request.param
    assert bool(launches) == (request.param == "triton"), launches
