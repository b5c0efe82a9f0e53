"""Advantages for every estimator, behind one entry point: ``compute(AdvantageInputs)``.

``train.estimator`` picks one (brorl/config/train.py names them; docs/algorithms.md). For a
group of G paths with rewards r, the group-level estimators give one advantage per path:

    grpo          A = (r - mean r) / (std r + eps)   (normalize_std)   |   r - mean r   (not)
    dr_grpo       A =  r - mean r                    and the loss is a token sum / constant
    rloo          A =  r - mean_{j != i} r_j  =  G / (G - 1) * (r - mean r);  G == 1 -> 0
    reinforce_pp  a =  r - mean r per group, then over ALL paths of the step:
                  A = (a - mean_all a) / (std_all a + eps)

std is the sample (Bessel-corrected) standard deviation, as in ``kernels.group_advantages``, and
a group whose rewards are all equal gets advantage 0 exactly under every estimator.
``normalize_std`` only applies to grpo.

The token-level estimators give one advantage per completion token (``token_level``):

    ppo                          GAE(gamma, lam) of the critic's values over the token rewards
                                 (R at the last token, -kl_coef * k per token with kl_in reward),
                                 whitened over the step (train.ppo.whiten); returns for the critic
    reinforce_pp, kl_in reward   the same with V = 0 and gamma = lam = 1 on the group-centred
                                 reward: the return-to-go of R_i - mean_group R minus the KL
                                 penalty, whitened over the step (REINFORCE++ normalises the
                                 reward and its KL penalty together)

gae.py holds the token math. A KL in the reward of a group-level estimator is folded into its
advantages by ``kl_penalised`` in the loss's own forward (surrogate.py): those estimators make
one optimizer step per update, so the KL at the step's start is the KL the loss measures.

Every function has a float64 twin in plain Python (``*_reference``), written independently, as
the test oracle. Shapes: G paths of a group, b paths of a chunk, C its completion positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from brorl.config.train import ESTIMATORS
from kernels import group_advantages
from services.learner.algo import gae, ppo

GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
EPS = 1e-6  # kernels.group_advantages' default


@dataclass(frozen=True)
class ChunkTokens:
    """One chunk of a group, as the token-level estimators read it."""

    group_index: int  # the group's index in the step
    path_index: torch.Tensor  # (b,) long: each row's index in its group's paths
    mask: torch.Tensor  # (b, C) 1.0 on completion tokens
    weight: torch.Tensor  # (b,) path weight (near-duplicate down-weighting; 1 by default)
    values: torch.Tensor | None = None  # (b, C) the critic's values (ppo)
    kl: torch.Tensor | None = None  # (b, C) detached per-token KL estimate (kl_in reward)


@dataclass(frozen=True)
class AdvantageInputs:
    """One step's inputs to the estimator. ``chunks`` are read only when ``token_level``."""

    estimator: str
    group_rewards: list[torch.Tensor]  # (G,) per group
    normalize_std: bool = True
    kl_in_reward: bool = False  # a KL to the reference is a per-token reward penalty
    kl_coef: float = 0.0  # this step's coefficient of that penalty
    gamma: float = 1.0
    lam: float = 1.0
    whiten: bool = True
    chunks: list[ChunkTokens] = field(default_factory=list)
    eps: float = EPS

    @classmethod
    def for_step(cls, train, group_rewards, kl_coef: float, chunks=()) -> "AdvantageInputs":
        """The inputs a run's ``train`` section (brorl.config.train.TrainConfig) implies."""
        ppo_cfg = train.ppo if train.estimator == "ppo" else None
        return cls(
            estimator=train.estimator,
            group_rewards=list(group_rewards),
            normalize_std=train.normalize_std,
            kl_in_reward=train.kl_in == "reward" and kl_coef > 0,
            kl_coef=kl_coef,
            gamma=ppo_cfg.gamma if ppo_cfg else 1.0,
            lam=ppo_cfg.lam if ppo_cfg else 1.0,
            whiten=ppo_cfg.whiten if ppo_cfg else True,
            chunks=list(chunks),
        )

    @property
    def token_level(self) -> bool:
        return token_level(self.estimator, self.kl_in_reward)


@dataclass
class Advantages:
    """``per_path``: (G,) per group (group-level estimators). ``per_token``: (b, C) per chunk,
    times the path weight (token-level), with the critic's ``returns`` and ``values`` (ppo)."""

    per_path: list[torch.Tensor] = field(default_factory=list)
    per_token: list[torch.Tensor] | None = None
    returns: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None
    stats: dict[str, float] = field(default_factory=dict)


