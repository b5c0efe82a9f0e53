"""The policy being trained: the model in its DeepSpeed engine, the optional frozen reference
model, and the one update a step makes from scored groups (pure math in batch.py/losses.py)."""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from brorl.runconfig import TrainConfig
from services.learner import deepspeed_engine
from services.learner import estimators
from services.learner.batch import (
    advantages_of,
    at_least_two_positions,
    build_batches,
    max_tokens_of,
    rank_share,
)
from services.learner.kl_control import KLController
from services.learner.losses import policy_loss
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
    def __init__(self, model_dir: str, train: TrainConfig, zero_stage: int = 0):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(train.seed)
        self.model_dir, self.train = model_dir, train
        # On CPU the eager attention beats SDPA's kernels at the few-token lengths RL paths
        # have here (docs/performance.md); on CUDA SDPA is the faster one.
        attention = "sdpa" if torch.cuda.is_available() else "eager"
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation=attention
        )
        # padding positions are masked out; any in-vocabulary id does
        ids = (model.config.pad_token_id, model.config.eos_token_id)
        self.pad_id = next((i for i in ids if isinstance(i, int)), 0)
        # The reference is loaded once, only when the KL has a weight, and serves the KL term
        # (kl_in loss or reward) and its metrics alike.
        self.ref_model = None
        if train.kl_coef > 0:
            self._load_reference()
        self.engine = deepspeed_engine.build_engine(model, train, zero_stage)
        # Batches, the reference model and every loss tensor live on the engine's device; on
        # CUDA the forward runs under bf16 autocast (fp32 master weights and loss math).
        self.device = self.engine.device
        self.autocast = self.device.type == "cuda"
        if self.ref_model is not None:
            self.ref_model.to(self.device)
        self.kl = KLController(train)

    @property
    def model(self):
        return self.engine.module

    def update(self, groups) -> dict[str, float]:
        """One optimizer step over ``groups``, in chunks (batch.build_batches) whose gradients
        accumulate to the token mean over the whole step (dr_grpo: the token sum over
        paths × max_tokens, estimators.loss_denominator); returns learner/* statistics."""
        train = self.train
        clock = PhaseClock()
        advantages = advantages_of(groups, train.normalize_std, train.estimator, self.device)
        chunks = build_batches(groups, advantages, self.pad_id, train.micro_batch_paths)
        total_tokens = max(sum(c.tokens for c in chunks), 1)
        paths = sum(len(c) for c in chunks)
        denominator = estimators.loss_denominator(
            train.estimator, total_tokens, paths, max_tokens_of(groups)
        )
        clock.lap("batch")
        sums: Counter = Counter()
        self.engine.train()
        coef = self.kl.coef  # this step's KL coefficient (kl_control)
        step_train = train if coef == train.kl_coef else train.model_copy(update={"kl_coef": coef})
        # Several ranks (services.learner.ranks): each got the step's groups and runs its share.
        rank, world = deepspeed_engine.rank_and_world()
        share = rank_share(len(chunks), rank, world)
        same_calls = world > 1 and self.engine.zero_optimization_stage() == 3
        for j, (i, scale) in enumerate(share):
            chunk = at_least_two_positions(chunks[i], self.pad_id) if same_calls else chunks[i]
            chunk = chunk.to(self.device)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                loss, stats = policy_loss(self.engine, chunk, step_train, self.ref_model)
            clock.lap("forward")  # log-probs under the current (and reference) weights, loss
            if not deepspeed_engine.on_every_rank(bool(torch.isfinite(loss))):
                return self._skip("loss", clock)
            weight = chunk.tokens / denominator  # chunk loss is its token mean
            last = j == len(share) - 1
            self.engine.set_gradient_accumulation_boundary(last)
            self.engine.backward(loss * (weight * scale))
            clock.lap("backward")
            if last:
                sums["learner/grad_norm"] = deepspeed_engine.grad_norm(self.engine)
                if not math.isfinite(sums["learner/grad_norm"]):
                    return self._skip("grad", clock)
            self.engine.step()  # the optimizer steps at the boundary only
            clock.lap("optimizer")
            frac = scale / world  # this rank's part of the chunk: 0 for a repeated one
            sums["learner/loss"] += float(loss.detach()) * weight * frac
            for k, v in stats.items():  # token means, whatever the loss's denominator
                sums[f"learner/{k}"] += v * chunk.tokens / total_tokens * frac
        if world > 1:  # the step's statistics over all ranks' chunks
            grad_norm = sums.pop("learner/grad_norm", 0.0)
            sums = Counter(deepspeed_engine.sum_over_ranks(dict(sums)))
            sums["learner/grad_norm"] = grad_norm
        sums.update({f"learner/{k}_s": v for k, v in clock.seconds.items()})
        rewards = [p.reward for g in groups for p in g.paths]
        if self.ref_model is not None:
            sums["learner/kl_coef"] = coef
            self.kl.update(sums["learner/kl"], len(rewards))
        adv = torch.cat(advantages) if advantages else torch.zeros(0)
        sums.update(
            {
                "learner/reward_mean": sum(rewards) / len(rewards),
                "learner/paths": float(len(rewards)),
                "learner/tokens": float(total_tokens),
                "learner/positions": float(sum(c.positions for c in chunks)),
                "learner/chunks": float(len(chunks)),
                "learner/adv_std": float(adv.std()) if len(adv) > 1 else 0.0,
                "learner/nonzero_paths": float(
                    sum(((c.advantages != 0) & (c.weight > 0)).sum() for c in chunks)
                ),
            }
        )
        return dict(sums)

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

    def load_checkpoint(self, directory: str, tag: str | None = None) -> dict:
        """Weights, optimizer state and KL coefficient of checkpoint ``tag`` (None: the
        latest); returns the rest of its client state."""
        client = deepspeed_engine.load_checkpoint(self.engine, directory, tag)
        self.kl.restore(client.pop("kl_control", None))
        return client

    def set_hyperparameters(self, lr: float, kl_coef: float) -> None:
        """The learning rate and KL coefficient from the next update on (a rollback's)."""
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        self.train = self.train.model_copy(update={"kl_coef": kl_coef})
        self.kl.coef = float(kl_coef)
        if kl_coef > 0 and self.ref_model is None:
            self._load_reference()
            self.ref_model.to(self.device)

    def _load_reference(self) -> None:
        """The frozen initial policy the KL term is measured against."""
        from transformers import AutoModelForCausalLM

        attention = "sdpa" if torch.cuda.is_available() else "eager"
        self.ref_model = AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=torch.float32, attn_implementation=attention
        )
        self.ref_model.eval().requires_grad_(False)
