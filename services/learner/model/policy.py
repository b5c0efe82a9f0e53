"""The policy being trained: the model in its DeepSpeed engine, the optional frozen reference
model, and the one update a step makes from scored groups (the math: services/learner/algo/;
advantages through its one entry point, ``advantages.compute``)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from brorl.config.train import TrainConfig
from kernels import kl_estimate
from services.learner.algo import advantages
from services.learner.algo import ppo
from services.learner.algo.advantages import AdvantageInputs, ChunkTokens
from services.learner.algo.kl_control import KLController
from services.learner.algo.lr_schedule import lr_factor
from services.learner.model import deepspeed_engine, forward, pretrained
from services.learner.model.autocast import autocast_enabled
from services.learner.model.batch import (
    at_least_two_positions,
    build_batches,
    group_rewards,
    max_tokens_of,
    rank_share,
)
from services.learner.model.critic import Critic
from services.learner.model.losses import policy_loss, token_logprobs
from services.learner.model.prompt_once import GroupPrompts, prompt_positions
from services.learner.publish import export_final

log = logging.getLogger(__name__)


class PhaseClock:
    """Seconds spent per named phase, lap by lap (the step's time breakdown in metrics)."""

    def __init__(self):
        self.seconds: Counter = Counter()
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self._last
        self._last = now


class Policy:
    # called before each chunk of an update; the trainer sets it (cores.CoreBorrowing.refresh)
    before_chunk: Callable[[], None] = staticmethod(lambda: None)

    def __init__(self, model_dir: str, train: TrainConfig, zero_stage: int = 0):
        torch.manual_seed(train.seed)
        self.model_dir, self.train = model_dir, train
        model = pretrained.causal_lm(model_dir)
        # padding positions are masked out; any in-vocabulary id does
        ids = (model.config.pad_token_id, model.config.eos_token_id)
        self.pad_id = next((i for i in ids if isinstance(i, int)), 0)
        # The reference is loaded once, only when the KL has a weight, and serves the KL term
        # (kl_in loss or reward) and its metrics alike.
        self.ref_model = None
        if train.kl_coef > 0:
            self._load_reference()
        self.engine = deepspeed_engine.build_engine(model, train, zero_stage)
        self.base_lr = train.lr  # before the schedule's factor; a rollback lowers it
        # Batches, the reference model and every loss tensor live on the engine's device; the
        # forward may run under bf16 autocast (train.autocast; fp32 master weights and loss math).
        self.device = self.engine.device
        self.autocast = autocast_enabled(train.autocast, self.device)
        if self.ref_model is not None:
            self.ref_model.to(self.device)
        self.kl = KLController(train)
        self.rank, self.world = deepspeed_engine.rank_and_world()
        self.updates = 0  # updates made by this process (seeds PPO's mini-batch order)
        # PPO's value model, in its own engine on the same ranks (critic.py)
        self.critic = Critic(model_dir, train, zero_stage) if train.estimator == "ppo" else None

    @property
    def model(self):
        return self.engine.module

    def _forward_context(self):
        """The context every forward of the update runs in: bf16 autocast where
        ``train.autocast`` turns it on (autocast_enabled), a no-op context otherwise."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast)

    def warm_forward(self, paths: int, length: int) -> float:
        """One forward of ``paths`` random sequences of ``length`` tokens (at most the model's
        positions) without gradients, under the update's autocast; returns its seconds. A
        process's first forward pays one-time costs (oneDNN's kernels for the dtype, the first
        touch of the activations' memory): 2.5x a later one for the long shape's micro-batch in
        bf16 (docs/performance.md). The trainer runs this while the workers sample the run's first
        groups, so the first update does not pay them. In eval mode with its own generator: the
        global RNG, the weights and their gradients are left as they were. One rank only (several
        run a forward together); 0.0 on more."""
        if self.world > 1:
            return 0.0
        start = time.perf_counter()
        config = self.model.config
        length = max(1, min(length, getattr(config, "max_position_embeddings", length)))
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(config.vocab_size, (max(paths, 1), length), generator=generator)
        training = self.model.training
        self.model.eval()
        with torch.no_grad(), self._forward_context():
            self.model(input_ids=ids.to(self.device))  # (paths, length) -> logits, dropped
        self.model.train(training)
        return time.perf_counter() - start

    def update(self, groups) -> dict[str, float]:
        """One update from ``groups``: epochs × mini-batches optimizer steps (train.passes(); one
        by default) over chunks (batch.build_batches) whose gradients accumulate to the token
        mean over the step or mini-batch (dr_grpo: the token sum over paths × max_tokens,
        advantages.loss_denominator); returns learner/* statistics."""
        train = self.train
        clock = PhaseClock()
        coef = self.kl.coef  # this step's KL coefficient (kl_control)
        step_train = train if coef == train.kl_coef else train.model_copy(update={"kl_coef": coef})
        sums: Counter = Counter()
        chunks, computed = self._chunks_with_advantages(groups, step_train)
        sums.update(computed.stats)
        if computed.per_token is None:
            adv = torch.cat(computed.per_path) if computed.per_path else torch.zeros(0)
        else:
            adv = torch.cat([c.advantages[c.loss_mask != 0] for c in chunks] or [torch.zeros(0)])
        parts = [list(range(len(chunks)))]
        epochs, minibatches = train.passes()
        if epochs * minibatches > 1:
            generator = torch.Generator().manual_seed(train.seed * 1_000_003 + self.updates)
            parts = ppo.passes(len(chunks), epochs, minibatches, generator)
        self.updates += 1
        clock.lap("batch")
        max_tokens = max_tokens_of(groups)
        self.engine.train()
        if self.critic is not None:  # before the critic's prompt passes (its loss sets it too)
            self.critic.engine.train()
        for part in parts:  # one optimizer step each
            sums["learner/lr"] += self._set_step_lr() / len(parts)
            out = self._optimizer_step([chunks[i] for i in part], step_train, max_tokens, clock)
            if isinstance(out, str):
                return self._skip(out, clock)
            for k, v in out.items():
                sums[k] += v / len(parts)
        sums.update({f"learner/{k}_s": v for k, v in clock.seconds.items()})
        # prompt positions a group's shared prompt pass saved (prompt_once.py; counted for one pass)
        lengths, owners = [c.prompt_ids.shape[0] for c in chunks], [c.group_index for c in chunks]
        shared = sum(lengths) - prompt_positions(owners, lengths, self._prompt_once())
        rewards = [p.reward for g in groups for p in g.paths]
        if self.ref_model is not None:
            sums["learner/kl_coef"] = coef
            self.kl.update(sums["learner/kl"], len(rewards))
        sums.update(
            {
                "learner/reward_mean": sum(rewards) / len(rewards),
                "learner/paths": float(len(rewards)),
                "learner/tokens": float(max(sum(c.tokens for c in chunks), 1)),
                "learner/positions": float(sum(c.positions for c in chunks) - shared),
                "learner/chunks": float(len(chunks)),
                "learner/optimizer_steps": float(len(parts)),
                "learner/adv_std": float(adv.std()) if len(adv) > 1 else 0.0,
                "learner/nonzero_paths": float(sum(_nonzero_paths(c) for c in chunks)),
            }
        )
        return dict(sums)

    def _optimizer_step(self, chunks, step_train, max_tokens: int, clock) -> dict | str:
        """Gradients of ``chunks`` accumulated to their loss (this rank's share of them), then
        one optimizer step (the critic's too, under ppo); their statistics, token means over
        ``chunks`` and summed over ranks; or "loss" / "grad" when a number was not finite (the
        step's gradients are then not applied)."""
        tokens = max(sum(c.tokens for c in chunks), 1)
        paths = sum(len(c) for c in chunks)
        denominator = advantages.loss_denominator(step_train.estimator, tokens, paths, max_tokens)
        # Several ranks (services.learner.ranks): each got the step's groups and runs its share.
        share = rank_share(len(chunks), self.rank, self.world)
        same_calls = self.world > 1 and self.engine.zero_optimization_stage() == 3
        # A KL in the reward of a token-level estimator is in its advantages already.
        ref = None if self._kl_in_token_advantages(step_train) else self.ref_model
        sums: Counter = Counter()
        owners = [chunks[i].group_index for i, _ in share]
        prompts = GroupPrompts(owners, self._prompt_once())
        values = GroupPrompts(owners, self._prompt_once(), forward.hidden_of)  # the critic's
        for j, (i, scale) in enumerate(share):
            self.before_chunk()
            chunk = at_least_two_positions(chunks[i], self.pad_id) if same_calls else chunks[i]
            chunk = chunk.to(self.device)
            with self._forward_context():
                prompt = prompts.prompt_for(j, self.engine, chunk)
                kl_ref = ref if step_train.kl_coef > 0 else None  # policy_loss runs it then
                ref_prompt = prompts.no_grad_for(j, kl_ref, chunk)
                loss, stats = policy_loss(self.engine, chunk, step_train, ref, prompt, ref_prompt)
                if self.critic is not None:
                    value_prompt = values.prompt_for(j, self.critic.trunk, chunk)
                    value_loss, value_stats = self.critic.loss(chunk, value_prompt)
                    stats.update(value_stats)
            clock.lap("forward")  # log-probs under the current (and reference) weights, loss
            finite = torch.isfinite(loss) & (self.critic is None or torch.isfinite(value_loss))
            if not deepspeed_engine.on_every_rank(bool(finite)):
                return "loss"
            weight = chunk.tokens / denominator  # chunk loss is its token mean
            last = j == len(share) - 1
            self.engine.set_gradient_accumulation_boundary(last)
            self.engine.backward(loss * (weight * scale) + prompts.surrogate(j, chunk.group_index))
            prompts.collect(j, chunk.group_index)
            if self.critic is not None:  # the value loss: a token mean over ``chunks`` too
                carried = values.surrogate(j, chunk.group_index)
                self.critic.backward(value_loss, chunk.tokens / tokens * scale, last, carried)
                values.collect(j, chunk.group_index)
            clock.lap("backward")
            if last:
                sums["learner/grad_norm"] = deepspeed_engine.grad_norm(self.engine)
                if not math.isfinite(sums["learner/grad_norm"]):
                    return "grad"
            self.engine.step()  # the optimizer steps at the boundary only
            clock.lap("optimizer")
            frac = scale / self.world  # this rank's part of the chunk: 0 for a repeated one
            sums["learner/loss"] += float(loss.detach()) * weight * frac
            for k, v in stats.items():  # token means, whatever the loss's denominator
                sums[f"learner/{k}"] += v * chunk.tokens / tokens * frac
        if self.world > 1:  # the statistics over all ranks' chunks
            grad_norm = sums.pop("learner/grad_norm", 0.0)
            sums = Counter(deepspeed_engine.sum_over_ranks(dict(sums)))
            sums["learner/grad_norm"] = grad_norm
        return sums

    def _prompt_once(self) -> bool:
        """Whether a group's chunks share one prompt pass (prompt_once.py): at ZeRO 0 and 1."""
        return self.train.prompt_once and self.engine.zero_optimization_stage() < 2

    def _kl_in_reward(self, train) -> bool:
        return self.ref_model is not None and train.kl_in == "reward" and train.kl_coef > 0

    def _kl_in_token_advantages(self, train) -> bool:
        """Whether the KL penalty is part of this step's per-token advantages (a token-level
        estimator with the KL in the reward), so the loss must not add it again."""
        kl_reward = self._kl_in_reward(train)
        return kl_reward and advantages.token_level(train.estimator, kl_reward)

    def _chunks_with_advantages(self, groups, step_train):
        """The step's chunks (batch.build_batches) carrying their advantages, and what
        ``advantages.compute`` returned. A token-level estimator (ppo; reinforce_pp with the KL
        in the reward) first reads every chunk once without gradients (``_chunk_tokens``), on
        every rank: the whitening needs the whole step."""
        kl_coef = step_train.kl_coef if self._kl_in_reward(step_train) else 0.0
        rewards = [group_rewards(g, self.device) for g in groups]  # (G,) per group
        inputs = AdvantageInputs.for_step(step_train, rewards, kl_coef)
        micro = step_train.micro_batch_paths
        if not inputs.token_level:
            computed = advantages.compute(inputs)
            computed.per_path = [a.cpu() for a in computed.per_path]
            return build_batches(groups, computed.per_path, self.pad_id, micro), computed
        zeros = [torch.zeros(len(g.paths)) for g in groups]
        chunks = build_batches(groups, zeros, self.pad_id, micro)
        if self.world > 1 and self.engine.zero_optimization_stage() == 3:
            chunks = [at_least_two_positions(c, self.pad_id) for c in chunks]
        # one prompt pass a group for each model read: the critic's trunk, the policy, the reference
        reads = (forward.hidden_of, forward.logits_of, forward.logits_of)
        owners = [c.group_index for c in chunks]
        shared = [GroupPrompts(owners, self._prompt_once(), read) for read in reads]
        tokens = [
            self._chunk_tokens(j, c, step_train, kl_coef > 0, shared) for j, c in enumerate(chunks)
        ]
        computed = advantages.compute(dataclasses.replace(inputs, chunks=tokens))
        critic = computed.returns is not None
        chunks = [
            dataclasses.replace(
                c,
                advantages=computed.per_token[i],
                returns=computed.returns[i] if critic else None,
                old_values=computed.values[i] if critic else None,
            )
            for i, c in enumerate(chunks)
        ]
        return chunks, computed

    @torch.no_grad()
    def _chunk_tokens(self, j: int, chunk, step_train, with_kl: bool, shared) -> ChunkTokens:
        """What the token-level estimators read of the ``j``-th chunk: its mask and weights, the
        critic's values (ppo) and the per-token KL to the reference (the KL in the reward);
        ``shared``: the critic's, the policy's and the reference's prompt passes a group."""
        on = chunk.to(self.device)
        values = kl = None
        critic, policy, ref = shared
        with self._forward_context():
            if self.critic is not None:
                self.critic.engine.eval()
                values = self.critic.values(on, critic.no_grad_for(j, self.critic.trunk, on))
            if with_kl:
                logp, _ = token_logprobs(self.engine, on, policy.no_grad_for(j, self.engine, on))
                ref_prompt = ref.no_grad_for(j, self.ref_model, on)
                ref_logp, _ = token_logprobs(self.ref_model, on, ref_prompt)
                kl = kl_estimate(logp.float(), ref_logp.float(), step_train.kl_estimator)
        return ChunkTokens(
            chunk.group_index, chunk.path_index, on.loss_mask, chunk.weight, values, kl
        )

    def _skip(self, what: str, clock: PhaseClock) -> dict[str, float]:
        """A non-finite loss or gradient: drop the step's gradients without an optimizer step
        (weights and optimizer state stay as they were)."""
        deepspeed_engine.discard_gradients(self.engine)
        log.warning("non-finite %s: step skipped, optimizer state untouched", what)
        return {
            "learner/skipped_step": 1.0,
            f"learner/skipped_nonfinite_{what}": 1.0,
            **{f"learner/{k}_s": v for k, v in clock.seconds.items()},
        }

    def weights(self, gather_only: bool = False) -> dict[str, np.ndarray]:
        """The policy's fp32 master weights for publication: Hugging Face names, tied tensors
        once (as save_pretrained writes them), float32 numpy copies of the parameters. Refuses
        weights with a NaN/inf: such a version must never reach the workers. Every rank calls
        it (ZeRO-3 gathers the parameters); a rank that only helps gather passes
        ``gather_only``."""
        with deepspeed_engine.full_parameters(self.engine):
            if gather_only:
                return {}
            bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(p).all()]
            if bad:
                raise FloatingPointError(f"non-finite weights in {bad[:3]}; not published")
            # ZeRO-3 frees the gathered parameters on leaving the context: copy them out
            copy = self.engine.zero_optimization_stage() == 3
            out, seen = {}, set()
            for name, tensor in self.model.state_dict().items():
                if tensor.data_ptr() in seen:
                    continue  # a tied weight (lm_head = embed_tokens)
                seen.add(tensor.data_ptr())
                array = tensor.detach().float().cpu().contiguous().numpy()
                out[name] = array.copy() if copy else array
            return out

    def export(self, out: Path) -> Path:
        with deepspeed_engine.full_parameters(self.engine):
            return export_final(self.model, self.model_dir, out)

    def save_checkpoint(self, directory: str, tag: str, client_state: dict) -> None:
        state = {**client_state, "kl_control": self.kl.state()}
        deepspeed_engine.save_checkpoint(self.engine, directory, tag, state)
        if self.critic is not None:
            self.critic.save_checkpoint(directory, tag)

    def load_checkpoint(self, directory: str, tag: str | None = None) -> dict:
        """Weights, optimizer state and KL coefficient of checkpoint ``tag`` (None: the
        latest); returns the rest of its client state."""
        client = deepspeed_engine.load_checkpoint(self.engine, directory, tag)
        if self.critic is not None:
            self.critic.load_checkpoint(directory, tag)
        self.kl.restore(client.pop("kl_control", None))
        return client

    def _set_step_lr(self) -> float:
        """The next optimizer step's learning rate (the warm-up's and the decay's share of the
        base rate), set in the optimizer and returned."""
        t = self.train
        total = t.steps * math.prod(t.passes())  # the run's optimizer steps
        factor = lr_factor(
            self.engine.global_steps, t.lr_warmup_steps, total, t.lr_decay, t.lr_min_ratio
        )
        lr = self.base_lr * factor
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def set_hyperparameters(self, lr: float, kl_coef: float) -> None:
        """The learning rate and KL coefficient from the next update on (a rollback's)."""
        self.base_lr = lr
        self._set_step_lr()
        self.train = self.train.model_copy(update={"kl_coef": kl_coef})
        self.kl.coef = float(kl_coef)
        if kl_coef > 0 and self.ref_model is None:
            self._load_reference()
            self.ref_model.to(self.device)

    def _load_reference(self) -> None:
        """The frozen initial policy the KL term is measured against."""
        self.ref_model = pretrained.causal_lm(self.model_dir)
        self.ref_model.eval().requires_grad_(False)


def _nonzero_paths(chunk) -> int:
    """Paths of ``chunk`` that push the update: a non-zero advantage (any token's) and weight."""
    adv = chunk.advantages
    moving = (adv != 0).any(dim=1) if adv.dim() == 2 else adv != 0  # (b,)
    return int((moving & (chunk.weight > 0)).sum())
