"""Rows → prompts: the field mapping, chat messages through a chat template, the held-out split,
the context check and the defaults taken from the model's files."""

from __future__ import annotations

import json

import pytest

from brorl.errors import InvalidArgument
from brorl.config.run import RunConfig
from services.learner.feed.prompts import load_run_prompts, split_heldout

# Renders a chat with the demo's character vocabulary: user turns joined, then "=" opens the
# answer (the demo's prompts are "12+34=").
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}={% endif %}"
)


@pytest.fixture
def model_dir(tmp_path):
    from demo.model import build_tokenizer

    d = tmp_path / "model"
    d.mkdir()
    build_tokenizer().save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 16}))
    return d


def cfg(model_dir, data_path, **data) -> RunConfig:
    run = {k: data.pop(k) for k in ("eval_every", "sampling") if k in data}
    return RunConfig.model_validate(
        {
            "model": str(model_dir),
            "data": {"train_path": str(data_path), **data},
            "sampling": {"max_tokens": 4, **run.pop("sampling", {})},
            **run,
        }
    )


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_fields_map_columns_and_extras_become_strings(tmp_path, model_dir):
    data = jsonl(
        tmp_path / "d.jsonl",
        [{"q": "1+2=", "a": 3, "tags": ["x", "y"], "level": "easy"}],
    )
    c = cfg(
        model_dir,
        data,
        fields={"prompt": "q", "reference": "a", "extra": ["tags", "level"]},
    )
    [p] = load_run_prompts(c).train
    assert (p.text, p.reference) == ("1+2=", "3")
    assert p.extra == {"tags": '["x", "y"]', "level": "easy"}


def test_a_missing_prompt_column_names_the_row_and_the_columns(tmp_path, model_dir):
    data = jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1="}, {"question": "2+2="}])
    with pytest.raises(InvalidArgument, match=r"row 2 needs .* 'prompt' \(columns: question\)"):
        load_run_prompts(cfg(model_dir, data))
    with pytest.raises(InvalidArgument, match=r"row 1 has no column\(s\) \['level'\]"):
        load_run_prompts(cfg(model_dir, data, fields={"extra": ["level"]}))


def test_chat_messages_are_rendered_with_the_tokenizers_template(tmp_path, model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model_dir)
    rows = [
        {
            "messages": [
                {"role": "system", "content": "be exact"},
                {"role": "user", "content": "12+34"},
            ],
            "reference": "46",
        }
    ]
    c = cfg(model_dir, jsonl(tmp_path / "d.jsonl", rows), fields={"prompt": "messages"})
    [p] = load_run_prompts(c).train
    assert p.text == "12+34=" and p.reference == "46"
    # the run's own template wins over the tokenizer's
    c = cfg(
        model_dir,
        tmp_path / "d.jsonl",
        fields={"prompt": "messages"},
        chat_template="{{ messages[-1]['content'] }}-",
    )
    assert load_run_prompts(c).train[0].text == "12+34-"


def test_chat_without_a_template_or_with_bad_messages_is_refused(tmp_path, model_dir):
    rows = [{"prompt": [{"role": "user", "content": "1+1"}]}]
    data = jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(InvalidArgument, match="has no chat template; set data.chat_template"):
        load_run_prompts(cfg(model_dir, data))
    jsonl(data, [{"prompt": [{"role": "user"}]}])
    with pytest.raises(InvalidArgument, match="message 0 needs string 'role' and 'content'"):
        load_run_prompts(cfg(model_dir, data, chat_template=TEMPLATE))
    jsonl(data, rows)
    with pytest.raises(InvalidArgument, match="data.chat_template: rendering failed"):
        load_run_prompts(cfg(model_dir, data, chat_template="{% for %}"))


def test_prompts_longer_than_the_context_are_counted_and_left_out(tmp_path, model_dir):
    # context 16 - max_tokens 4 = 12 characters (one token each) fit
    rows = [{"prompt": "1" * n} for n in (3, 12, 13, 20)]
    got = load_run_prompts(cfg(model_dir, jsonl(tmp_path / "d.jsonl", rows)))
    assert [len(p.text) for p in got.train] == [3, 12]
    assert got.too_long == 2 and got.context == 16
    with pytest.raises(InvalidArgument, match="no training prompt fits .* 16 tokens"):
        load_run_prompts(cfg(model_dir, tmp_path / "d.jsonl", sampling={"max_tokens": 15}))


