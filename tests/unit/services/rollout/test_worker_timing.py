"""The worker reports where its time between jobs went: reloading weights, or idle."""

from __future__ import annotations

import threading
import time

from brorl.v1 import common_pb2
from brorl.weights.store import WeightStore
from tests.memory_queue import MemoryChannels, MemoryRegistry
from tests.unit.brorl.test_sampling_contract import AlternatingReward, RecordingEngine
from services.rollout.worker import RolloutWorker


class SlowLoadingEngine(RecordingEngine):
    def load_weights(self, path: str, version: int) -> None:
        time.sleep(0.05)
        self.weight_version = version


def test_reload_and_idle_seconds_ride_with_the_next_group(tmp_path):
    store = WeightStore(tmp_path / "weights")
    staging = store.staging_dir(1)
    (staging / "model.safetensors").write_bytes(b"w")
    channels = MemoryChannels("r1")
    channels.publish_weights(store.commit(1, staging))
    worker = RolloutWorker(
        SlowLoadingEngine(),
        threading.Lock(),
        MemoryRegistry(),
        lambda run: channels,
        AlternatingReward(),
        run_id="r1",
        batch_paths=4,  # a job a turn: the second turn's group has no reload before it
    )
    for i in range(2):
        job = common_pb2.PromptJob(
            run_id="r1",
            job_id=f"r1/{i}/0",
            group_id=f"g{i}",
            prompt="1+1=",
            part_count=1,
            sampling=common_pb2.SamplingParams(n=4, temperature=1.0),
        )
        channels.prompts.put(job.SerializeToString())
    time.sleep(0.3)  # idle before the first job: far above a loaded machine's pause
    worker.step()  # reloads version 1 (50 ms), then takes the job
    worker.step()  # nothing to reload
    first, second = (common_pb2.PathGroup.FromString(d.data) for d in channels.paths.read(count=2))
    assert first.stats["rollout/reload_s"] >= 0.05
    assert first.stats["rollout/idle_s"] >= 0.3
    assert second.stats["rollout/reload_s"] == 0.0
    assert 0.0 <= second.stats["rollout/idle_s"] < first.stats["rollout/idle_s"]


class RefusingEngine(RecordingEngine):
    def generate(self, prompts, **kwargs):
        if any(len(p) > 20 for p in prompts):
            raise ValueError("prompt (30 tokens) is longer than the maximum model length 16")
        return super().generate(prompts, **kwargs)


def test_a_prompt_the_engine_refuses_comes_back_at_once_as_an_error_group(tmp_path):
    channels = MemoryChannels("r1")
    worker = RolloutWorker(
        RefusingEngine(),
        threading.Lock(),
        MemoryRegistry(),
        lambda run: channels,
        AlternatingReward(),
        run_id="r1",
    )
    for i, prompt in enumerate(["1+1=", "9" * 30 + "+1="]):
        job = common_pb2.PromptJob(
            run_id="r1",
            job_id=f"r1/{i}/0",
            group_id=f"g{i}",
            prompt=prompt,
            part_count=1,
            sampling=common_pb2.SamplingParams(n=4, temperature=1.0),
        )
        channels.prompts.put(job.SerializeToString())
    assert worker.step()  # both in one turn: the call is refused, then each job alone
    published = {
        g.group_id: g
        for g in map(
            common_pb2.PathGroup.FromString, (d.data for d in channels.paths.read(count=2))
        )
    }
    ok, refused = published["g0"], published["g1"]
    assert not ok.error and len(ok.paths) == 4
    assert "longer than the maximum model length" in refused.error and not refused.paths
    assert not channels.prompts.pending and not channels.prompts.dead  # acked, not retried
    assert refused.stats == {} and "rollout/publish_s" in ok.stats


def test_engine_phases_come_from_vllm_request_timestamps():
    from types import SimpleNamespace as NS

    from services.rollout.phases import phase_seconds

    def out(queued, scheduled, first, last):
        return NS(
            metrics=NS(
                queued_ts=queued, scheduled_ts=scheduled, first_token_ts=first, last_token_ts=last
            )
        )

    phases = phase_seconds([out(10.0, 10.5, 11.0, 12.0), out(10.2, 10.6, 11.5, 13.0)])
    assert phases == {"rollout/queue_s": 0.5, "rollout/prefill_s": 1.0, "rollout/decode_s": 1.5}
    assert phase_seconds([NS(metrics=None)]) == {}  # an engine that keeps no stats
