"""Fixtures shared by the learner's unit tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny tensors on a shared 2-core machine: more threads only contend (30x slower here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
