"""The learner's chain: logits -> token log-probs/entropy -> clipped policy loss, end to end."""

import torch

from kernels import (
    clipped_policy_loss,
    clipped_policy_loss_reference,
    group_advantages,
    group_advantages_reference,
    token_logprobs_entropy,
    token_logprobs_entropy_reference,
)


def _step(logprobs_fn, loss_fn, adv_fn, logits, ids, rewards, mask, old, ref, temperature):
    logits.grad = None
    logp, ent = logprobs_fn(
        logits[:, :-1], ids, temperature=temperature
    )  # (B, T) from shifted logits
    adv, _ = adv_fn(rewards)  # (P, G)
    loss, stats = loss_fn(
        logp,
        old,
        adv.reshape(-1).to(logp.dtype),
        mask,
        eps_low=0.2,
        eps_high=0.28,
        ref_logp=ref,
        kl_coef=0.05,
        kl_estimator="k3",
    )
    ent_mean = (ent * mask).sum() / mask.sum()
    (loss - 0.01 * ent_mean).backward()
    return (
        loss.detach(),
        ent_mean.detach(),
        {k: float(v) for k, v in stats.items()},
        logits.grad.clone(),
    )


def test_learner_chain_matches_reference(backend):
    P, G, T, V = 2, 3, 11, 3001  # 6 paths, right-padded to T tokens
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(P * G, T + 1, V, generator=g) * 2).requires_grad_(True)
    ids = torch.randint(0, V, (P * G, T), generator=g)
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.5, 0.5, 0.5]])  # second group degenerate
    mask = torch.arange(T)[None, :] < torch.tensor([T, 7, 3, T, 9, 1])[:, None]
    with torch.no_grad():
        cur, _ = token_logprobs_entropy_reference(logits[:, :-1], ids, 0.8)
    old = cur + 0.3 * torch.randn(cur.shape, generator=g)
    ref = cur + 0.1 * torch.randn(cur.shape, generator=g)
    out = _step(
        token_logprobs_entropy,
        clipped_policy_loss,
        group_advantages,
        logits,
        ids,
        rewards,
        mask,
        old,
        ref,
        0.8,
    )
    logits64 = logits.detach().double().requires_grad_(True)
    want = _step(
        token_logprobs_entropy_reference,
        clipped_policy_loss_reference,
        group_advantages_reference,
        logits64,
        ids,
        rewards.double(),
        mask,
        old.double(),
        ref.double(),
        0.8,
    )
    torch.testing.assert_close(out[0], want[0].float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out[1], want[1].float(), atol=1e-5, rtol=1e-5)
    for k, v in out[2].items():
        assert abs(v - want[2][k]) < 1e-6, k
    torch.testing.assert_close(out[3], want[3].float(), atol=1e-8, rtol=1e-4)
    per_token = out[3].abs().sum(-1)  # (B, T + 1)
    assert torch.all(per_token[:, :-1][~mask] == 0) and torch.all(per_token[:, :-1][mask] > 0)
    assert torch.all(per_token[:, -1] == 0)  # the sliced-off last position