def test_max_tokens_defaults_from_the_generation_config(tmp_path, model_dir):
    data = jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1="}])
    (model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    c = RunConfig.model_validate({"model": str(model_dir), "data": {"train_path": str(data)}})
    load_run_prompts(c)
    assert c.sampling.max_tokens == 16  # brorl.sampling's default: no generation config
    (model_dir / "generation_config.json").write_text(json.dumps({"max_new_tokens": 7}))
    c = RunConfig.model_validate({"model": str(model_dir), "data": {"train_path": str(data)}})
    load_run_prompts(c)
    assert c.sampling.max_tokens == 7


def test_heldout_fraction_is_deterministic_and_disjoint(tmp_path, model_dir):
    rows = [{"prompt": f"{i}+1=", "reference": str(i + 1)} for i in range(40)]
    data = jsonl(tmp_path / "d.jsonl", rows)
    a = load_run_prompts(cfg(model_dir, data, eval_fraction=0.25, shuffle_seed=3))
    b = load_run_prompts(cfg(model_dir, data, eval_fraction=0.25, shuffle_seed=3))
    assert len(a.heldout) == 10 and len(a.train) == 30
    assert [p.text for p in a.heldout] == [p.text for p in b.heldout]
    assert not {p.text for p in a.heldout} & {p.text for p in a.train}
    assert split_heldout(a.train, 0.01, 0)[1]  # at least one


def test_heldout_from_a_file_or_a_split_and_the_eval_checks(tmp_path, model_dir):
    import datasets

    train = [{"prompt": f"{i}+1="} for i in range(5)]
    test = [{"prompt": f"{i}+2="} for i in range(3)]
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(test)}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    got = load_run_prompts(cfg(model_dir, tmp_path / "dd", eval_split="test"))
    assert [p.text for p in got.heldout] == ["0+2=", "1+2=", "2+2="] and len(got.train) == 5
    got = load_run_prompts(
        cfg(model_dir, tmp_path / "dd", eval_path=str(jsonl(tmp_path / "e.jsonl", test)))
    )
    assert len(got.heldout) == 3
    got = load_run_prompts(cfg(model_dir, tmp_path / "dd", eval_split="test", eval_max_prompts=2))
    assert len(got.heldout) == 2
    with pytest.raises(InvalidArgument, match="eval_every: is set but there are no held-out"):
        load_run_prompts(cfg(model_dir, tmp_path / "dd", eval_every=5))
    with pytest.raises(ValueError, match="set one held-out source"):
        cfg(model_dir, tmp_path / "dd", eval_split="test", eval_fraction=0.1)


def test_each_prompt_is_tokenized_once_and_its_jobs_carry_the_ids(tmp_path, model_dir):
    """The context check counts these ids, and every job (training and held-out) carries them:
    the worker samples from them, so the learner trains on the ids it checked."""
    from demo.model import build_tokenizer
    from services.learner.feed.heldout import HeldoutEval
    from services.learner.feed.jobfeed import JobFeed
    from tests.memory_queue import MemoryStreamQueue
    from brorl.v1 import common_pb2

    rows = [{"prompt": "12+34=", "reference": "46"}, {"prompt": "7+8=", "reference": "15"}]
    run = cfg(model_dir, jsonl(tmp_path / "d.jsonl", rows), eval_fraction=0.5, eval_every=1)
    got = load_run_prompts(run)
    tokenizer = build_tokenizer()
    for p in got.train + got.heldout:
        assert p.token_ids == tuple(tokenizer(p.text)["input_ids"]) and p.token_ids
    queue = MemoryStreamQueue()
    JobFeed("r", run, got.train, queue, epoch="e").send(0, step=0)
    HeldoutEval("r", run, got.heldout, queue, "e", emit=lambda *a: None, timeout_s=5).start(0)
    jobs = [common_pb2.PromptJob.FromString(d.data) for d in queue.read(count=10)]
    assert len(jobs) == 2 and {j.eval for j in jobs} == {False, True}
    by_text = {p.text: p.token_ids for p in got.train + got.heldout}
    for job in jobs:
        assert tuple(job.prompt_token_ids) == by_text[job.prompt]


def test_env_chat_sends_the_templates_turn_wrapping_with_every_job(tmp_path, model_dir):
    """With env.chat the jobs carry the chat turn derived once from the template (training and
    held-out); a tokenizer without a template is refused at load, naming env.chat."""
    from services.learner.feed.heldout import HeldoutEval
    from services.learner.feed.jobfeed import JobFeed
    from tests.memory_queue import MemoryStreamQueue
    from brorl.v1 import common_pb2

    rows = [{"prompt": "1+2=", "reference": "3"}, {"prompt": "3+4=", "reference": "7"}]
    data = jsonl(tmp_path / "d.jsonl", rows)
    env = {"env": {"address": "127.0.0.1:1", "chat": True}}
    with pytest.raises(InvalidArgument) as err:
        load_run_prompts(RunConfig.model_validate({**cfg(model_dir, data).model_dump(), **env}))
    assert err.value.field == "env.chat"
    template = (  # user turns end "=", the assistant's "+"
        "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'user' %}={% else %}+"
        "{% endif %}{% endfor %}"
    )
    run = cfg(model_dir, data, chat_template=template, eval_fraction=0.5, eval_every=1)
    run = RunConfig.model_validate({**run.model_dump(), **env})
    got = load_run_prompts(run)
    assert got.env.chat and (got.env.chat_turn.before, got.env.chat_turn.after) == ("+", "=")
    queue = MemoryStreamQueue()
    JobFeed("r", run, got.train, queue, epoch="e", env=got.env).send(0, step=0)
    HeldoutEval("r", run, got.heldout, queue, "e", lambda *a: None, 5, env=got.env).start(0)
    jobs = [common_pb2.PromptJob.FromString(d.data) for d in queue.read(count=10)]
    assert len(jobs) == 2 and all(j.env == got.env for j in jobs)
