import pytest
import torch

from brorl.v1 import common_pb2
from kernels import truncate_logits_reference as truncate_logits
from services.learner.intake.assembly import GroupAssembler
from services.learner.model.batch import advantages_of, build_batches


def group(
    gid, prompt_ids, completions, rewards, part=0, parts=1, offset=0, temperature=1.0, version=0
):
    g = common_pb2.PathGroup(
        group_id=gid,
        prompt_token_ids=prompt_ids,
        part_index=part,
        part_count=parts,
        generated=len(completions),
        weight_version=version,
    )
    for i, (toks, r) in enumerate(zip(completions, rewards)):
        g.paths.add(
            path_id=f"{gid}/{offset + i}",
            token_ids=toks,
            logprobs=[-0.1 * (j + 1) for j in range(len(toks))],
            reward=r,
            weight_version=version,
            worker=f"w{part}",
            sampling=common_pb2.SamplingParams(temperature=temperature, top_k=-1, top_p=1.0),
        )
    return g


def test_batches_hold_each_groups_prompt_once_and_its_completions_aligned():
    g1 = group("a", [5, 6, 7], [[1, 2], [3], [9, 9, 9]], [1.0, 0.0, 1.0])
    g2 = group("b", [8], [[4, 4, 4, 2]], [1.0])
    adv = advantages_of([g1, g2], normalize_std=False)
    batches = build_batches([g1, g2], adv, pad_id=0, max_paths=2)
    # g1's three paths sorted by length and cut into chunks of at most 2; g2 alone
    assert [(b.group_index, b.path_index.tolist()) for b in batches] == [
        (0, [1]),
        (0, [0, 2]),
        (1, [0]),
    ]
    assert [tuple(b.targets.shape) for b in batches] == [(1, 1), (2, 3), (1, 4)]
    for b in batches:
        g = [g1, g2][b.group_index]
        assert b.prompt_ids.tolist() == list(g.prompt_token_ids)
        for row, i in enumerate(b.path_index.tolist()):
            completion = list(g.paths[i].token_ids)
            n = int(b.loss_mask[row].sum())
            assert n == len(completion) and b.loss_mask[row, :n].all()
            assert b.targets[row, :n].tolist() == completion
            assert b.sampling_logp[row, :n].tolist() == pytest.approx(
                [-0.1 * (j + 1) for j in range(n)]
            )
            assert b.advantages[row].item() == pytest.approx(adv[b.group_index][i].item())
    assert sum(b.tokens for b in batches) == 2 + 1 + 3 + 4
    assert [b.positions for b in batches] == [3 + 0, 3 + 2 * 2, 1 + 3]


def test_advantages_for_groups_of_different_sizes():
    groups = [
        group("a", [1], [[1]] * 3, [1, 0, 0]),
        group("b", [1], [[1]] * 2, [0, 1]),
        group("c", [1], [[1]] * 3, [1, 1, 0]),
    ]
    adv = advantages_of(groups, normalize_std=True)
    assert [len(a) for a in adv] == [3, 2, 3]
    for a, g in zip(adv, groups):
        r = torch.tensor([p.reward for p in g.paths])
        assert torch.allclose(a, (r - r.mean()) / (r.std() + 1e-6), atol=1e-5)


def reference_truncation(scaled, top_k, top_p):
    """Per-position loops: keep the top-k, then the smallest top set whose mass reaches top_p."""
    out = torch.full_like(scaled, -1e9)
    B, T, V = scaled.shape
    for b in range(B):
        for t in range(T):
            row = scaled[b, t]
            order = row.argsort(descending=True).tolist()
            if top_k[b] > 0:
                order = order[: top_k[b]]
            probs = torch.softmax(row[order], 0).tolist()
            kept, mass = [], 0.0
            for idx, p in zip(order, probs):
                if mass >= top_p[b]:
                    break
                kept.append(idx)
                mass += p
            out[b, t, kept] = row[kept]
    return out


def test_truncate_logits_matches_a_plain_reference():
    torch.manual_seed(0)
    scaled = torch.randn(3, 4, 37)
    top_k = torch.tensor([5, -1, 40])
    top_p = torch.tensor([1.0, 0.9, 0.5])
    got = truncate_logits(scaled, top_k, top_p)
    want = reference_truncation(scaled, top_k.tolist(), top_p.tolist())
    assert torch.equal(got > -1e8, want > -1e8)
    assert (got > -1e8).sum(-1).min() >= 1
    assert (got[0] > -1e8).sum(-1).max() == 5


