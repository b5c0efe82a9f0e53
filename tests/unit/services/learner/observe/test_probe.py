"""Probe mass (services/learner/observe/probe.py): the teacher-forced answer log-prob against a
float64 twin, against a model whose update is known in closed form, and the summary metrics."""

from __future__ import annotations

import json
import math

import pytest
import torch

from brorl.errors import InvalidArgument
from services.learner.observe.probe import (
    Probe,
    ProbeMeter,
    answer_logprobs,
    mass_change,
    probe_batch,
    probes_from,
    sequence_logprob,
    sequence_logprob_reference,
)
from tests.unit.services.learner.tiny_model import tiny_qwen2


class Out:
    def __init__(self, logits):
        self.logits = logits


class BigramModel(torch.nn.Module):
    """logits[b, t] = table[ids[b, t]]: the next token depends only on the current one, so a
    change to one table entry changes exactly the answer positions that read that row."""

    def __init__(self, vocab: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g))

    def forward(self, input_ids, attention_mask=None):
        return Out(self.table[input_ids])  # (B, T, V)


@pytest.mark.parametrize("shape", [(1, 1, 2), (3, 5, 7), (4, 2, 33)])
def test_sequence_logprob_matches_float64_reference(shape):
    b, t, v = shape
    g = torch.Generator().manual_seed(b * 100 + t)
    logits = torch.randn(b, t, v, generator=g) * 3
    targets = torch.randint(0, v, (b, t), generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    got = sequence_logprob(logits, targets, mask)
    ref = sequence_logprob_reference(logits, targets, mask)
    assert got.shape == (b,)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_batching_and_padding_do_not_change_a_probe():
    # irregular prompt and answer lengths in one padded batch == each probe alone
    model = tiny_qwen2(vocab=21, seed=3)
    probes = [
        Probe((1, 5, 6, 7), (8, 2)),
        Probe((4,), (9, 9, 10, 2)),
        Probe((3, 3, 3, 3, 3, 3), (2,)),
    ]
    together = answer_logprobs(model, probes, pad_id=0, chunk=2)
    alone = [answer_logprobs(model, [p], pad_id=0)[0] for p in probes]
    assert together == pytest.approx(alone, abs=1e-5)
    # and each equals the sum of the answer tokens' log-probs, computed by hand
    for p, m in zip(probes, alone):
        seq = torch.tensor([list(p.prompt_ids) + list(p.answer_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=seq).logits[0].double(), -1)  # (T, V)
        k = len(p.prompt_ids)
        want = sum(float(logp[k - 1 + j, a]) for j, a in enumerate(p.answer_ids))
        assert m == pytest.approx(want, abs=1e-5)


def test_probe_batch_aligns_targets_with_the_position_before():
    ids, attention, targets, mask = probe_batch([Probe((5, 6), (7, 2)), Probe((4,), (2,))], 0)
    assert ids.tolist() == [[5, 6, 7, 2], [4, 2, 0, 0]]
    assert attention.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert mask.tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    assert targets[0, 1:3].tolist() == [7, 2] and targets[1, 0].item() == 2


def test_a_known_logit_change_gives_the_closed_form_change():
    # Raise the logit of the answer's first token (read from the prompt's last token's row)
    # by delta. Only that position changes, by delta - log(1 - p + p e^delta), p its old prob.
    vocab, delta = 11, 0.7
    model = BigramModel(vocab)
    probe = Probe((1, 4), (6, 3, 2))  # rows 4, 6, 3 are read; only row 4 is edited
    meter = ProbeMeter([probe], pad_id=0)
    assert meter.measure(model) == {}  # the first measurement is the baseline
    p = float(torch.softmax(model.table[4].detach().double(), 0)[6])
    with torch.no_grad():
        model.table[4, 6] += delta
    got = meter.measure(model)
    want = delta - math.log(1 - p + p * math.exp(delta))
    assert got["probe/mean_change"] == pytest.approx(want, rel=1e-5)
    assert got["probe/mean_change"] > 0 and got["probe/fell_fraction"] == 0.0
    # lowering it by the same amount: the mass falls, by the mirrored closed form
    p = float(torch.softmax(model.table[4].detach().double(), 0)[6])
    with torch.no_grad():
        model.table[4, 6] -= 2 * delta
    got = meter.measure(model)
    assert got["probe/mean_change"] == pytest.approx(
        -2 * delta - math.log(1 - p + p * math.exp(-2 * delta)), rel=1e-5
    )
    assert got["probe/fell_fraction"] == 1.0


def test_a_competing_token_lowers_the_answer_mass():
    # raising a wrong continuation of the same row lowers the answer's mass: by -log(1-q+q e^d)
    model = BigramModel(9, seed=1)
    probe = Probe((2,), (5, 1))
    before = answer_logprobs(model, [probe], pad_id=0)
    q = float(torch.softmax(model.table[2].detach().double(), 0)[7])
    with torch.no_grad():
        model.table[2, 7] += 1.5
    after = answer_logprobs(model, [probe], pad_id=0)
    assert after[0] - before[0] == pytest.approx(-math.log(1 - q + q * math.exp(1.5)), rel=1e-5)


def test_mass_change_metrics():
    before = [-1.0, -2.0, -0.5, -3.0]
    after = [-0.5, -2.5, -0.5, -1.0]  # up, down, equal (not a fall), up
    m = mass_change(before, after)
    assert m["probe/fell_fraction"] == 0.25
    assert m["probe/mean_change"] == pytest.approx((0.5 - 0.5 + 0 + 2.0) / 4)
    want_prob = sum(math.exp(a) - math.exp(b) for a, b in zip(after, before)) / 4
    assert m["probe/mean_prob_change"] == pytest.approx(want_prob)
    assert m["probe/mean_logprob"] == pytest.approx(sum(after) / 4)
    with pytest.raises(ValueError):
        mass_change([], [])
    with pytest.raises(ValueError):
        mass_change([1.0], [1.0, 2.0])


def test_measuring_keeps_the_train_mode():
    model = tiny_qwen2()
    model.train()
    answer_logprobs(model, [Probe((1,), (2,))], pad_id=0)
    assert model.training


def test_probes_from_tokenizes_like_the_demo(tmp_path):
    from demo.model import build_tokenizer
    from services.learner.feed.prompts import load_prompts

    tok = build_tokenizer()
    path = tmp_path / "probes.jsonl"
    path.write_text(json.dumps({"prompt": "12+3=", "reference": "15"}) + "\n")
    [probe] = probes_from(load_prompts(str(path), field="probe.path"), tok)
    assert probe.prompt_ids == tuple(tok.encode("12+3="))
    assert probe.answer_ids == (*tok.encode("15", add_special_tokens=False), tok.eos_token_id)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(InvalidArgument, match="probe.path"):
        load_prompts(str(empty), field="probe.path")
