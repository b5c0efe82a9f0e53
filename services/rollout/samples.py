"""Engine samples → protobuf paths, and the check of a client's sampling request (no gRPC, no
vLLM). What the request's fields mean for the engine is ``brorl.sampling``'s to say."""

from __future__ import annotations

import math

from brorl.errors import InvalidArgument
from brorl.v1 import common_pb2

MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 256


def validate_sampling(s: common_pb2.SamplingParams, max_n: int, field: str = "sampling") -> None:
    if s.n <= 0:
        raise InvalidArgument(f"{field}.n", f"must be at least 1, got {s.n}")
    if s.n > max_n:
        raise InvalidArgument(f"{field}.n", f"{s.n} exceeds this service's maximum of {max_n}")
    # NaN passes every comparison below, and a NaN or infinite temperature turns the engine's
    # logits into NaN: refuse it here rather than let it reach vLLM.
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise InvalidArgument(
            f"{field}.temperature", f"must be a finite number >= 0, got {s.temperature}"
        )
    if s.temperature == 0 and s.n > 1:
        raise InvalidArgument(
            f"{field}.temperature",
            "is 0 (greedy), which yields one path; set n=1 or a temperature > 0",
        )
    if not 0 <= s.top_p <= 1:
        raise InvalidArgument(f"{field}.top_p", f"must be in (0, 1], got {s.top_p}")
    if s.top_k < -1:
        raise InvalidArgument(
            f"{field}.top_k", f"must be -1 (off), 0 (off) or positive, got {s.top_k}"
        )
    if s.max_tokens < 0:
        raise InvalidArgument(f"{field}.max_tokens", f"must be positive, got {s.max_tokens}")
    # Every path echoes its SamplingParams, so stop strings are multiplied by n in the answer:
    # unbounded, 1024 paths of one 100 kB stop string exceed any client's message limit.
    if len(s.stop) > MAX_STOP_STRINGS:
        raise InvalidArgument(
            f"{field}.stop", f"{len(s.stop)} stop strings; at most {MAX_STOP_STRINGS} are accepted"
        )
    if any(len(stop) > MAX_STOP_CHARS for stop in s.stop):
        raise InvalidArgument(
            f"{field}.stop", f"a stop string is longer than {MAX_STOP_CHARS} characters"
        )


def to_paths(
    samples,
    *,
    group_id: str,
    prompt_id: str,
    version: int,
    sampling: common_pb2.SamplingParams,
    worker: str,
    offset: int = 0,
    weights: list[float] | None = None,
) -> list[common_pb2.Path]:
    """Paths ``{group_id}/{offset + i}``: a fanned-out group's parts use disjoint offsets.
    Episodes (services/rollout/episodes.py) carry their turns, turn rewards and environment
    time as well."""
    paths = []
    for i, s in enumerate(samples):
        path = common_pb2.Path(
            path_id=f"{group_id}/{offset + i}",
            prompt_id=prompt_id,
            group_id=group_id,
            token_ids=s.token_ids,
            logprobs=s.logprobs,
            text=s.text,
            finish_reason=s.finish_reason,
            weight_version=version,
            sampling=sampling,
            worker=worker,
            weight=weights[i] if weights else 1.0,
        )
        if hasattr(s, "token_turns"):  # an episode
            path.token_turns.extend(s.token_turns)
            path.turn_rewards.extend(s.turn_rewards)
            path.turns = s.turns
            path.env_info.update(s.info)
            path.env_seconds = s.env_seconds
        paths.append(path)
    return paths
