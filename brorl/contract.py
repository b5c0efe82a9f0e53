"""The string values of the contract's string fields, named once.

protos/brorl/v1/ carries these values as plain strings (proto evolution is additive, so the
fields stay strings); this module is the one place their spelling is written. Every service
compares against these names, and tests/unit/test_owners.py fails when a second literal copy of
one appears in source.
"""

from __future__ import annotations

import re


class RewardStatus:
    """``Path.reward_status`` / ``ScoreResult.status``: how a reward (or the held-out verifier)
    came out. ``""`` on a path means "not scored" (e.g. a verifier outside its sample)."""

    OK = "ok"  # scored; the reward is meaningful
    TIMEOUT = "timeout"  # the function ran out of its time limit; the reward is not used
    ERROR = "error"  # the function failed on this item; the reward is not used
    FILTERED = "filtered"  # a safety filter stage withheld it before scoring; never trained on
    ENV_ERROR = "env_error"  # an episode's environment failed (error, garbage): path left out
    ENV_TIMEOUT = "env_timeout"  # an episode's environment step or the episode ran out of time

    ALL = (OK, TIMEOUT, ERROR, FILTERED, ENV_ERROR, ENV_TIMEOUT)
    FAILED = (TIMEOUT, ERROR, ENV_ERROR, ENV_TIMEOUT)  # left out of advantages (reliability.md)


class EpisodeReward:
    """``EnvironmentParams.reward``: what an episode's path is rewarded with."""

    ENV = "env"  # the sum of the environment's turn rewards
    REWARD_FN = "reward_fn"  # the reward service's score of the transcript (the job's reward_fn)
    SUM = "sum"  # both, added

    ALL = (ENV, REWARD_FN, SUM)


class TokenTurn:
    """``Path.token_turns``: whose a token after the prompt is (k >= 1: the policy's k-th turn)."""

    ENVIRONMENT = 0


class ConsumerGroup:
    """The Redis Streams consumer groups: each stream is consumed by the service named here."""

    ROLLOUT = "rollout"  # brorl:{namespace}:{run}:prompts, read by rollout workers
    LEARNER = "learner"  # brorl:{namespace}:{run}:paths, read by the learner


class KeyName:
    """Names that become part of a Redis key (brorl.queue.keys): a run id and a cluster
    namespace. No ':' (the keys' separator), so no two (namespace, run) pairs share a key."""

    PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
    RULE = "use 1-64 letters, digits, '.', '_' or '-'"
    DEFAULT_NAMESPACE = "default"

    @classmethod
    def fits(cls, name: str) -> bool:
        return re.match(cls.PATTERN, name) is not None


class LearnerWaits:
    """How long LearnerService waits inside an RPC, and the deadline a client gives that RPC:
    the wait plus ``MARGIN_S`` for the answer to travel back (brorl.client uses ``deadline``)."""

    START_S = 120.0  # StartRun validates, loads the data and starts the run's thread
    STOP_S = 120.0  # StopRun waits this long for the run's thread to end
    CHECKPOINT_S = 600.0  # Checkpoint waits this long for the loop to write one
    MARGIN_S = 60.0

    @classmethod
    def deadline(cls, wait_s: float) -> float:
        return wait_s + cls.MARGIN_S
