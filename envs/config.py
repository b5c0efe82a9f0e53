"""The environment service's config (``python -m envs``): which environment it hosts, with its
options, and the service settings every brorl service has."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from brorl.cluster import ENV_PORT, METRICS_PORTS, address
from brorl.config.base import StrictModel
from brorl.rpc import metrics_bind_field
from brorl.security import InferenceSecurityConfig


class CalculatorConfig(StrictModel):
    tool: bool = Field(
        True,
        description="Answer tool calls [a*b] with their value; off: every call is answered '?' "
        "(the same task without the tool).",
    )
    max_expression_chars: int = Field(
        64, ge=3, le=4096, description="A longer tool call is answered '?'."
    )


class DialogueConfig(StrictModel):
    turns: int = Field(3, ge=1, le=16, description="User turns per dialogue.")
    seed: int = Field(0, description="Seed of the user simulator's follow-up operations.")


class EnvServiceConfig(StrictModel):
    env: Literal["calculator", "dialogue"] = Field(
        ..., description="The environment hosted (envs/calculator.py, envs/dialogue.py)."
    )
    calculator: CalculatorConfig = Field(
        default_factory=CalculatorConfig, description="Options of env calculator."
    )
    dialogue: DialogueConfig = Field(
        default_factory=DialogueConfig, description="Options of env dialogue."
    )
    bind: str = Field(
        address(ENV_PORT), description="host:port to serve on (port 0 picks a free one)."
    )
    workers: int = Field(16, ge=1, le=1024, description="gRPC handler threads.")
    max_concurrent_rpcs: int = Field(
        1024,
        ge=1,
        le=100_000,
        description="Admission control: RPCs in flight before more are RESOURCE_EXHAUSTED.",
    )
    capacity: int = Field(
        100_000, ge=1, description="Episodes held at once; a Reset beyond is RESOURCE_EXHAUSTED."
    )
    episode_ttl_s: float = Field(
        3600.0, gt=0, description="An episode untouched this long is forgotten."
    )
    port_file: str = Field("", description="If set, the bound port is written here once serving.")
    metrics_bind: str = metrics_bind_field(METRICS_PORTS["env"])
    security: InferenceSecurityConfig = Field(
        default_factory=InferenceSecurityConfig,
        description="Token and TLS of this server (docs/security.md).",
    )
