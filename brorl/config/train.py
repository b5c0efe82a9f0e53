"""The run config's ``train`` section: the policy update (optimizer, clipping, KL, the
advantage estimator and its options). Part of ``brorl.config.run.RunConfig``; the learner's
services/learner/algo/ holds the math these fields choose (docs/algorithms.md)."""

from __future__ import annotations

from typing import Annotated, Literal, Union, get_args

from pydantic import Field, model_validator

from brorl.config.base import StrictModel
from brorl.config.ppo import PPOConfig

# The advantage estimators, named once (docs/algorithms.md): the group-baseline ones, then ppo
# (a critic and GAE). services/learner/algo/advantages.py implements every name listed here.
Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)


class FixedKL(StrictModel):
    kind: Literal["fixed"] = Field(description="train.kl_coef at every step.")


class AdaptiveKL(StrictModel):
    kind: Literal["adaptive"] = Field(
        description="Proportional controller (Ziegler et al. 2019) from train.kl_coef: "
        "coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * paths / horizon after every update."
    )
    target: float = Field(
        0.05, gt=0.0, description="Target of the measured per-token KL (nats, kl_estimator)."
    )
    horizon: int = Field(
        10_000,
        ge=1,
        description="Paths over which a 20% error moves the coefficient by 20% (larger: slower).",
    )


KLControl = Annotated[Union[FixedKL, AdaptiveKL], Field(discriminator="kind")]


