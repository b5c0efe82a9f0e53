import pytest

from brorl.apps.cluster.service_proc import ServiceProc, stop_all


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from demo.model import create_tiny_model

    return str(create_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0))


@pytest.fixture
def services(tmp_path):
    """Factory: services("reward", **overrides) starts a real process; all are stopped after the
    test."""
    started: list[ServiceProc] = []

    def start(service: str, name: str | None = None, **overrides) -> ServiceProc:
        proc = ServiceProc(service, tmp_path, name=name, **overrides)
        started.append(proc)
        return proc

    yield start
    stop_all(started)
