"""Runs from the data people bring (docs/data.md), through the real cluster: a Parquet file with
its own column names, and a saved `datasets` DatasetDict of chat `messages` rendered with a chat
template set on the demo tokenizer; each trains and evaluates its held-out prompts greedily
every few steps (eval_every)."""

import json
import shutil
import uuid

import pytest

from brorl.client import LearnerClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]

# User turns joined, then "=" opens the answer: the demo task's "12+34=" prompts.
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}={% endif %}"
)


def config(model, data: str, steps: int = 4) -> str:
    return f"""
model: {model}
data: {data}
reward_fn: format
sampling: {{n: 16, temperature: 1.0, top_k: -1, top_p: 1.0, max_tokens: 6}}
train: {{steps: {steps}, groups_per_step: 2, lr: 0.001}}
async: {{max_staleness: 2, max_inflight_groups: 4}}
eval_every: 2
checkpoint_every: 0
samples_every: 1
"""


def finished_run(cluster, text):
    client = LearnerClient(cluster["procs"]["learner"].address)
    info = client.start(text, run_id=f"data-{uuid.uuid4().hex[:6]}")
    list(client.watch(info.run_id, timeout=600))
    final = client.get(info.run_id)
    assert final.state == "finished", final.message
    records = [
        json.loads(x)
        for x in (cluster["runs"] / info.run_id / "metrics.jsonl").read_text().splitlines()
    ]
    return final, records


def check_trained_and_evaluated(final, records, heldout: int):
    assert final.step == 4
    steps = [r for r in records if "learner/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # a round is recorded when its last group arrives (feed/heldout.py), under the step it was
    # started at: with two workers a late group of one round can close it after the next one
    rounds = sorted((r for r in records if r["event"] == "eval"), key=lambda r: r["step"])
    assert [r["step"] for r in rounds] == [0, 2, 4]
    for r in rounds:
        assert r["eval/prompts"] + r["eval/missing"] + r["eval/failed"] == heldout
        assert r["eval/prompts"] == heldout, r
        assert 0.0 <= r["eval/accuracy"] <= 1.0 and 0.0 <= r["eval/reward_mean"] <= 1.0
    # the last round was sampled by weights the run published after it started
    assert rounds[-1]["eval/weight_version"] >= 2


def test_a_parquet_file_with_its_own_columns_trains_and_evaluates(shared_cluster):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from demo.task import problems

    rows = [
        {"question": p.prompt, "answer": p.answer, "id": i}
        for i, p in enumerate(problems(120, seed=11))
    ]
    path = shared_cluster["tmp"] / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    data = (
        f"{{train_path: {path}, fields: {{prompt: question, reference: answer, extra: [id]}}, "
        "eval_fraction: 0.1, eval_max_prompts: 6}"
    )
    final, records = finished_run(shared_cluster, config(shared_cluster["model"], data))
    start = next(r for r in records if r["event"] == "start")
    assert (start["data/train_prompts"], start["data/heldout_prompts"]) == (108, 6)
    check_trained_and_evaluated(final, records, heldout=6)


def test_a_saved_dataset_of_chat_messages_trains_and_evaluates(shared_cluster, tmp_path_factory):
    import datasets
    from transformers import AutoTokenizer

    from demo.task import problems

    model = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(shared_cluster["model"], model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model)

    def chats(n, seed):
        return [
            {
                "messages": [
                    {"role": "system", "content": "answer with the number"},
                    {"role": "user", "content": p.prompt.rstrip("=")},
                ],
                "reference": p.answer,
            }
            for p in problems(n, seed=seed)
        ]

    saved = tmp_path_factory.mktemp("chat") / "dataset"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(chats(100, 12)),
            "test": datasets.Dataset.from_list(chats(5, 13)),
        }
    ).save_to_disk(str(saved))
    data = f"{{train_path: {saved}, fields: {{prompt: messages}}, eval_split: test}}"
    final, records = finished_run(shared_cluster, config(model, data))
    check_trained_and_evaluated(final, records, heldout=5)
    # the learner rendered the chats with the tokenizer's template: what was sampled ends in "="
    samples = (shared_cluster["runs"] / final.run_id / "samples.jsonl").read_text().splitlines()
    prompts = {x["prompt"] for s in samples for x in json.loads(s)["samples"]}
    assert prompts and all(p.endswith("=") and "answer with" not in p for p in prompts)