class TrainConfig(StrictModel):
    steps: int = Field(100, ge=1, description="Policy updates in this run.")
    groups_per_step: int = Field(
        1, ge=1, description="Prompt groups (each of n paths) in one update."
    )
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="Adam learning rate.")
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        description=(
            "Optimizer steps over which the learning rate rises linearly to `lr` (step k of a "
            "run, counted from 0, uses lr·(k+1)/warmup); 0: `lr` from the first step. Adam's "
            "first steps move every weight by about lr whatever its gradient's size."
        ),
    )
    lr_decay: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="The learning rate after the warm-up: 'constant' keeps `lr`; 'linear' and "
        "'cosine' lower it to lr·lr_min_ratio by the run's last optimizer step (train.steps × "
        "epochs × minibatches), so late updates on a sharpened policy are small.",
    )
    lr_min_ratio: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="The decayed learning rate at the last step, as a fraction of `lr` (lr_decay "
        "linear or cosine).",
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    optimizer: Literal["adamw", "onebit_adam"] = Field(
        "adamw",
        description="'adamw' (torch's, inside DeepSpeed), or 'onebit_adam': error-compensated "
        "1-bit Adam on torch.distributed (AdamW for onebit_freeze_steps, then the variance "
        "frozen and the momentum exchanged as signs plus a scale per 256 elements, about 1/28 "
        "of the fp32 all-reduce's bytes); needs 2+ learner ranks and ZeRO stage 0 "
        "(docs/scaling.md).",
    )
    onebit_freeze_steps: int = Field(
        100,
        ge=1,
        description="1-bit Adam: optimizer steps of exact AdamW with an fp32 all-reduce (its "
        "warm-up, where the variance settles) before the variance is frozen and the momentum "
        "exchange compressed.",
    )
    clip_low: float = Field(
        0.2, ge=0.0, le=1.0, description="PPO clip below: ratio >= 1 - clip_low."
    )
    clip_high: float = Field(
        0.2, ge=0.0, le=10.0, description="PPO clip above: ratio <= 1 + clip_high."
    )
    kl_coef: float = Field(
        0.0,
        ge=0.0,
        description="Weight of the KL to the initial (reference) policy; 0 loads no reference "
        "model.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator: k1, k2 or k3.")
    normalize_std: bool = Field(
        True, description="Divide group advantages by the group's reward std (GRPO)."
    )
    estimator: Estimator = Field(
        "grpo",
        description="Advantage estimator (docs/algorithms.md): 'grpo' group mean baseline (/ std "
        "with normalize_std); 'dr_grpo' mean baseline, no std, token-sum loss over "
        "paths x max_tokens; 'rloo' leave-one-out baseline; 'reinforce_pp' group baseline "
        "then std over the whole step; 'ppo' a critic and GAE (train.ppo).",
    )
    ppo: PPOConfig = Field(
        default_factory=PPOConfig, description="PPO's critic, GAE and epochs (estimator ppo)."
    )
    off_policy: Literal["clip", "tis", "none"] = Field(
        "clip",
        description="Correction for paths sampled by older weights: 'clip' takes the PPO ratio "
        "against the sampling log-probs; 'tis' takes it against the learner's "
        "recomputed log-probs times a truncated importance weight; 'none' treats every path "
        "as on-policy (ratio 1, no correction: the staleness ablation's control).",
    )
    tis_cap: float = Field(
        2.0, gt=0.0, description="Cap of the truncated importance weight (off_policy='tis')."
    )
    ratio_level: Literal["token", "sequence"] = Field(
        "token",
        description="Importance ratios per token, or per path (GSPO): exp of the mean "
        "log-ratio over the path's tokens, clipped per path; 'sequence' also makes the TIS "
        "weight per path.",
    )
    kl_in: Literal["loss", "reward"] = Field(
        "loss",
        description="Where the KL to the reference goes: a term of the loss, or a per-token "
        "penalty -coef * kl in the reward whose return-to-go is subtracted from each token's "
        "advantage (REINFORCE++).",
    )
    kl_control: KLControl = Field(
        default_factory=lambda: FixedKL(kind="fixed"),
        description="KL coefficient: {kind: fixed} keeps kl_coef; {kind: adaptive, target, "
        "horizon} steers it so the measured KL tracks target (docs/algorithms.md).",
    )
    epochs: int = Field(
        1,
        ge=1,
        description="Passes over a step's paths for the critic-free estimators (ppo takes "
        "train.ppo.epochs); above 1, or minibatches above 1, needs off_policy clip.",
    )
    minibatches: int = Field(
        1,
        ge=1,
        description="Optimizer steps per pass for the critic-free estimators: the step's "
        "chunks are shuffled and cut into this many parts (ppo: train.ppo.minibatches).",
    )
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping.")
    micro_batch_paths: int = Field(
        256, ge=1, description="Paths per forward/backward chunk (memory bound)."
    )
    keep_paths: int = Field(
        0,
        ge=0,
        description="Train on at most this many of each group's paths (0: all of them); the "
        "group's advantages are computed over the kept ones. For a learner slower than its "
        "rollout: sample wide, update on the informative part (PODS; "
        "services/learner/algo/downsample.py, docs/algorithms.md). At least 2.",
    )
    keep_rule: Literal["max_variance", "random"] = Field(
        "max_variance",
        description="Which paths train.keep_paths keeps: 'max_variance' the subset whose rewards "
        "vary the most (the highest and lowest rewards, balanced), 'random' a uniform draw.",
    )
    prompt_once: bool = Field(
        True,
        description="Run a group's prompt once per optimizer step for all of its chunks "
        "(services/learner/model/prompt_once.py) instead of once per chunk; at ZeRO stages 0 and 1 "
        "(2 and 3 run a prompt per chunk).",
    )
    autocast: Literal["auto", "native", "bf16", "fp32"] = Field(
        "auto",
        description="The forward's compute dtype (weights, optimizer and loss math stay fp32): "
        "'bf16' runs it under bf16 autocast, 'fp32' without, 'auto' bf16 on CUDA and fp32 on "
        "CPU, 'native' bf16 wherever the learner's device multiplies bf16 natively (CUDA, a CPU "
        "with AVX512-BF16 or AMX) and fp32 elsewhere. On a CPU with native bf16 it is faster "
        "(a forward + backward of a 24 M model 1.9x, the demo's update 1.3x); without them it "
        "is emulated, 2.3x slower or worse, and 'bf16' warns (docs/performance.md).",
    )
    seed: int = Field(0, description="Torch seed of the learner.")
    max_skipped_steps: int = Field(
        3,
        ge=1,
        description="Fail the run after this many updates in a row skipped for a non-finite "
        "loss or gradient (each skip leaves weights and optimizer state untouched).",
    )

    def passes(self) -> tuple[int, int]:
        """(epochs, minibatches) of a step's optimizer steps: train.ppo's under ppo, else
        this section's (1, 1: one optimizer step over the whole step)."""
        if self.estimator == "ppo":
            return self.ppo.epochs, self.ppo.minibatches
        return self.epochs, self.minibatches

    @model_validator(mode="after")
    def _passes_need_a_fixed_old_policy(self):
        if self.estimator == "ppo" and (self.epochs, self.minibatches) != (1, 1):
            raise ValueError(
                "estimator ppo takes its passes from train.ppo.epochs and "
                "train.ppo.minibatches, not train.epochs / train.minibatches"
            )
        epochs, minibatches = self.passes()
        if epochs * minibatches > 1 and self.off_policy != "clip":
            raise ValueError(
                f"{epochs} epochs x {minibatches} minibatches take off_policy clip: several "
                "optimizer steps on one step's paths need ratios against a fixed old policy "
                "(the sampler's log-probs), and tis recomputes them every pass"
            )
        return self

    @model_validator(mode="after")
    def _a_kept_group_has_a_baseline(self):
        if self.keep_paths == 1:
            raise ValueError(
                "keep_paths 1 leaves a group of one path, whose group baseline is itself (every "
                "advantage 0): keep 0 (all paths) or at least 2"
            )
        return self

    @model_validator(mode="after")
    def _adaptive_kl_needs_a_start(self):
        if self.kl_control.kind == "adaptive" and self.kl_coef <= 0:
            raise ValueError(
                "kl_control adaptive needs kl_coef > 0: its starting value (0 loads no "
                "reference model and would stay 0)"
            )
        return self
