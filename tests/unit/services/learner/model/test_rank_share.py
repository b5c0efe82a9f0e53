"""How a step's chunks are shared among learner ranks, and the inter-rank group encoding."""

from __future__ import annotations

import pytest

from brorl.v1 import common_pb2
from services.learner.model.batch import rank_share


@pytest.mark.parametrize(
    "n, world", [(0, 1), (1, 1), (7, 1), (1, 2), (7, 2), (8, 2), (5, 3), (2, 4)]
)
def test_every_chunk_once_equal_passes_per_rank(n, world):
    shares = [rank_share(n, r, world) for r in range(world)]
    real = sorted(i for s in shares for i, scale in s if scale)
    assert real == list(range(n))  # each chunk on exactly one rank
    assert len({len(s) for s in shares}) == 1  # the same number of backward passes
    for s in shares:
        assert all(scale in (0.0, float(world)) for _, scale in s)
        assert all(0 <= i < max(n, 1) for i, _ in s)
    if world == 1:
        assert shares[0] == [(i, 1.0) for i in range(n)]


def test_rank_share_fills_a_short_rank_with_a_zero_scale_repeat():
    assert rank_share(3, 1, 2) == [(1, 2.0), (1, 0.0)]
    assert rank_share(1, 1, 2) == [(0, 0.0)]  # no chunk of its own: chunk 0 at scale 0


def test_groups_travel_between_ranks_as_protobuf():
    from services.learner.ranks import pack_groups, unpack_groups

    groups = [common_pb2.PathGroup(group_id=f"g{i}", prompt_token_ids=[i] * i) for i in range(4)]
    groups[2].paths.add(path_id="g2/0", token_ids=[1, 2], reward=0.5)
    assert unpack_groups(pack_groups(groups)) == groups
    assert unpack_groups(b"") == []
