"""Delta sync through the real rollout reload path: the learner's publisher writes a bf16
keyframe and deltas of the tiny model, the worker's WeightSync brings the real vLLM engine to
the newest version, and the engine then computes what transformers computes with the same
reconstructed weights (bf16 values in the fp32 engine). A version staged beside a call leaves
the model on the old one until the swap. A corrupt delta is rejected and the
engine keeps serving the last version that verified."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from brorl.weights import codec  # noqa: E402
from brorl.weights.store import WeightStore  # noqa: E402
from services.learner.publish import WeightPublisher  # noqa: E402
from services.rollout.weight_sync import WeightSync  # noqa: E402
from tests.integration.test_weight_reload_parity import (  # noqa: E402
    PROMPTS,
    TOL,
    greedy_report,
    hf_with,
    load_hf,
    weights_only,
)


@pytest.mark.slow
def test_deltas_reach_the_engine_exactly(tmp_path, tiny_model_dir, tiny_engine):
    engine = tiny_engine
    hf0 = load_hf(tiny_model_dir)
    master = {}
    for name, t in hf0.state_dict().items():
        if name != "lm_head.weight":  # tied: published once, as save_pretrained does
            master[name] = t.detach().numpy().copy()
    publisher = WeightPublisher(WeightStore(tmp_path / "weights"), "bf16", keyframe_every=10)
    pointers, expected = [], {}
    rng = np.random.default_rng(0)

    def publish(version):
        if version:
            for w in master.values():  # an Adam-sized step
                w -= np.float32(3e-3) * np.sign(rng.standard_normal(w.shape)).astype(np.float32)
        publisher.publish(lambda: dict(master), pointers.append, version, step=version)
        expected[version] = {n: codec.serving_bits(w, "bf16") for n, w in master.items()}

    sync = WeightSync(engine, threading.Lock(), deadline_s=60)
    start_version = engine.weight_version
    try:
        for v in range(4):
            publish(v)
        assert [p.kind for p in pointers] == ["full", "delta", "delta", "delta"]
        assert sync.sync("run-delta", pointers[-1])  # catch up: keyframe + 3 deltas
        assert engine.weight_version == 3
        assert engine.last_apply["in_place"] == 1  # copied in place, not the layerwise reload
        hf3 = hf_with(tiny_model_dir, expected[3])
        _, diff, same = greedy_report(engine, hf3, hf3.config.eos_token_id)
        assert same and diff <= TOL, f"engine after the delta chain vs transformers: {diff}"
        _, diff_old, _ = greedy_report(engine, hf0, hf0.config.eos_token_id)
        assert diff_old > 10 * TOL, "the deltas did not change what the engine computes"

        publish(4)  # staged beside a call: the model serves version 3 until the swap
        sync.prefetch("run-delta", pointers[-1])
        sync._fetch.thread.join(60)
        assert engine.stages_weights and engine.weight_version == 3
        _, diff, same = greedy_report(engine, hf3, hf3.config.eos_token_id)
        assert same and diff <= TOL, f"a staged version changed the model: {diff}"
        assert sync.sync("run-delta", pointers[-1]) and engine.weight_version == 4
        assert engine.last_apply["in_place"] == 1 and engine.last_apply["prepare_seconds"] > 0
        hf4 = hf_with(tiny_model_dir, expected[4])

        publish(5)
        bad = Path(pointers[5].uri) / codec.DELTA_FILE
        data = bytearray(bad.read_bytes())
        data[len(data) // 2] ^= 0x10
        bad.write_bytes(bytes(data))
        assert not sync.sync("run-delta", pointers[-1])  # nothing newer verified
        assert engine.weight_version == 4 and sync.counts["rollout/weights_rejected"] == 1
        _, diff4, same4 = greedy_report(engine, hf4, hf4.config.eos_token_id)
        assert same4 and diff4 <= TOL, f"engine at the last verified version: {diff4}"
        assert len(PROMPTS) > 0
    finally:
        engine.load_weights(str(weights_only(tiny_model_dir, tmp_path / "orig")), start_version)
