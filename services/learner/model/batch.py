"""Scored path groups → training tensors (pure tensor code, no DeepSpeed, no gRPC).

Every path of a group continues the same prompt, so a batch is a *chunk of one group*: the
prompt once, and the chunk's completions right-padded to the chunk's own longest one. A
group's paths are sorted by completion length before they are cut into chunks of at most
``max_paths``, so little is padded and the prompt is run once per chunk (forward.py; once per
group in the policy's update, prompt_once.py), not once per path.

Shapes: b paths in the chunk, P prompt tokens, C = the chunk's longest completion.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from brorl import sampling
from brorl.v1 import common_pb2
from services.learner.algo import advantages


@dataclass
class Batch:
    prompt_ids: torch.Tensor  # (P,) long: the group's prompt
    targets: torch.Tensor  # (b, C) long: completion tokens, right-padded with pad_id
    loss_mask: torch.Tensor  # (b, C) 1.0 on completion tokens
    sampling_logp: torch.Tensor  # (b, C) the sampler's log-prob of each completion token
    advantages: torch.Tensor  # (b,) (times the path weight); (b, C) per token under ppo
    temperature: torch.Tensor  # (b,) temperature the log-probs are computed at
    top_k: torch.Tensor  # (b,) sampling top-k (-1: off)
    top_p: torch.Tensor  # (b,) sampling top-p (1: off)
    version: torch.Tensor  # (b,) weight version that produced each path
    weight: torch.Tensor  # (b,) path weight (near-duplicate down-weighting; 1 by default)
    path_index: torch.Tensor  # (b,) each row's index in its group's paths
    group_index: int  # the group's index in the step
    # PPO (estimator ppo; critic.py): advantages are then (b, C) per token, and these are set
    returns: torch.Tensor | None = None  # (b, C) GAE returns: the critic's targets
    old_values: torch.Tensor | None = None  # (b, C) the critic's values at the step's start
    # Episodes (Path.token_turns): each token's turn, k >= 1 the policy's k-th, 0 the
    # environment's (no loss, no KL, no entropy: loss_mask is 0 there); None: single turns
    turns: torch.Tensor | None = None  # (b, C) long

    def __len__(self) -> int:
        return self.targets.shape[0]

    def to(self, device) -> "Batch":
        """The same chunk with every tensor on ``device`` (the learner's engine device)."""
        moved = {
            f.name: getattr(self, f.name).to(device, non_blocking=True)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)

    @property
    def tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    @property
    def positions(self) -> int:
        """Token positions the model runs for this chunk: the prompt once, then C - 1 per path
        (the first completion token is predicted from the prompt's last position)."""
        return self.prompt_ids.shape[0] + len(self) * (self.targets.shape[1] - 1)


def group_rewards(group: common_pb2.PathGroup, device=None) -> torch.Tensor:
    return torch.tensor([p.reward for p in group.paths], dtype=torch.float32, device=device)  # (G,)


def advantages_of(
    groups: list[common_pb2.PathGroup],
    normalize_std: bool,
    estimator: str = "grpo",
    device=None,
) -> list[torch.Tensor]:
    """One (G,) advantage tensor per group under a group-level ``estimator``
    (advantages.compute), computed on ``device`` (the Triton kernel on CUDA) and returned on the
    CPU, where chunks are built. Groups may differ in size."""
    rewards = [group_rewards(g, device) for g in groups]
    inputs = advantages.AdvantageInputs(estimator, rewards, normalize_std=normalize_std)
    return [a.cpu() for a in advantages.compute(inputs).per_path]


def rank_share(n_chunks: int, rank: int, world: int) -> list[tuple[int, float]]:
    """The chunks learner rank ``rank`` of ``world`` runs, as (chunk index, loss scale): chunks
    rank, rank + world, ...; every rank gets one of the step's chunks in turn.

    Every rank runs the same number of backward passes (ZeRO-2 reduces gradients in each one),
    so a rank short of one repeats a chunk at scale 0. The scale ``world`` undoes DeepSpeed's
    mean over ranks: the step's gradient is the sum over all its chunks, as on one rank."""
    per_rank = math.ceil(n_chunks / world)
    mine = list(range(rank, n_chunks, world))
    filler = mine[0] if mine else 0
    return [(i, float(world)) for i in mine] + [(filler, 0.0)] * (per_rank - len(mine))


def at_least_two_positions(chunk: Batch, pad_id: int) -> Batch:
    """``chunk`` with a masked pad column when its completions are one token long, so the model
    runs the same two calls on it as on any chunk (forward.py): ZeRO-3 over several ranks
    gathers parameters call by call, and every rank must make the same calls."""
    if chunk.targets.shape[1] > 1:
        return chunk
    b = len(chunk)
    pad = torch.full((b, 1), pad_id, dtype=chunk.targets.dtype)
    zeros = torch.zeros((b, 1), dtype=chunk.loss_mask.dtype)
    return dataclasses.replace(
        chunk,
        targets=torch.cat([chunk.targets, pad], dim=1),  # (b, 2)
        loss_mask=torch.cat([chunk.loss_mask, zeros], dim=1),
        sampling_logp=torch.cat([chunk.sampling_logp, zeros.to(chunk.sampling_logp.dtype)], 1),
        turns=None if chunk.turns is None else torch.cat([chunk.turns, zeros.long()], dim=1),
    )


def max_tokens_of(groups: list[common_pb2.PathGroup]) -> int:
    """The step's generation budget: the largest max_tokens its paths were sampled with."""
    return max(
        (sampling.effective(p.sampling).max_tokens for g in groups for p in g.paths), default=1
    )


def build_batches(
    groups: list[common_pb2.PathGroup],
    advantages: list[torch.Tensor],
    pad_id: int,
    max_paths: int,
) -> list[Batch]:
    """Every group cut into chunks of at most ``max_paths`` paths of similar length."""
    batches = []
    for gi, (group, adv) in enumerate(zip(groups, advantages)):
        paths = list(group.paths)
        order = sorted(range(len(paths)), key=lambda i: len(paths[i].token_ids))
        chunks = math.ceil(len(order) / max_paths) if order else 0
        for part in range(chunks):
            rows = order[part * len(order) // chunks : (part + 1) * len(order) // chunks]
            batches.append(_chunk(group, rows, adv, pad_id, gi))
    return batches


def _chunk(group, rows: list[int], adv: torch.Tensor, pad_id: int, gi: int) -> Batch:
    paths = [group.paths[i] for i in rows]
    lengths = torch.tensor([len(p.token_ids) for p in paths])  # (b,)
    C = max(int(lengths.max()), 1)
    mask = torch.arange(C)[None, :] < lengths[:, None]  # (b, C); row-major = path order
    targets = torch.full((len(paths), C), pad_id, dtype=torch.long)
    targets[mask] = torch.tensor([t for p in paths for t in p.token_ids], dtype=torch.long)
    sampling_logp = torch.zeros((len(paths), C))
    sampling_logp[mask] = torch.tensor(
        [lp for p in paths for lp in list(p.logprobs)[: len(p.token_ids)]]
    )
    turns = None
    if any(p.token_turns for p in paths):  # episodes: the environment's tokens are not actions
        turns = torch.zeros((len(paths), C), dtype=torch.long)
        turns[mask] = torch.tensor(
            [k for p in paths for k in (list(p.token_turns) or [1] * len(p.token_ids))],
            dtype=torch.long,
        )
        mask = turns > 0
    # scored under the distribution the worker sampled from (brorl.sampling owns the rule)
    effective = [sampling.effective(p.sampling) for p in paths]
    weight = torch.tensor([p.weight if p.weight > 0 else 1.0 for p in paths])
    index = torch.tensor(rows, dtype=torch.long)
    return Batch(
        prompt_ids=torch.tensor(list(group.prompt_token_ids), dtype=torch.long),
        targets=targets,
        loss_mask=mask.float(),
        sampling_logp=sampling_logp,
        # a down-weighted duplicate pushes its group's update with a fraction of its advantage
        advantages=adv[index] * weight,
        temperature=torch.tensor([e.logprob_temperature for e in effective]),
        top_k=torch.tensor([e.top_k for e in effective], dtype=torch.long),
        top_p=torch.tensor([e.top_p for e in effective]),
        version=torch.tensor([p.weight_version for p in paths], dtype=torch.long),
        weight=weight,
        path_index=index,
        group_index=gi,
        turns=turns,
    )
