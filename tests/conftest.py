import functools
import socket

import pytest


@functools.cache
def _redis_answers(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def pytest_runtest_setup(item):
    if "redis" in item.keywords and not _redis_answers():
        pytest.fail(
            "this test needs Redis on 127.0.0.1:6379: start one with scripts/ensure_redis.sh",
            pytrace=False,
        )


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # torch missing: no GPU tests either
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (run with -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
