"""Scored path groups → padded training tensors (pure tensor code, no DeepSpeed, no gRPC).

Shapes: B paths, L = longest prompt + completion, T = L - 1 next-token positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from brorl import sampling
from brorl.v1 import common_pb2
from kernels import group_advantages


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L) long, right-padded
    attention_mask: torch.Tensor  # (B, L)
    targets: torch.Tensor  # (B, T) token predicted at each position (pad where masked)
    loss_mask: torch.Tensor  # (B, T) 1.0 on completion tokens
    sampling_logp: torch.Tensor  # (B, T) vLLM's sampling log-prob of each completion token
    advantages: torch.Tensor  # (B,)
    temperature: torch.Tensor  # (B,) sampling temperature of each path (1.0 for greedy)
    version: torch.Tensor  # (B,) weight version that produced each path
    weight: torch.Tensor  # (B,) path weight (near-duplicate down-weighting; 1 by default)
    top_k: torch.Tensor  # (B,) sampling top-k (-1: off)
    top_p: torch.Tensor  # (B,) sampling top-p (1: off)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, start: int, stop: int) -> "Batch":
        return Batch(*(getattr(self, f)[start:stop] for f in self.__dataclass_fields__))

    @property
    def tokens(self) -> int:
        return int(self.loss_mask.sum().item())


def group_rewards(group: common_pb2.PathGroup) -> torch.Tensor:
    return torch.tensor([p.reward for p in group.paths], dtype=torch.float32)  # (G,)


def advantages_of(groups: list[common_pb2.PathGroup], normalize_std: bool) -> list[torch.Tensor]:
    """Group-normalised advantages, one (G,) tensor per group. Groups may differ in size, so
    equal sizes are stacked into one (P, G) call of the kernel and the rest go one by one."""
    out: list[torch.Tensor | None] = [None] * len(groups)
    by_size: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        by_size.setdefault(len(g.paths), []).append(i)
    for size, idx in by_size.items():
        rewards = torch.stack([group_rewards(groups[i]) for i in idx])  # (P, G)
        adv, _ = group_advantages(rewards, normalize_std=normalize_std)
        for row, i in enumerate(idx):
            out[i] = adv[row]
    return out  # type: ignore[return-value]


def build_batch(
    groups: list[common_pb2.PathGroup], advantages: list[torch.Tensor], pad_id: int
) -> Batch:
    rows = []
    for group, adv in zip(groups, advantages):
        prompt = list(group.prompt_token_ids)
        for path, a in zip(group.paths, adv.tolist()):
            weight = path.weight if path.weight > 0 else 1.0
            # scored under the distribution the worker sampled from (brorl.sampling owns the rule)
            s = sampling.effective(path.sampling)
            # a down-weighted duplicate pushes its group's update with a fraction of its advantage
            rows.append(
                (
                    prompt,
                    list(path.token_ids),
                    list(path.logprobs),
                    a * weight,
                    s.logprob_temperature,
                    path.weight_version,
                    weight,
                    s.top_k,
                    s.top_p,
                )
            )
    B = len(rows)
    L = max(len(p) + len(c) for p, c, *_ in rows)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    loss_mask = torch.zeros((B, L - 1))
    sampling_logp = torch.zeros((B, L - 1))
    for b, (prompt, completion, logps, *_rest) in enumerate(rows):
        seq = prompt + completion
        input_ids[b, : len(seq)] = torch.tensor(seq)
        attention[b, : len(seq)] = 1
        # completion token j sits at position len(prompt)+j and is predicted from position
        # len(prompt)+j-1
        start = len(prompt) - 1
        loss_mask[b, start : start + len(completion)] = 1.0
        sampling_logp[b, start : start + len(completion)] = torch.tensor(logps[: len(completion)])
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        targets=input_ids[:, 1:].clone(),
        loss_mask=loss_mask,
        sampling_logp=sampling_logp,
        advantages=torch.tensor([r[3] for r in rows], dtype=torch.float32),
        temperature=torch.tensor([r[4] for r in rows], dtype=torch.float32),
        version=torch.tensor([r[5] for r in rows], dtype=torch.long),
        weight=torch.tensor([r[6] for r in rows], dtype=torch.float32),
        top_k=torch.tensor([r[7] for r in rows], dtype=torch.long),
        top_p=torch.tensor([r[8] for r in rows], dtype=torch.float32),
    )