def token_level(estimator: str, kl_in_reward: bool) -> bool:
    """Whether ``estimator`` gives per-token advantages: ppo always, reinforce_pp with the KL in
    the reward."""
    return estimator == "ppo" or (estimator == "reinforce_pp" and kl_in_reward)


def compute(inputs: AdvantageInputs) -> Advantages:
    """The step's advantages under ``inputs.estimator`` (module docstring)."""
    if inputs.estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {inputs.estimator!r}; one of {ESTIMATORS}")
    if not inputs.token_level:
        return Advantages(per_path=group_estimate(inputs))
    if inputs.estimator == "ppo":
        rewards = inputs.group_rewards
    else:  # reinforce_pp: the group baseline first, then returns-to-go and one step-wide scale
        centred = AdvantageInputs("dr_grpo", inputs.group_rewards, eps=inputs.eps)
        rewards = group_estimate(centred)
    return _token_advantages(inputs, rewards)


def group_estimate(inputs: AdvantageInputs) -> list[torch.Tensor]:
    """One (G,) advantage tensor per (G,) reward tensor of a group-level estimator; groups may
    differ in size."""
    estimator, eps = inputs.estimator, inputs.eps
    if estimator not in GROUP_ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; one of {GROUP_ESTIMATORS}")
    norm = inputs.normalize_std and estimator == "grpo"
    centred = _group_kernel(inputs.group_rewards, norm, eps)  # list of (G,)
    if estimator in ("grpo", "dr_grpo"):
        return centred
    if estimator == "rloo":
        # r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean r); a lone path has no baseline: 0
        return [a * (len(a) / (len(a) - 1)) if len(a) > 1 else torch.zeros_like(a) for a in centred]
    # reinforce_pp: the group-centred advantages, normalised over the whole step
    if not centred:
        return []
    flat = torch.cat(centred)  # (N,) all paths of the step
    if len(flat) < 2:
        return [torch.zeros_like(a) for a in centred]
    mean, std = flat.mean(), flat.std()  # scalars; std Bessel-corrected
    if bool(std == 0):  # every group degenerate: all zeros already
        return [torch.zeros_like(a) for a in centred]
    return [(a - mean) / (std + eps) for a in centred]


def _group_kernel(
    groups_rewards: list[torch.Tensor], normalize_std: bool, eps: float
) -> list[torch.Tensor]:
    """kernels.group_advantages per group: equal sizes stacked into one (P, G) call."""
    out: list[torch.Tensor | None] = [None] * len(groups_rewards)
    by_size: dict[int, list[int]] = {}
    for i, r in enumerate(groups_rewards):
        by_size.setdefault(len(r), []).append(i)
    for size, idx in by_size.items():
        if size == 0:
            for i in idx:
                out[i] = torch.zeros(0, device=groups_rewards[i].device)
            continue
        rewards = torch.stack([groups_rewards[i] for i in idx])  # (P, G)
        adv, _ = group_advantages(rewards, normalize_std=normalize_std, eps=eps)  # (P, G)
        for row, i in enumerate(idx):
            out[i] = adv[row]
    return out  # type: ignore[return-value]


@torch.no_grad()
def _token_advantages(inputs: AdvantageInputs, rewards: list[torch.Tensor]) -> Advantages:
    """Per chunk: the (b,) path rewards from ``rewards`` (G,) per group at each path's last
    token, the KL penalty on every token, GAE over the chunk's values (0 without a critic);
    whitened over the whole step (``whiten``), times the path weight. Returned on the CPU (where
    chunks are built), with the statistics measured before the update."""
    advs, rets, vals, kls = [], [], [], []
    for chunk in inputs.chunks:
        mask = chunk.mask
        r = rewards[chunk.group_index].to(mask.device)[chunk.path_index.to(mask.device)]  # (b,)
        v = chunk.values.float() if chunk.values is not None else torch.zeros_like(mask)
        penalty = None
        if inputs.kl_in_reward and chunk.kl is not None:
            kls.append(float((chunk.kl * mask).sum()))
            penalty = -inputs.kl_coef * chunk.kl
        adv, ret = _gae_over_policy_tokens(r, v, mask, penalty, inputs.gamma, inputs.lam)
        advs.append(adv.cpu())
        rets.append(ret.cpu())
        vals.append(v.cpu())
    masks = [c.mask.cpu() for c in inputs.chunks]
    if inputs.whiten:
        advs = gae.whiten(advs, masks)
    out = Advantages(per_token=[a * c.weight.cpu()[:, None] for c, a in zip(inputs.chunks, advs)])
    critic = any(c.values is not None for c in inputs.chunks)
    if critic:
        out.returns, out.values = rets, vals
        flat = lambda xs: torch.cat([x[m != 0] for x, m in zip(xs, masks)])  # noqa: E731
        v, r = flat(vals), flat(rets)
        out.stats["learner/explained_variance"] = ppo.explained_variance(v, r, torch.ones_like(v))
    if kls:
        tokens = sum(int(m.sum().item()) for m in masks)
        out.stats["learner/kl"] = sum(kls) / max(tokens, 1)
    return out


