"""How an environment's observation becomes a chat turn (``env.chat``), derived once from the
model's chat template at StartRun and sent with every job (``EnvironmentParams.chat_turn``).

An episode's token ids are only ever appended to (docs/environments.md): the rollout worker never
re-renders the conversation. So the template is rendered here twice, around placeholder texts —
a user message and an assistant reply, then the same plus a user message (the observation) with
the assistant's turn opened — and the strings between the placeholders are the turn's wrapping:

    ...<assistant>REPLY | close | before | OBSERVATION | after

(ChatML: close ``<|im_end|>``, before ``\\n<|im_start|>user\\n``, after
``<|im_end|>\\n<|im_start|>assistant\\n``.)

That is exact only for templates that are *append-only*: the rendering of a conversation with one
more turn starts with the rendering without it. Templates that rewrite earlier turns when a later
one arrives (for example ones that drop an earlier reply's reasoning, or render the last assistant
turn differently from the others) are refused with the reason; ``data.chat_template`` can give an
append-only template instead.
"""

from __future__ import annotations

from brorl.errors import InvalidArgument
from brorl.v1 import common_pb2

# Placeholders no template writes itself (private-use code points); two observations, to check
# that the wrapping does not depend on what the observation says.
USER, REPLY = "\ue000user\ue000", "\ue001reply\ue001"
OBSERVATIONS = ("\ue002observation\ue002", "\ue003other\ue003")
FIELD = "env.chat"


def _render(tokenizer, template: str, messages: list[dict], open_reply: bool) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=open_reply,
            chat_template=template or None,
        )
    except Exception as exc:  # noqa: BLE001 - a template's Jinja error is the run config's error
        raise InvalidArgument(FIELD, f"rendering the chat template failed: {exc}") from None


def chat_turn(tokenizer, template: str = "") -> common_pb2.ChatTurn:
    """The wrapping of an observation under ``template`` (``data.chat_template``; "" the
    tokenizer's own), or InvalidArgument naming env.chat with what is wrong."""
    if tokenizer is None or not (template or getattr(tokenizer, "chat_template", None)):
        raise InvalidArgument(
            FIELD, "needs a chat template: the model's tokenizer has none (set data.chat_template)"
        )
    history = [{"role": "user", "content": USER}, {"role": "assistant", "content": REPLY}]
    before_reply = _render(tokenizer, template, history, open_reply=False)
    turns = []
    for obs in OBSERVATIONS:
        text = _render(tokenizer, template, history + [{"role": "user", "content": obs}], True)
        if not text.startswith(before_reply):
            raise InvalidArgument(
                FIELD,
                "the chat template is not append-only: adding a turn changes how the earlier "
                "turns are rendered, so an episode's tokens would differ from what the policy "
                "saw; give data.chat_template an append-only template or set env.chat false",
            )
        if text.count(REPLY) != 1 or text.count(obs) != 1:
            raise InvalidArgument(FIELD, "the chat template drops or repeats message contents")
        tail = text[text.index(REPLY) + len(REPLY) :]
        between, after = tail.split(obs)
        eos = tokenizer.eos_token or ""
        close = eos if eos and between.startswith(eos) else ""
        turns.append((close, between[len(close) :], after))
    if turns[0] != turns[1]:
        raise InvalidArgument(FIELD, "the chat template wraps a turn differently by its content")
    close, before, after = turns[0]
    return common_pb2.ChatTurn(close=close, before=before, after=after)
