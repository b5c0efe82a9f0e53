"""Where a brorl cluster's processes listen by default, named once.

Every default address of the system comes from here: the services' configs (``bind``,
``reward_address``, ``redis_url``, ``metrics_bind``), the ``brorl`` CLI's flags, the local-cluster
launcher and the recipes (``--base-port``). docker-compose.yml and the Kubernetes manifests
cannot import Python; tests/unit/test_owners.py checks that they use these ports, and that no
second literal copy of a port appears in source.
"""

from __future__ import annotations

from dataclasses import dataclass

HOST = "127.0.0.1"  # local processes bind loopback unless told otherwise
REDIS_PORT = 6379
REDIS_URL = f"redis://{HOST}:{REDIS_PORT}/0"


@dataclass(frozen=True)
class ClusterLayout:
    """The gRPC ports of one local cluster: reward, learner, an environment service (when the
    run has one), and rollout worker i on ``rollout_base_port + i``. One rule makes every layout
    from a base port (``--base-port``): reward on it, learner +1, environment +2, rollout worker
    i +10+i, so clusters side by side never overlap."""

    reward_port: int
    learner_port: int
    env_port: int
    rollout_base_port: int

    @classmethod
    def from_base_port(cls, base: int) -> "ClusterLayout":
        return cls(
            reward_port=base, learner_port=base + 1, env_port=base + 2, rollout_base_port=base + 10
        )

    def ports(self) -> dict[str, int]:
        """The launcher's port fields (brorl.apps.cluster.launcher.ClusterSpec)."""
        return {
            "reward_port": self.reward_port,
            "learner_port": self.learner_port,
            "env_port": self.env_port,
            "rollout_base_port": self.rollout_base_port,
        }


DEFAULT = ClusterLayout.from_base_port(50052)
ROLLOUT_PORT = 50051  # a lone rollout service (its config's default; one per container)
ENV_PORT = DEFAULT.env_port  # an environment service of envs/ (docs/environments.md)

# The Prometheus /metrics port each service serves on by default (docs/observability.md).
METRICS_PORTS = {"rollout": 9461, "reward": 9452, "learner": 9453, "env": 9454}


def address(port: int, host: str = HOST) -> str:
    return f"{host}:{port}"
