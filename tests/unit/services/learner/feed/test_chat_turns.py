"""The chat wrapping of an observation (services/learner/feed/chat_turns.py) from real
Hugging Face tokenizers and templates, and StartRun's refusal of templates it cannot append to.

Mutations tried, each failing a test here: no append-only check (the turn-counting template
then passes), the EOS not split off as ``close`` (the ChatML case then has close "" and before
starting with <|im_end|>), the content-dependence check removed (the by-content template then
passes)."""

from __future__ import annotations

import pytest

from brorl.errors import InvalidArgument
from services.learner.feed.chat_turns import chat_turn

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# a header that counts the turns: adding a turn rewrites the start of the conversation
COUNTED = "<|im_start|>system\n{{ messages | length }} turns<|im_end|>\n" + CHATML
BY_CONTENT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}{% if m['content'] | length > 10 %}!"
    "{% endif %}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from demo.model import build_tokenizer

    tok = build_tokenizer(list("abcdefghijklmnopqrstuvwxyz0123456789 \n|"))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML
    return tok


def test_chatml_observations_are_user_turns(tokenizer):
    turn = chat_turn(tokenizer)
    assert turn.close == "<|im_end|>"
    assert turn.before == "\n<|im_start|>user\n"
    assert turn.after == "<|im_end|>\n<|im_start|>assistant\n"


def test_the_wrapping_appended_equals_the_template_rendering(tokenizer):
    """Prompt + reply + the wrapped observation is exactly the template's rendering of the
    conversation with the assistant's next turn opened."""
    turn = chat_turn(tokenizer)
    messages = [{"role": "user", "content": "what is 6 times 7"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    appended = prompt + "42" + turn.close + turn.before + "ok|" + turn.after
    messages += [{"role": "assistant", "content": "42"}, {"role": "user", "content": "ok|"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert appended == rendered


def test_data_chat_template_overrides_the_tokenizers(tokenizer):
    turn = chat_turn(tokenizer, "{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert (turn.close, turn.before, turn.after) == ("", "][", "]")


@pytest.mark.parametrize(
    "template, words",
    [(COUNTED, "not append-only"), (BY_CONTENT, "by its content"), ("{{ oops(", "failed")],
)
def test_templates_that_cannot_be_appended_to_are_refused(tokenizer, template, words):
    with pytest.raises(InvalidArgument) as err:
        chat_turn(tokenizer, template)
    assert err.value.field == "env.chat" and words in str(err.value)


def test_a_tokenizer_without_a_template_is_refused():
    from demo.model import build_tokenizer

    with pytest.raises(InvalidArgument, match="needs a chat template"):
        chat_turn(build_tokenizer())
    with pytest.raises(InvalidArgument, match="needs a chat template"):
        chat_turn(None)
