from __future__ import annotations

from pydantic import Field

from brorl.config import StrictModel


class RewardServiceConfig(StrictModel):
    bind: str = Field("127.0.0.1:50052", description="host:port to serve on (port 0 picks a free one).")
    max_batch: int = Field(4096, ge=1, description="Largest ScoreBatch accepted; more is RESOURCE_EXHAUSTED.")
    workers: int = Field(8, ge=1, le=256, description="gRPC handler threads.")
    port_file: str = Field("", description="If set, the bound port is written here once serving.")
