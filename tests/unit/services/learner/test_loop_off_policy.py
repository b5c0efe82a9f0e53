"""The training loop with the real Policy (DeepSpeed on CPU, a tiny Qwen2) behind the in-memory
queue: stale groups are dropped and counted while lagging ones are trained with truncated IS
weights; the KL to the reference is logged every step, its adaptive coefficient follows the
controller and survives a checkpoint and resume."""

from __future__ import annotations

import json

import pytest

from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from brorl.weights.store import WeightStore
from services.learner.algo.kl_control import adaptive_coef
from services.learner.observe.runstate import RunState
from services.learner.train import Trainer
from tests.memory_queue import MemoryChannels, MemoryRegistry
from tests.unit.services.learner.tiny_model import tiny_qwen2

pytestmark = pytest.mark.slow

CAPPED = -6.0  # a sampling log-prob far below the learner's (~ -3 at vocab 21): weight capped
BELOW = -1.0  # far above it: weight ~ e^-2, under the cap



def rollout(lag):
    """Answer every pending job: 4 paths of 2 tokens, rewards 1, 0, 1, 0; path 3's sampling
    log-probs are CAPPED, the others BELOW; the group comes from weights ``lag(k)`` versions
    older than the newest (k: the group's number)."""

    def answer(ch: MemoryChannels) -> None:
        while ch.prompts.new:
            [d] = ch.prompts.read(count=1)
            job = common_pb2.PromptJob.FromString(d.data)
            version = ch.read_weights().version - lag(int(job.group_id[1:]))
            group = common_pb2.PathGroup(
                run_id=ch.run_id,
                group_id=job.group_id,
                prompt_id=job.prompt_id,
                prompt_token_ids=[3, 4],
                weight_version=version,
                generated=job.sampling.n,
            )
            for i in range(job.sampling.n):
                lp = CAPPED if i % 4 == 3 else BELOW
                group.paths.add(
                    path_id=f"{job.group_id}/{i}",
                    group_id=job.group_id,
                    token_ids=[5 + i % 3, 6],
                    logprobs=[lp, lp],
                    reward=float(i % 2 == 0),
                    weight_version=version,
                    sampling=job.sampling,
                    worker="w0",
                )
            ch.paths.put(group.SerializeToString())
            ch.prompts.ack(d.entry_id)

    return answer


def config(tmp_path, steps: int, **train) -> RunConfig:
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "reference": "x"}) + "\n" for i in range(20))
    )
    return RunConfig.model_validate(
        {
            "model": str(tmp_path / "model"),
            "data": {"train_path": str(data)},
            "sampling": {"n": 4, "top_k": -1, "top_p": 1.0, "max_tokens": 2},
            "train": {"steps": steps, "groups_per_step": 2, "lr": 1e-2, **train},
            # versions reach the fake rollout within the step, so its lags are exact
            "async": {
                "max_inflight_groups": 4,
                "group_timeout_s": 5,
                "max_staleness": 1,
                "publish_in_background": False,
            },
            "checkpoint_every": 0,
        }
    )


def run(tmp_path, cfg: RunConfig, channels: MemoryChannels, resume: bool = False) -> list[dict]:
    from services.learner.model.policy import Policy

    if not (tmp_path / "model").exists():
        tiny_qwen2().save_pretrained(tmp_path / "model")
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    trainer = Trainer(
        "r1",
        cfg,
        RunState("r1", run_dir, cfg.train.steps),
        channels,
        MemoryRegistry(),
        WeightStore(tmp_path / "weights"),
        lambda: Policy(cfg.model, cfg.train),
        resume=resume,
    )
    trainer.run()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if "learner/loss" in m]


def test_stale_groups_are_dropped_and_lagging_ones_trained_with_tis(tmp_path, one_thread):
    # every third group is 3 versions old (over max_staleness 1), odd ones 1 version old
    def lag(k):
        return 3 if k % 3 == 0 else k % 2

    cfg = config(tmp_path, 3, off_policy="tis", tis_cap=2.0)
    steps = run(tmp_path, cfg, MemoryChannels("r1", rollout(lag)))
    assert len(steps) == 3
    trained = [int(g[1:]) for m in steps for g in m["groups"]]
    assert trained and not [k for k in trained if k % 3 == 0]  # none of the stale ones
    assert [k for k in trained if lag(k) == 1]  # lagging ones were trained
    assert steps[-1]["learner/dropped_stale"] >= 1
    assert steps[-1]["learner/dropped_paths/stale"] == 4 * steps[-1]["learner/dropped_stale"]
    assert max(m["rollout/staleness"] for m in steps) == 1
    for m in steps:  # the IS weights reached the loss: one path in 4 capped, the rest ~ e^-2
        assert m["learner/tis_capped_frac"] == pytest.approx(0.25)
        assert 0.5 < m["learner/tis_weight_mean"] < 0.75
        assert m["learner/ratio_mean"] == pytest.approx(1.0)  # on-policy PPO ratio under TIS
        # advantages +-0.866 balance out unweighted (loss 0); weighted, the capped path 3
        # (A < 0, w = 2) dominates: about (2 * 0.866 + 0.866 * 0.13 * (1 - 2)) / 4 = 0.4
        assert m["learner/loss"] > 0.3


def test_the_clip_correction_takes_the_ratio_against_the_sampler(tmp_path, one_thread):
    cfg = config(tmp_path, 2)  # off_policy clip: ratio pi / pi_sampling, no TIS weights
    steps = run(tmp_path, cfg, MemoryChannels("r1", rollout(lambda k: k % 2)))
    for m in steps:
        assert "learner/tis_weight_mean" not in m
        assert m["learner/ratio_mean"] != pytest.approx(1.0, abs=0.05)
        assert m["learner/clip_frac"] > 0


@pytest.mark.parametrize("kl_in", ["loss", "reward"])
def test_the_loop_logs_kl_and_resumes_the_adaptive_coefficient(tmp_path, one_thread, kl_in):
    control = {"kind": "adaptive", "target": 0.001, "horizon": 16}
    channels = MemoryChannels("r1", rollout(lambda k: 0))
    cfg = config(tmp_path, 3, kl_coef=0.1, kl_control=control, kl_in=kl_in)
    first = run(tmp_path, cfg, channels)
    # resumed from the final checkpoint of step 3 for two steps more (same metrics.jsonl)
    more = config(tmp_path, 5, **cfg.train.model_dump(exclude={"steps"}))
    steps = run(tmp_path, more, channels, resume=True)
    assert steps[:3] == first
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5]
    assert steps[0]["learner/kl"] == pytest.approx(0.0, abs=1e-6)  # at the reference
    assert all(m["learner/kl"] > 0 for m in steps[1:])
    coef = 0.1
    for m in steps:  # each step used the coefficient the previous steps' KL steered it to
        assert m["learner/kl_coef"] == pytest.approx(coef, rel=1e-6)
        coef = adaptive_coef(coef, m["learner/kl"], 0.001, 16, int(m["learner/paths"]))
    assert steps[-1]["learner/kl_coef"] > 0.1  # KL above its target: the coefficient rose
