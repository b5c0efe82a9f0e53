"""The ``monitors`` section of a run config: per-step detectors over the learner's metrics, their
thresholds, and what an alarm does (docs/monitors.md). The learner's
services/learner/guard/monitors.py holds the detectors, services/learner/guard/actions.py the
actions."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from brorl.config.base import StrictModel


class MonitorsConfig(StrictModel):
    """Per-step detectors over the learner's metrics and what an alarm does (docs/monitors.md).
    A threshold of 0 turns its detector off."""

    action: Literal["warn", "stop", "rollback"] = Field(
        "warn",
        description="On an alarm: 'warn' records it; 'stop' ends the run with the alarm as its "
        "message; 'rollback' restores the last checkpoint that passed every monitor, scales "
        "lr / kl_coef by lr_factor / kl_factor and continues under a new weight version.",
    )
    window: int = Field(
        8, ge=2, le=1000, description="Steps of the running window the detectors compare with."
    )
    kl_spike: float = Field(
        0.0,
        ge=0.0,
        description="Alarm when learner/kl exceeds this many times the window's median (0: off).",
    )
    kl_floor: float = Field(
        1e-3, ge=0.0, description="A KL at or below this never counts as a spike."
    )
    entropy_collapse: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Alarm when learner/entropy falls below this fraction of the window's median "
        "(0: off).",
    )
    entropy_min: float = Field(
        0.0,
        ge=0.0,
        description="Alarm when learner/entropy (nats per token) is below this (0: off).",
    )
    length_blowup: float = Field(
        0.0,
        ge=0.0,
        description="Alarm when rollout/length_mean exceeds this many times the window's median "
        "(0: off).",
    )
    reward_std_collapse: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Alarm when reward/group_std (mean within-group reward std) falls below this "
        "fraction of the window's median (0: off).",
    )
    reward_std_min: float = Field(
        0.0, ge=0.0, description="Alarm when reward/group_std is below this (0: off)."
    )
    verifier_fn: str = Field(
        "",
        description="Held-out verifier: a second reward function (registry name) the rollout "
        "workers run on a sample of the paths; its score never trains ('': no reward-hacking "
        "detector).",
    )
    verifier_sample: float = Field(
        0.25, gt=0.0, le=1.0, description="Share of paths the verifier also scores."
    )
    hacking_rise: float = Field(
        0.1,
        ge=0.0,
        description="Reward hacking: alarm when, fitted over the window, the training reward on "
        "the verified sample rises by at least this ...",
    )
    hacking_drop: float = Field(
        0.05, gt=0.0, description="... while the verifier's score falls by at least this."
    )
    lr_factor: float = Field(
        0.5, gt=0.0, le=1.0, description="Rollback multiplies the learning rate by this."
    )
    kl_factor: float = Field(
        2.0,
        ge=1.0,
        description="Rollback multiplies train.kl_coef by this (a kl_coef of 0 stays 0).",
    )
    max_rollbacks: int = Field(
        3, ge=0, description="An alarm after this many rollbacks stops the run instead."
    )
