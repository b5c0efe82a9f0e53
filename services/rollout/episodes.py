"""Multi-turn episodes: the n paths of a prompt job as episodes against an EnvironmentService
(protos/brorl/v1/environment.proto; docs/environments.md).

Every episode keeps its **token ids** from the start: the prompt's, then each policy turn as the
engine sampled it, then each observation's ids appended — earlier turns are never re-rendered or
re-tokenized, so the learner trains on exactly the ids the policy saw and sampled (re-tokenizing
a transcript can merge tokens across a turn boundary and break the importance ratio).

The scheduler keeps the engine busy while environments answer: every episode whose observation
has arrived joins the next engine call (one batch of many prompts), and Step calls run on a
bounded thread pool meanwhile, so one slow or hanging environment call stalls only its own
episode. Each Step has a deadline (``step_timeout_s``), each episode another
(``episode_timeout_s``); an episode whose environment fails ends with ``env_error`` /
``env_timeout`` (brorl.contract.RewardStatus) and is left out of the update by the learner.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import threading

import grpc

from brorl import rpc
from brorl.contract import RewardStatus, TokenTurn
from brorl.v1 import common_pb2, environment_pb2, environment_pb2_grpc

log = logging.getLogger(__name__)

MAX_OBSERVATION_CHARS = 100_000  # an observation longer than this is the environment's error
# After the first answer of a round the scheduler waits for the others before the next engine
# call, so that they make one batch (an engine call costs nearly as much for a few episodes as
# for hundreds): at most GATHER_SHARE of the last engine call's duration (at least GATHER_S), so
# a slow or hanging environment call holds the others back by a bounded share of a call.
GATHER_S = 0.02
GATHER_SHARE = 0.25


@dataclass
class Episode:
    """One path of a job as an episode; the fields a Sample has (token_ids, logprobs, text,
    finish_reason) and the episode's own."""

    index: int
    episode_id: str
    deadline: float  # time.monotonic() past which the episode is env_timeout
    token_ids: list[int] = field(default_factory=list)  # every token after the prompt
    logprobs: list[float] = field(default_factory=list)  # the sampler's; 0 for observations
    token_turns: list[int] = field(default_factory=list)  # k >= 1 policy turn k; 0 environment
    turn_rewards: list[float] = field(default_factory=list)
    turns: int = 0
    done: bool = False
    status: str = RewardStatus.OK
    detail: str = ""
    info: dict[str, str] = field(default_factory=dict)
    env_seconds: float = 0.0
    finish_reason: str = "stop"
    text: str = ""  # the transcript after the prompt, decoded (set when the episode ends)
    action: tuple[str, list[int], bool] | None = None  # the turn waiting for its Step
    cut: bool = False  # the last policy turn ended at its token bound, not a stop

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))

    def append(self, ids: list[int], turn: int, logprobs: list[float] | None = None) -> None:
        self.token_ids += ids
        self.token_turns += [turn] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def end(self, reason: str = "stop") -> None:
        self.done, self.finish_reason = True, reason

    def fail(self, status: str, detail: str) -> None:
        self.status, self.detail = status, detail[:500]
        self.end()


class EnvironmentChannels:
    """One channel per environment address, opened on first use with the worker's security
    settings (the token and TLS of its calls to other services, docs/security.md)."""

    def __init__(self, security=None):
        self.security = security
        self._stubs: dict[str, environment_pb2_grpc.EnvironmentServiceStub] = {}
        self._lock = threading.Lock()

    def stub(self, address: str) -> environment_pb2_grpc.EnvironmentServiceStub:
        with self._lock:
            if address not in self._stubs:
                channel = rpc.channel(address, self.security)
                self._stubs[address] = environment_pb2_grpc.EnvironmentServiceStub(channel)
            return self._stubs[address]


def episode_stats(episodes: list[Episode]) -> dict[str, float]:
    """A job's episode statistics for its group's stats (averaged over a step's groups)."""
    if not episodes:
        return {}
    tokens = sum(len(e.token_ids) for e in episodes)
    env_tokens = sum(t == TokenTurn.ENVIRONMENT for e in episodes for t in e.token_turns)
    steps = sum(e.turns for e in episodes)
    out = {
        "env/turns_mean": sum(e.turns for e in episodes) / len(episodes),
        "env/token_share": env_tokens / max(tokens, 1),
        "env/step_ms": 1000 * sum(e.env_seconds for e in episodes) / max(steps, 1),
        "env/failed_share": sum(e.status != RewardStatus.OK for e in episodes) / len(episodes),
    }
    return out