def _gae_over_policy_tokens(r, v, mask, penalty, gamma: float, lam: float):
    """(advantages, returns), each (b, C), of GAE over each row's valid tokens: a single
    completion's are its prefix; an episode's policy tokens are gathered to the left first, so
    the environment's tokens between its turns neither act nor break the return's chain."""
    aligned = gae.left_align(mask)
    if aligned is None:
        token_r = gae.token_rewards(r, mask, penalty)  # (b, C)
        return gae.gae(token_r, v, mask, gamma, lam)
    index, m = aligned  # (b, C'), (b, C')
    pen = None if penalty is None else gae.gather_aligned(penalty, index)
    token_r = gae.token_rewards(r, m, pen)
    adv, ret = gae.gae(token_r, gae.gather_aligned(v, index), m, gamma, lam)
    C = mask.shape[1]
    return gae.scatter_back(adv, index, C), gae.scatter_back(ret, index, C)


def kl_penalised(advantages, kl, mask, coef: float, path_weight=None) -> torch.Tensor:
    """(B, T) per-token advantages of a group-level estimator with the KL in the reward: (B,)
    ``advantages`` minus the weighted return-to-go of the per-token KL penalty -coef * kl
    (gamma = 1; ``kl`` (B, T) detached: no gradient flows through it); padding adds nothing:

        A_it = A_i - w_i * coef * sum_{t' >= t} m_it' kl_it'   (w_i: the path weight in A_i)
    """
    penalty = torch.where(mask != 0, kl.detach(), 0.0)  # (B, T)
    to_go = penalty.flip(-1).cumsum(-1).flip(-1)  # (B, T): sum over t' >= t
    w = torch.ones_like(advantages) if path_weight is None else path_weight
    return advantages[:, None] - (coef * w)[:, None] * to_go


def length_normalised(estimator: str) -> bool:
    """Whether the step's loss is a mean over its tokens (every estimator but dr_grpo)."""
    return estimator != "dr_grpo"


def loss_denominator(estimator: str, total_tokens: int, paths: int, max_tokens: int) -> float:
    """What the step's summed token loss is divided by: its token count (token mean), or for
    dr_grpo the constant paths × max_tokens (Dr. GRPO: no per-length normalisation)."""
    if length_normalised(estimator):
        return float(max(total_tokens, 1))
    return float(max(paths * max_tokens, total_tokens, 1))


# ---- float64 twins in plain Python (test oracle) ------------------------------------------


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _sample_std(xs: list[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def group_estimate_reference(
    groups_rewards: list[list[float]],
    estimator: str = "grpo",
    normalize_std: bool = True,
    eps: float = EPS,
) -> list[list[float]]:
    out: list[list[float]] = []
    for r in groups_rewards:
        G = len(r)
        if G == 0 or all(x == r[0] for x in r):
            out.append([0.0] * G)
        elif estimator == "rloo":
            out.append(
                [x - sum(r[j] for j in range(G) if j != i) / (G - 1) for i, x in enumerate(r)]
            )
        elif estimator == "grpo" and normalize_std:
            m, s = _mean(r), _sample_std(r)
            out.append([(x - m) / (s + eps) for x in r])
        else:  # grpo without std, dr_grpo, and reinforce_pp's first stage
            m = _mean(r)
            out.append([x - m for x in r])
    if estimator == "reinforce_pp":
        flat = [a for g in out for a in g]
        if len(flat) < 2 or all(a == flat[0] for a in flat):
            return [[0.0] * len(g) for g in out]
        m, s = _mean(flat), _sample_std(flat)
        out = [[(a - m) / (s + eps) for a in g] for g in out]
    return out


def kl_penalised_reference(advantages, kl, mask, coef: float, path_weight=None):
    """Plain Python twin of ``kl_penalised``: rows of per-token advantages."""
    out = []
    for b in range(kl.shape[0]):
        w = 1.0 if path_weight is None else float(path_weight[b])
        row = []
        for t in range(kl.shape[1]):
            rest = sum(float(kl[b, u]) for u in range(t, kl.shape[1]) if mask[b, u])
            row.append(float(advantages[b]) - w * coef * rest)
        out.append(row)
    return out
