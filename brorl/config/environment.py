"""The run config's ``env`` section: every path of the run is an episode against an
EnvironmentService (protos/brorl/v1/environment.proto; docs/environments.md). What it means for a
prompt job is decided in ``brorl.sampling.environment_params``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from brorl.config.base import StrictModel
from brorl.contract import EpisodeReward


class EnvironmentConfig(StrictModel):
    address: str = Field(
        ...,
        min_length=1,
        pattern=r"^[^\s:]+:[0-9]+$",
        description="host:port of the EnvironmentService; the rollout workers call it, and "
        "StartRun checks that it answers.",
    )
    max_turns: int = Field(3, ge=1, le=64, description="Policy turns per episode at most.")
    max_total_tokens: int = Field(
        0,
        ge=0,
        description="Tokens after the prompt (policy and environment) per episode at most; 0: "
        "the model's context minus the prompt.",
    )
    step_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="Deadline of one Step call; past it: env_timeout."
    )
    episode_timeout_s: float = Field(
        300.0, gt=0, le=86400, description="Deadline of one episode, all its turns together."
    )
    max_inflight_steps: int = Field(
        64,
        ge=1,
        le=4096,
        description="Step calls in flight at once per prompt job (the environment's load).",
    )
    reward: Literal[EpisodeReward.ALL] = Field(
        EpisodeReward.ENV,
        description="The path's reward: 'env' the sum of the environment's turn rewards, "
        "'reward_fn' the reward service's score of the transcript (reward_fn), 'sum' both.",
    )
    chat: bool = Field(
        False,
        description="Render each observation as a message with the tokenizer's chat template, "
        "appended to the tokens so far (never re-rendering earlier turns); else its text is "
        "tokenized alone and appended.",
    )
