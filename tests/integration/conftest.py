import contextlib

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The demo's tiny Qwen2 model (tied embeddings), seed 0."""
    from demo.model import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    """One in-process vLLM engine on ``tiny_model_dir`` for the engine and parity tests (an
    engine takes most of a minute to start here). A test that reloads weights into it must
    reload the original weights before it ends."""
    pytest.importorskip("vllm")
    from services.rollout.engine import RolloutEngine

    engine = RolloutEngine(str(tiny_model_dir))
    yield engine
    engine.close()


@contextlib.contextmanager
def reward_server(cfg):
    """A real reward service on port 0 from ``cfg`` and a stub connected to it: (server, stub)."""
    from brorl import rpc
    from brorl.v1 import reward_pb2_grpc
    from services.reward.server import build_server

    server = build_server(cfg).start()
    server.set_serving(True)
    channel = rpc.channel(f"127.0.0.1:{server.port}")
    try:
        yield server, reward_pb2_grpc.RewardServiceStub(channel)
    finally:
        channel.close()
        server.stop()


@pytest.fixture(scope="session")
def harness_runs(tiny_model_dir, tmp_path_factory):
    """Runs of tests/integration/ranks_harness.py on ``tiny_model_dir``, each run once for the
    session: the tests that compare against the same run share it (``Runs.get``)."""
    from tests.integration.ranks_harness import Runs

    return Runs(tiny_model_dir, tmp_path_factory.mktemp("ranks"))
