"""The launcher passes a cluster's token/TLS settings and read roots to every service as the
`key=value` overrides the services parse (brorl/apps/cluster/launcher.py): what a service
resolves from the command line is what the spec said."""

from __future__ import annotations

from pathlib import Path

from brorl.apps.cluster.launcher import ClusterSpec, read_roots, security_overrides
from brorl.config.base import load_config, validate
from brorl.security import SecurityConfig
from services.learner.config import LearnerServiceConfig
from services.reward.config import RewardServiceConfig
from services.rollout.config import RolloutServiceConfig
from tests.certs import make_tls_files


def test_security_reaches_every_service_unchanged(tmp_path, monkeypatch):
    tls = make_tls_files(tmp_path)
    spec = validate(
        SecurityConfig,
        {
            "token_file": str(tls.token),
            "tls": {"cert": str(tls.cert), "key": str(tls.key), "ca": str(tls.ca)},
        },
    )
    overrides = security_overrides(spec)
    assert set(overrides) == {
        "security.token_file",
        "security.tls.cert",
        "security.tls.key",
        "security.tls.ca",
    }
    argv = [f"{k}={v}" for k, v in overrides.items()]
    for cls, extra in [
        (LearnerServiceConfig, []),
        (RewardServiceConfig, []),
        (RolloutServiceConfig, ["model=/m"]),
    ]:
        got = load_config(cls, None, argv + extra, env_prefix=None).security
        assert got.token == spec.token and got.tls == spec.tls
    assert security_overrides(None) == security_overrides(SecurityConfig()) == {}


def test_learner_roots_hold_the_repository_workdir_and_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = ClusterSpec(model="models/tiny", workdir=Path("work"), read_roots=["/data/sets"])
    assert read_roots(spec) == [
        ".",
        str(tmp_path / "work"),
        str(tmp_path / "models" / "tiny"),
        "/data/sets",
    ]
