"""group_advantages (PyTorch path and Triton kernel) against its reference."""

import statistics

import pytest
import torch

from kernels import group_advantages, group_advantages_reference

TOL = dict(atol=1e-5, rtol=1e-4)


def _rewards(P, G, seed=0, degenerate=()):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 4, (P, G), generator=g).float() * 0.5 + torch.rand(P, G, generator=g) * (
        torch.rand(P, 1, generator=g) > 0.5
    )
    for p in degenerate:
        r[p] = 0.3 * (p + 1)  # all equal: 0.3 * k is inexact in binary, so the mean is not exact
    return r


def test_reference_matches_statistics_module():
    r = _rewards(6, 9, degenerate=(2,))
    r[4] = torch.tensor([0.0] * 8 + [1.0])  # one success among nine
    adv, deg = group_advantages_reference(r, normalize_std=True, eps=1e-6)
    adv0, _ = group_advantages_reference(r, normalize_std=False)
    for p in range(6):
        row = [float(v) for v in r[p].tolist()]
        mean, sd = statistics.fmean(row), statistics.stdev(row)
        assert bool(deg[p]) == (len(set(row)) == 1)
        for g in range(9):
            want = 0.0 if deg[p] else (row[g] - mean) / (sd + 1e-6)
            assert adv[p, g].item() == pytest.approx(want, abs=1e-5)
            assert adv0[p, g].item() == pytest.approx(0.0 if deg[p] else row[g] - mean, abs=1e-6)


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize(
    "P,G,degenerate",
    [
        (3, 1024, (1,)),  # wide groups (BroRL N up to 1024)
        (2, 1000, (0, 1)),  # G not a power of two, all groups degenerate
        (37, 5, (0, 17, 36)),  # many small groups: several groups per program
        (4, 513, ()),
        (5, 1, ()),  # one path per group: always degenerate
    ],
)
def test_matches_reference(backend, P, G, degenerate, normalize_std):
    r = _rewards(P, G, seed=P * G, degenerate=degenerate)
    adv, deg = group_advantages(r, normalize_std=normalize_std)
    ref_adv, ref_deg = group_advantages_reference(r.double(), normalize_std=normalize_std)
    assert adv.shape == (P, G) and adv.dtype == torch.float32
    assert deg.shape == (P,) and deg.dtype == torch.bool
    assert torch.equal(deg, ref_deg)
    assert set(degenerate) <= set(deg.nonzero().flatten().tolist())
    torch.testing.assert_close(adv, ref_adv.float(), **TOL)
    assert torch.all(adv[deg] == 0)  # exactly zero, not just small


def test_strided_and_integer_rewards(backend):
    r = _rewards(70, 9, seed=3, degenerate=(5,))
    adv, deg = group_advantages(r.t().contiguous().t(), eps=1e-3)  # column-major view
    ref_adv, ref_deg = group_advantages_reference(r.double(), eps=1e-3)
    torch.testing.assert_close(adv, ref_adv.float(), **TOL)
    assert torch.equal(deg, ref_deg)
    ints = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1]])
    adv, deg = group_advantages(ints)
    assert deg.tolist() == [False, True]
    want = torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / ((1 / 3) ** 0.5 + 1e-6)  # d / sample std
    torch.testing.assert_close(adv[0], want, **TOL)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4))
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4, 0))