def test_fanned_out_group_is_reassembled_exactly_once():
    asm = GroupAssembler()
    p0 = group("g", [1], [[1]] * 512, [1.0] * 512, part=0, parts=2, offset=0, version=3)
    p1 = group("g", [1], [[2]] * 512, [0.0] * 512, part=1, parts=2, offset=512, version=2)
    assert asm.add(p1, "e1") == (None, [], False)
    assert asm.add(p1, "e1-again")[2] is True  # duplicate part
    merged, entries, dup = asm.add(p0, "e0")
    assert not dup and entries == ["e0", "e1"]
    ids = [p.path_id for p in merged.paths]
    assert len(ids) == 1024 and len(set(ids)) == 1024
    assert merged.weight_version == 2 and merged.generated == 1024
    assert asm.waiting == 0


def test_learner_logprobs_use_each_paths_temperature_and_cutoff():
    """The learner scores a path under the distribution it was sampled from."""
    from services.learner.model.forward import completion_logits_reference
    from services.learner.model.losses import token_logprobs
    from tests.unit.services.learner.tiny_model import tiny_qwen2

    model = tiny_qwen2(vocab=11)
    g = group("a", [1, 2], [[3, 4, 5], [6, 7, 8]], [1.0, 0.0])
    g.paths[0].sampling.temperature, g.paths[0].sampling.top_k = 0.5, 4
    g.paths[1].sampling.temperature = 1.5
    [batch] = build_batches([g], advantages_of([g], normalize_std=False), pad_id=0, max_paths=8)
    logp, _ = token_logprobs(model, batch)
    logits = completion_logits_reference(model, batch)
    for row, (temp, k) in enumerate([(0.5, 4), (1.5, -1)]):
        scaled = logits[row] / temp
        if k > 0:
            kth = scaled.topk(k, -1).values[:, -1:]
            keep = scaled >= kth
            keep[torch.arange(3), batch.targets[row]] = True  # the sampled token was inside
            scaled = scaled.masked_fill(~keep, float("-inf"))
        want = torch.log_softmax(scaled, -1).gather(-1, batch.targets[row, :, None]).squeeze(-1)
        assert torch.allclose(logp[row], want, atol=1e-5)
    assert not torch.allclose(logp[0], logp[1], atol=1e-2)


def test_truncated_learner_logprobs_match_the_reference_and_its_gradients():
    """With top-k / top-p the learner takes the chunked truncated path (kernels); its log-probs,
    entropies and parameter gradients equal the plain float64 reference's."""
    from kernels import truncated_logprobs_entropy_reference
    from services.learner.model.forward import completion_logits_reference
    from services.learner.model.losses import token_logprobs
    from tests.unit.services.learner.tiny_model import tiny_qwen2

    g = group("a", [1, 2], [[3, 4, 5], [6, 7], [8, 9, 10, 2]], [1.0, 0.0, 1.0])
    settings = [(0.5, 4, 1.0), (1.5, -1, 0.6), (0.8, 7, 0.9)]  # temperature, top_k, top_p
    for path, (temp, k, p) in zip(g.paths, settings):
        path.sampling.temperature, path.sampling.top_k, path.sampling.top_p = temp, k, p
    [batch] = build_batches([g], advantages_of([g], normalize_std=False), pad_id=0, max_paths=8)
    mask = batch.loss_mask
    grads = []
    for ours in (True, False):
        model = tiny_qwen2(vocab=11, seed=4)
        if ours:
            logp, ent = token_logprobs(model, batch)
        else:
            logits = completion_logits_reference(model, batch).double()
            logp, ent = truncated_logprobs_entropy_reference(
                logits, batch.targets, batch.temperature, batch.top_k, batch.top_p
            )
        ((logp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        grads.append(([logp.detach().float(), ent.detach().float()], model))
    (got, model), (want, ref_model) = grads
    torch.testing.assert_close(got[0] * mask, want[0] * mask, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1] * mask, want[1] * mask, atol=1e-5, rtol=1e-4)
    for (name, a), b in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)