class EpisodeRunner:
    """Runs the episodes of one job. ``engine`` is the worker's RolloutEngine (generate, decode,
    encode, tokenizer), ``lock`` its lock, ``env`` an EnvironmentService stub."""

    def __init__(self, engine, lock, env, params: common_pb2.EnvironmentParams, context: int):
        self.engine, self.lock, self.env, self.p = engine, lock, env, params
        self.context = context  # the engine's max_model_len: prompt + episode tokens at most
        self.vocab = len(engine.tokenizer)
        self.eos = engine.tokenizer.eos_token_id
        self.last_call_s = 0.0  # the last engine call's seconds (bounds the gathering)

    def run(self, job, prompt_ids: list[int], sampling: dict, n: int) -> list[Episode]:
        """``n`` episodes of ``job``; ``sampling``: the engine arguments of one policy turn
        (brorl.sampling.effective(job.sampling).engine_kwargs(), without n)."""
        start = time.monotonic()
        episodes = [
            Episode(i, f"{job.job_id}/{job.path_offset + i}", start + self.p.episode_timeout_s)
            for i in range(n)
        ]
        pool = ThreadPoolExecutor(max_workers=max(1, min(n, self.p.max_inflight_steps)))
        try:
            self._reset(pool, job, episodes)
            self._turns(pool, prompt_ids, sampling, episodes)
        finally:
            try:
                for ep in episodes:  # best effort: the environment may be gone
                    close = environment_pb2.CloseRequest(episode_id=ep.episode_id)
                    pool.submit(self._call, "Close", close)
            except RuntimeError:  # the process is exiting: its pools take no more work
                pass
            pool.shutdown(wait=False, cancel_futures=False)
        for ep in episodes:
            ep.text = self.engine.decode(ep.token_ids)
        return episodes

    # -- the scheduler -------------------------------------------------------------------------
    def _reset(self, pool, job, episodes: list[Episode]) -> None:
        def reset(ep: Episode):
            request = environment_pb2.ResetRequest(
                episode_id=ep.episode_id,
                prompt=job.prompt,
                reference=job.reference,
                extra=job.extra,
                seed=job.sampling.seed + ep.index if job.sampling.seed else 0,
            )
            return self._call("Reset", request)

        futures = {pool.submit(reset, ep): ep for ep in episodes}
        for future, ep in futures.items():
            answer = self._answer(ep, future)
            if answer is not None:
                self._observe(ep, answer.observation)

    def _turns(self, pool, prompt_ids, sampling, episodes: list[Episode]) -> None:
        ready = [ep for ep in episodes if not ep.done]
        pending: dict[Future, Episode] = {}
        while ready or pending:
            if ready:
                self._policy_turn(prompt_ids, sampling, ready)
                for ep in ready:
                    if not ep.done:
                        pending[pool.submit(self._step, ep)] = ep
                ready = []
            if not pending:
                continue
            now = time.monotonic()
            timeout = max(min(ep.deadline for ep in pending.values()) - now, 0.0)
            finished, _ = wait(list(pending), timeout=timeout, return_when=FIRST_COMPLETED)
            if finished:
                finished = self._gather(pending, finished)
            for future in finished:
                ep = pending.pop(future)
                self._after_step(ep, future)
                if not ep.done:
                    ready.append(ep)
            now = time.monotonic()
            for future, ep in list(pending.items()):
                if now >= ep.deadline:
                    del pending[future]
                    ep.fail(RewardStatus.ENV_TIMEOUT, f"episode over {self.p.episode_timeout_s}s")

    def _gather(self, pending: dict, finished: set) -> set:
        """``finished`` and the answers that follow within the gathering time (GATHER_S,
        GATHER_SHARE)."""
        limit = max(GATHER_S, GATHER_SHARE * self.last_call_s)
        more, _ = wait(list(pending), timeout=limit, return_when=ALL_COMPLETED)
        return finished | more

    def _policy_turn(self, prompt_ids, sampling: dict, batch: list[Episode]) -> None:
        """One engine call: the next turn of every episode in ``batch`` from its token ids."""
        limit = self.p.max_total_tokens or self.context
        bounds = []
        for ep in batch:
            used = len(ep.token_ids)
            room = min(limit - used, self.context - len(prompt_ids) - used)
            bounds.append(min(sampling["max_tokens"], room))
        go = [(ep, b) for ep, b in zip(batch, bounds) if b > 0]
        for ep, b in zip(batch, bounds):
            if b <= 0:
                ep.end("length")  # no room for another turn
        if not go:
            return
        kwargs = {**sampling, "max_tokens": [b for _, b in go]}
        start = time.monotonic()
        with self.lock:
            outs = self.engine.generate([prompt_ids + ep.token_ids for ep, _ in go], n=1, **kwargs)
        self.last_call_s = time.monotonic() - start
        for (ep, _), (_, [sample]) in zip(go, outs):
            ep.turns += 1
            ep.cut = sample.finish_reason == "length"
            ep.append(list(sample.token_ids), ep.turns, list(sample.logprobs))
            ids = list(sample.token_ids)
            ep.action = (self.engine.decode(ids), ids, bool(ids) and ids[-1] == self.eos)

    def _step(self, ep: Episode):
        text, ids, policy_done = ep.action
        request = environment_pb2.StepRequest(
            episode_id=ep.episode_id,
            turn=ep.turns,
            action_text=text,
            action_token_ids=ids,
            policy_done=policy_done,
        )
        return self._call("Step", request)

    def _after_step(self, ep: Episode, future: Future) -> None:
        answer = self._answer(ep, future)
        if answer is None:
            return
        if not math.isfinite(answer.reward):
            return ep.fail(RewardStatus.ENV_ERROR, f"turn {ep.turns} reward {answer.reward}")
        ep.turn_rewards.append(float(answer.reward))
        ep.info = dict(answer.info)
        policy_done = ep.action[2] and not self.p.chat  # a chat turn ends with EOS every time
        if answer.done or policy_done:
            return ep.end("length" if ep.cut else "stop")
        if ep.turns >= self.p.max_turns:
            return ep.end("length")
        self._observe(ep, answer.observation)

    # -- environment calls ---------------------------------------------------------------------
    def _call(self, method: str, request):
        """One call with the step deadline; retried once within it if the environment was
        unreachable (Reset and Step are idempotent by episode id and turn)."""
        start = time.monotonic()
        deadline = start + self.p.step_timeout_s
        fn = getattr(self.env, method)
        try:
            return fn(request, timeout=self.p.step_timeout_s), time.monotonic() - start
        except grpc.RpcError as exc:
            left = deadline - time.monotonic()
            if exc.code() != grpc.StatusCode.UNAVAILABLE or left <= 0.05:
                raise
            time.sleep(min(0.05, left / 2))
            return fn(request, timeout=deadline - time.monotonic()), time.monotonic() - start

    def _answer(self, ep: Episode, future: Future):
        """The environment's answer, or None after failing ``ep`` with the reason."""
        if ep.done:
            return None
        try:
            answer, seconds = future.result()
        except grpc.RpcError as exc:
            code = exc.code()
            status = (
                RewardStatus.ENV_TIMEOUT
                if code == grpc.StatusCode.DEADLINE_EXCEEDED
                else RewardStatus.ENV_ERROR
            )
            ep.fail(status, f"turn {ep.turns}: {code.name}: {exc.details()}")
            return None
        ep.env_seconds += seconds
        if time.monotonic() > ep.deadline:
            ep.fail(RewardStatus.ENV_TIMEOUT, f"episode over {self.p.episode_timeout_s}s")
            return None
        return answer

    def _observe(self, ep: Episode, observation) -> None:
        """Append an observation's token ids (the environment's, checked, or its text's)."""
        ids = list(observation.token_ids)
        if ids:
            bad = [i for i in ids if not 0 <= i < self.vocab]
            if bad:
                return ep.fail(RewardStatus.ENV_ERROR, f"observation token ids {bad[:3]} outside "
                               f"the vocabulary of {self.vocab}")  # fmt: skip
        elif observation.text:
            if len(observation.text) > MAX_OBSERVATION_CHARS:
                chars = len(observation.text)
                return ep.fail(RewardStatus.ENV_ERROR, f"observation of {chars} chars")
            ids = self.engine.encode(observation.text)
        if self.p.chat and ep.turns:  # a chat turn after the policy's (Reset's joins the prompt)
            ids = self._chat_turn(ep, ids)
        ep.append(ids, TokenTurn.ENVIRONMENT)

    def _chat_turn(self, ep: Episode, ids: list[int]) -> list[int]:
        """An observation's ids as a user turn of the chat template (EnvironmentParams.chat_turn,
        derived by the learner): the policy's turn closed unless it ended with EOS, the user's
        turn around the observation, the assistant's next turn opened."""
        wrap = self.p.chat_turn
        ended = bool(ep.action) and ep.action[2]
        opening = ("" if ended else wrap.close) + wrap.before
        return self.engine.encode(opening) + ids + self.engine.encode(wrap.after)
