"""The learner loop with a per-prompt path budget (sampling.budget: adaptive) and the probe-mass
metric (probe:), driven with the in-memory queue of test_trainer_loop."""

from __future__ import annotations

import json
import pytest
import torch

from services.learner.observe.probe import ProbeMeter, answer_logprobs
from tests.unit.services.learner.test_trainer_loop import (
    RecordingPolicy,
    fake_rollout,
    run_trainer,
)

BUDGET = {"kind": "adaptive", "total": 16, "n_min": 2, "n_max": 12}


def kind_of(prompt_id: str) -> str:
    """Prompt i: hopeless (i % 3 == 0), solved (1) or uncertain (2)."""
    return ("hopeless", "solved", "uncertain")[int(prompt_id[1:]) % 3]


def test_adaptive_budget_splits_each_block_and_favours_uncertain_prompts(tmp_path):
    sent: dict[str, tuple[str, int]] = {}  # group id -> (prompt id, n asked)

    def rewards(job):
        sent[job.group_id] = (job.prompt_id, job.sampling.n)
        n, kind = job.sampling.n, kind_of(job.prompt_id)
        if kind == "uncertain":
            return [1.0, 0.0] * (n // 2) + [0.0] * (n % 2)
        return [1.0 if kind == "solved" else 0.0] * n

    policy, steps, _ = run_trainer(
        tmp_path,
        fake_rollout(rewards),
        sampling={"n": 4, "budget": BUDGET},
        train={"steps": 12, "groups_per_step": 2},
    )
    cursors = sorted(int(g[1:]) for g in sent)
    blocks = {}
    for c in cursors:
        blocks.setdefault(c // 2, []).append(sent[f"g{c}"])
    for block, members in blocks.items():
        assert all(2 <= n <= 12 for _, n in members)
        if len(members) == 2:  # a whole block was sent: it splits the step's budget exactly
            assert sum(n for _, n in members) == 16, (block, members)
    # the trained groups are exactly as wide as the feed asked (unequal N within one step)
    trained = [g for update in policy.updates for g in update]
    assert trained and all(len(g.paths) == sent[g.group_id][1] for g in trained)
    assert any(len({len(g.paths) for g in update}) > 1 for update in policy.updates)
    # once both prompts of a block have history (first sent well before the block was
    # allocated, so their groups were consumed), an uncertain prompt beside a solved or
    # hopeless one gets more paths
    first_seen: dict[str, int] = {}
    for c in cursors:
        first_seen.setdefault(sent[f"g{c}"][0], c)
    favoured = contests = 0
    for block, members in blocks.items():
        if len(members) != 2 or any(first_seen[p] >= 2 * block - 6 for p, _ in members):
            continue
        kinds = [kind_of(p) for p, _ in members]
        if kinds.count("uncertain") == 1:
            contests += 1
            n_uncertain = members[kinds.index("uncertain")][1]
            favoured += n_uncertain > 16 - n_uncertain
    assert contests >= 3 and favoured == contests, (contests, favoured)
    # the per-step fraction of groups with both outcomes is a metric
    assert all(0.0 <= m["explore/mixed_groups"] <= 1.0 for m in steps)


def test_pass_rate_counts_are_checkpointed(tmp_path):
    def rewards(job):
        return [1.0, 0.0] * (job.sampling.n // 2) + [1.0] * (job.sampling.n % 2)

    run_trainer(tmp_path, fake_rollout(rewards), sampling={"n": 4, "budget": BUDGET})
    [ckpt] = sorted((tmp_path / "run" / "checkpoints").glob("step*/client.json"))
    state = json.loads(ckpt.read_text())["budget"]
    counts = state["pass_rates"]
    assert counts and all(0 < s < t for s, t in counts.values())
    assert all(k.isdigit() for k in counts)
    assert state["blocks"] and all(sum(n) == 16 for n in state["blocks"].values())


def test_a_resumed_feed_keeps_pass_rates_and_allocated_blocks(tmp_path):
    from brorl.config.run import RunConfig
    from services.learner.feed.jobfeed import JobFeed
    from services.learner.feed.prompts import Prompt
    from tests.memory_queue import MemoryChannels

    cfg = RunConfig.model_validate(
        {
            "model": "m",
            "data": {"train_path": "t"},
            "sampling": {"budget": BUDGET},
            "train": {"groups_per_step": 2},
        }
    )
    prompts = [Prompt(f"{i}+1=", str(i + 1)) for i in range(6)]
    queue = MemoryChannels("r", lambda ch: None).prompt_queue()
    feed = JobFeed("r", cfg, prompts, queue, epoch="a")
    feed.pass_rates.counts = {feed.order[0]: [9, 10], feed.order[1]: [5, 10]}
    sizes = [feed.group_size(c) for c in range(2)]
    assert sum(sizes) == 16 and sizes[1] > sizes[0]  # p = 0.5 beats p = 0.83
    again = JobFeed("r", cfg, prompts, queue, epoch="b")
    again.restore_budget(json.loads(json.dumps(feed.budget_state())))
    again.pass_rates.counts.clear()  # the blocks, not a recomputation, give the sizes
    assert [again.group_size(c) for c in range(2)] == sizes


class ShrinkingPolicy(RecordingPolicy):
    """A policy with a real model whose every update scales the weights by 0.9: the probe
    measurements must follow the model the update left behind."""

    def __init__(self, model_dir):
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.pad_id = 0

    def update(self, groups):
        with torch.no_grad():
            for p in self.model.parameters():
                p.mul_(0.9)
        return super().update(groups)


def test_probe_metrics_every_k_updates_on_the_updated_model(tmp_path):
    from demo.model import create_tiny_model

    create_tiny_model(tmp_path, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=48)
    probes = tmp_path / "probes.jsonl"
    probes.write_text(
        "".join(
            json.dumps({"prompt": f"{a}+{a}=", "reference": str(2 * a)}) + "\n"
            for a in (3, 17, 250)
        )
    )
    policy = ShrinkingPolicy(tmp_path)

    def mixed(job):
        return [1.0, 0.0] * (job.sampling.n // 2)

    _, steps, _ = run_trainer(
        tmp_path,
        fake_rollout(mixed),
        policy,
        train={"steps": 4, "groups_per_step": 1},
        probe={"path": str(probes), "every": 2},
    )
    assert [("probe/mean_change" in m) for m in steps] == [False, True, False, True]
    last = steps[-1]
    meter = ProbeMeter.for_run(str(probes), str(tmp_path), 0)
    now = answer_logprobs(policy.model, meter.probes, 0)
    assert last["probe/mean_logprob"] == pytest.approx(sum(now) / 3, rel=1e-6)
    assert 0.0 <= last["probe/fell_fraction"] <= 1.0 and last["probe/seconds"] >= 0
    assert last["probe/mean_change"] != 0.0
