"""Multi-turn episodes in the rollout worker (services/rollout/episodes.py), without vLLM: a
scripted engine, the calculator environment behind a fake stub (or a real in-process server),
and environments that hang, fail or answer garbage.

Mutations tried, each failing a test here: re-tokenizing the whole transcript each turn (the
token ids then differ from the turns' own), the scheduler waiting for every Step of a turn
before the next engine call (a hanging episode then holds the others back), the Step deadline
not mapped to env_timeout, observation ids not checked against the vocabulary, a chat
observation appended without its wrapping or with the policy's turn closed twice, a chat turn's
EOS ending the episode."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import grpc

from brorl.contract import RewardStatus, TokenTurn
from brorl.errors import NotFound
from brorl.v1 import common_pb2
from brorl.v1 import environment_pb2 as pb
from envs.base import Turn
from envs.calculator import Calculator
from envs.episodes import EpisodeTable
from services.rollout.episodes import EpisodeRunner, episode_stats

EOS = 2


class Tokenizer:
    """Characters are tokens, except that "12" is one token: tokenizing "1" and "2" apart gives
    two ids where the text "12" gives one (a merge across a turn boundary)."""

    eos_token_id = EOS
    alphabet = "0123456789+-*=[]|? "

    def __len__(self):
        return 64

    def encode(self, text):
        ids, i = [], 0
        while i < len(text):
            if text.startswith("12", i):
                ids.append(40)
                i += 2
            else:
                ids.append(10 + self.alphabet.index(text[i]))
                i += 1
        return ids

    def decode(self, ids):
        return "".join("12" if t == 40 else self.alphabet[t - 10] for t in ids if t >= 10)


@dataclass
class Sample:
    token_ids: list
    logprobs: list
    text: str
    finish_reason: str = "stop"


class ScriptedEngine:
    """Answers a turn by the number of tool results (|) the episode has read so far: first the
    tool call, then the answer it read, then EOS."""

    def __init__(self, call="[6*2]", calls_log=None):
        self.tokenizer = Tokenizer()
        self.call = call
        self.calls: list[tuple[float, int]] = calls_log if calls_log is not None else []

    def encode(self, text):
        return self.tokenizer.encode(text)

    def decode(self, ids):
        return self.tokenizer.decode(ids)

    def generate(self, prompts, n, max_tokens, **kwargs):
        self.calls.append((time.monotonic(), len(prompts)))
        out = []
        for ids, bound in zip(prompts, max_tokens):
            text = self.tokenizer.decode(ids)
            if "|" not in text:
                turn = self.encode(self.call)
            else:  # the answer it read, one character a token (never the merged "12")
                read = text.rsplit("]", 1)[1].split("|")[0]
                answer = "".join(c for c in read if c.isdigit())  # a chat turn's wrapping left out
                turn = [10 + self.tokenizer.alphabet.index(c) for c in answer] + [EOS]
            turn = turn[:bound]
            out.append((ids, [Sample(turn, [-0.25] * len(turn), self.decode(turn))]))
        return out


class Deadline(grpc.RpcError):
    def __init__(self, code=grpc.StatusCode.DEADLINE_EXCEEDED, details="deadline exceeded"):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class FakeEnv:
    """The calculator environment's episode table behind stub-shaped methods; ``hang`` names
    episodes whose Step waits out its deadline, ``garbage`` episodes answered with bad ids."""

    def __init__(self, hang=(), garbage=(), fail=(), env=None):
        self.table = EpisodeTable(env or Calculator())
        self.hang, self.garbage, self.fail = set(hang), set(garbage), set(fail)
        self.steps = 0

    def Reset(self, request, timeout=None):
        obs = self.table.reset(request.episode_id, request.prompt, request.reference, {}, 0)
        return pb.ResetResponse(observation=pb.Observation(text=obs))

    def Step(self, request, timeout=None):
        index = int(request.episode_id.rsplit("/", 1)[1])
        if index in self.hang:
            time.sleep(timeout)
            raise Deadline()
        if index in self.fail:
            raise Deadline(grpc.StatusCode.INTERNAL, "the environment crashed")
        self.steps += 1
        turn = self.table.step(request.episode_id, request.turn, request.action_text,
                               request.policy_done)  # fmt: skip
        ids = [999] if index in self.garbage else []
        return pb.StepResponse(
            observation=pb.Observation(text=turn.observation, token_ids=ids),
            reward=turn.reward,
            done=turn.done,
        )

    def Close(self, request, timeout=None):
        try:
            self.table.close(request.episode_id)
        except NotFound:
            pass
        return pb.CloseResponse()


def params(**kw):
    base = dict(address="x:1", max_turns=3, step_timeout_s=2.0, episode_timeout_s=30.0,
                max_inflight_steps=8)  # fmt: skip
    return common_pb2.EnvironmentParams(**{**base, **kw})


def run(engine, env, n=4, **kw):
    job = common_pb2.PromptJob(job_id="r/e/0/0", prompt="6*2=", reference="12")
    prompt = engine.encode("6*2=")
    runner = EpisodeRunner(engine, threading.Lock(), env, params(**kw), context=64)
    return runner.run(job, prompt, {"max_tokens": 8, "temperature": 1.0}, n)


def test_episodes_keep_the_token_ids_of_every_turn():
    engine = ScriptedEngine()
    episodes = run(engine, FakeEnv())
    for ep in episodes:
        assert ep.status == RewardStatus.OK and ep.turns == 2 and ep.reward == 1.0
        call, obs, answer = engine.encode("[6*2]"), engine.encode("12|"), [11, 12]
        assert ep.token_ids == call + obs + answer + [EOS]
        assert ep.token_turns == [1] * len(call) + [TokenTurn.ENVIRONMENT] * len(obs) + [2] * 3
        assert ep.logprobs == [-0.25] * len(call) + [0.0] * len(obs) + [-0.25] * 3
        assert ep.text == "[6*2]12|12"
    assert engine.calls[0][1] == 4  # every episode's first turn in one engine call
    assert sum(n for _, n in engine.calls) == 8 and len(engine.calls) <= 3


def test_the_transcript_is_never_re_tokenized():
    """The policy wrote its answer 1, 2 as two tokens; the text "12" tokenizes as one. The path
    keeps the two ids the policy sampled (its log-probs are of those): a worker that re-rendered
    the transcript and tokenized it anew would train on ids the policy never saw."""
    engine = ScriptedEngine()
    [ep] = run(engine, FakeEnv(), n=1)
    answer = [t for t, k in zip(ep.token_ids, ep.token_turns) if k == 2]
    assert answer == [11, 12, EOS]
    assert engine.encode(engine.decode(ep.token_ids)) != ep.token_ids[:-1]  # it would differ
    assert len(ep.logprobs) == len(ep.token_ids) == len(ep.token_turns)


def test_one_hanging_environment_call_does_not_hold_the_other_episodes():
    engine = ScriptedEngine()
    start = time.monotonic()
    episodes = run(engine, FakeEnv(hang={0}), step_timeout_s=1.0)
    assert episodes[0].status == RewardStatus.ENV_TIMEOUT
    assert all(e.status == RewardStatus.OK and e.turns == 2 for e in episodes[1:])
    second_turn = engine.calls[1][0]  # the others' next turn came before the hang ended
    assert second_turn - start < 0.9, engine.calls
    assert sum(n for _, n in engine.calls) == 4 + 3


def test_failures_end_their_episode_with_a_status():
    episodes = run(ScriptedEngine(), FakeEnv(fail={1}, garbage={2}))
    assert episodes[1].status == RewardStatus.ENV_ERROR and "crashed" in episodes[1].detail
    assert episodes[2].status == RewardStatus.ENV_ERROR and "vocabulary" in episodes[2].detail
    assert episodes[0].status == episodes[3].status == RewardStatus.OK
    stats = episode_stats(episodes)
    assert stats["env/failed_share"] == 0.5 and stats["env/turns_mean"] > 1


def test_max_turns_and_the_token_budget_end_episodes():
    class Looping(ScriptedEngine):  # calls the tool for ever
        def generate(self, prompts, n, max_tokens, **kw):
            call = self.encode("[1]")
            return [(p, [Sample(call[:b], [-0.1] * min(3, b), "", "stop" if b >= 3 else "length")])
                    for p, b in zip(prompts, max_tokens)]  # fmt: skip

    [ep] = run(Looping(), FakeEnv(), n=1, max_turns=3)
    assert (ep.turns, ep.finish_reason, ep.status) == (3, "length", RewardStatus.OK)
    [ep] = run(Looping(), FakeEnv(), n=1, max_turns=50, max_total_tokens=11)
    assert len(ep.token_ids) <= 11 and ep.finish_reason == "length"


def test_an_episode_deadline_ends_a_slow_episode():
    class Slow(FakeEnv):
        def Step(self, request, timeout=None):
            time.sleep(0.3)
            return super().Step(request, timeout)

    episodes = run(ScriptedEngine(), Slow(), n=2, episode_timeout_s=0.4)
    assert {e.status for e in episodes} == {RewardStatus.ENV_TIMEOUT}


# A chat wrapping in the fake tokenizer's characters: close "?", before "=", after "+"
CHAT = common_pb2.ChatTurn(close="?", before="=", after="+")


def test_chat_observations_are_wrapped_as_turns_and_appended():
    """The tool call ends at its stop string, so its turn is closed before the user's turn; the
    answer's turn ends with EOS, which the environment's done ends (not the EOS)."""
    engine = ScriptedEngine()
    [ep] = run(engine, FakeEnv(), n=1, chat=True, chat_turn=CHAT)
    call, obs = engine.encode("[6*2]"), engine.encode("12|")
    wrapped = engine.encode("?=") + obs + engine.encode("+")
    assert ep.token_ids == call + wrapped + [11, 12, EOS]
    assert ep.token_turns == [1] * len(call) + [TokenTurn.ENVIRONMENT] * len(wrapped) + [2] * 3
    assert ep.reward == 1.0 and ep.turns == 2


def test_a_chat_turn_ending_with_eos_is_not_closed_again_and_does_not_end_the_episode():
    class Replies:  # three policy turns, each answered "1|"
        name, version, max_turns, description = "replies", "1", 3, ""

        def reset(self, prompt, reference, extra, seed):
            return {}, ""

        def step(self, state, turn, action, policy_done):
            return Turn(observation="1|", reward=float(turn == 3), done=turn == 3)

    class Eos(ScriptedEngine):  # every turn: "7" then EOS, as a chat model ends its turns
        def generate(self, prompts, n, max_tokens, **kw):
            return [(p, [Sample([17, EOS], [-0.5, -0.5], "7")]) for p in prompts]

    [ep] = run(Eos(), FakeEnv(env=Replies()), n=1, chat=True, chat_turn=CHAT)
    turn, obs = [17, EOS], Eos().encode("=1|+")
    assert ep.token_ids == turn + obs + turn + obs + turn
    assert (ep.turns, ep.reward, ep.status) == (3, 1.0, RewardStatus.OK)
    [ep] = run(Eos(), FakeEnv(env=Replies()), n=1)  # without chat the EOS ends the episode
    assert ep.turns == 1
