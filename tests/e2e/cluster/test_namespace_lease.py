"""One learner at a time trains in a namespace (brorl.queue.NamespaceLease): a second learner's
StartRun there is refused with FAILED_PRECONDITION naming the namespace while the first one's run
lasts (its workers would leave that run for the second's), and succeeds once that run ends."""

import json
import uuid

import grpc
import pytest

from brorl.apps.cluster.service_proc import ServiceProc, stop_all
from brorl.client import LearnerClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


def run_config(model, data, steps: int) -> str:
    return f"""
model: {model}
data: {{train_path: {data}}}
reward_fn: format
sampling: {{n: 16, temperature: 1.0, top_k: -1, top_p: 1.0, max_tokens: 6}}
train: {{steps: {steps}, groups_per_step: 2, lr: 0.001}}
async: {{max_staleness: 2, max_inflight_groups: 4}}
checkpoint_every: 0
"""


def test_a_second_learner_in_a_namespace_waits_for_the_first_ones_run(shared_cluster, tmp_path):
    from demo.task import problems

    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n"
            for p in problems(50, seed=3)
        )
    )
    model, namespace = shared_cluster["model"], shared_cluster["namespace"]
    first = LearnerClient(shared_cluster["procs"]["learner"].address)
    other = ServiceProc(
        "learner",
        tmp_path,
        name="learner-2",
        runs_dir=str(tmp_path / "runs"),
        namespace=namespace,
        namespace_lease_s=2,  # how long it waits for a lease to lapse before it refuses
        read_roots=json.dumps([str(tmp_path), str(model)]),
    )
    try:
        other.wait_serving()
        second = LearnerClient(other.address)
        long_run = f"lease-{uuid.uuid4().hex[:6]}"
        first.start(run_config(model, data, steps=10_000), run_id=long_run)
        try:
            with pytest.raises(grpc.RpcError) as refused:
                second.start(
                    run_config(model, data, steps=2), run_id=f"late-{uuid.uuid4().hex[:6]}"
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert (
                f"namespace '{namespace}' is in use by another learner" in refused.value.details()
            )
        finally:
            assert first.stop(long_run).state == "stopped"
        # the first learner let go at its run's end: the second one's run starts and trains
        run_id = f"after-{uuid.uuid4().hex[:6]}"
        second.start(run_config(model, data, steps=2), run_id=run_id)
        list(second.watch(run_id, timeout=300))
        final = second.get(run_id)
        assert final.state == "finished" and final.step == 2, final.message
    finally:
        stop_all([other])
