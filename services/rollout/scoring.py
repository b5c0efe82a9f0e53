"""The worker's calls to the reward service: groups' paths scored by their jobs' reward function,
the held-out verifier on a sample of them, and a reward function on path prefixes (the quality
predictor of hierarchical selection). Every call has a deadline and is retried while the reward
service is unavailable (brorl.rpc.call_with_retry).

The groups of one engine call are scored together: one ScoreBatch per reward function (and one per
verifier) for all of them, since a batch's items are independent (each carries its own prompt and
reference, protos/brorl/v1/reward.proto) — a merged request scores exactly what the per-group
requests would, in one round trip instead of one per group. Its deadline is the per-group deadline
times the groups in it, the time the worker would have waited for them one by one.

``score_all`` is the worker's side of it: a call's jobs as (claim, job, Generated, selection,
paths) tuples (services/rollout/worker.py), each job's scoring seconds set on its Generated, and a
job the reward service refuses dead-lettered alone."""

from __future__ import annotations

import time

import grpc

from brorl import rpc, sampling
from brorl.contract import EpisodeReward, RewardStatus
from brorl.v1 import common_pb2, reward_pb2
from services.rollout.batching import shares


class RewardCalls:
    def __init__(self, reward_stub, deadline_s: float):
        self.stub, self.deadline_s = reward_stub, deadline_s

    def score_all(self, ready: list[tuple]) -> list[bool]:
        """Rewards for the jobs of one engine call (the worker's (claim, job, gen, chosen,
        paths) tuples), False for a job the reward service refused (dead-lettered): the plain
        jobs' paths in one request; episodes, and every job when the merged request is refused
        or too big, one job at a time (so that only a refused job is dead-lettered)."""
        plain = [r for r in ready if not r[1].env.address]
        merged = len(plain) > 1 and self._score_merged(plain)
        return [
            (merged and not job.env.address) or self.score_job(claim, job, paths, gen)
            for claim, job, gen, _, paths in ready
        ]

    def _score_merged(self, plain: list[tuple]) -> bool:
        start = time.perf_counter()
        try:
            self.score_groups([(job, paths) for _, job, _, _, paths in plain])
        except grpc.RpcError as exc:  # refused, or more than the service's max_batch
            if exc.code().name not in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"):
                raise
            return False
        seconds = shares(time.perf_counter() - start, [len(r[4]) for r in plain])
        for (_, _, gen, _, _), part in zip(plain, seconds):
            gen.seconds["score"] = part
        return True

    def score_job(self, claim, job, paths: list[common_pb2.Path], gen) -> bool:
        """Rewards (and the verifier's) on ``paths``; False when the reward service refused
        the job (INVALID_ARGUMENT: dead-lettered). Other errors propagate: the job stays
        pending and is retried or reclaimed."""
        start = time.perf_counter()
        try:
            if job.env.address:
                self.score_episodes(job, paths, gen.samples)
            else:
                self.score(job, paths)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            claim.dead_letter(f"reward service refused the job: {exc.details()}")
            return False
        gen.seconds["score"] = time.perf_counter() - start
        return True

    def score(self, job: common_pb2.PromptJob, paths: list[common_pb2.Path]) -> None:
        """Set every path's reward, status and components (and the verifier's on its sample)."""
        self.score_groups([(job, paths)])

    def score_groups(self, groups: list[tuple[common_pb2.PromptJob, list[common_pb2.Path]]]):
        """``score`` for several jobs' paths at once: one request per reward function and one
        per verifier function among the jobs (module docstring)."""
        asked = [(job.reward_fn, job, p) for job, paths in groups for p in paths]
        for path, result in self._results(asked, len(groups)):
            path.reward = result.reward
            path.reward_status = result.status
            path.reward_components.update(result.components)
        self.verify_groups([(job, paths) for job, paths in groups if job.verifier_fn])

    def score_episodes(self, job, paths: list[common_pb2.Path], episodes) -> None:
        """Episodes' paths by ``job.env.reward`` (brorl.contract.EpisodeReward): the
        environment's turn rewards, the reward service's score of the transcript, or both; a
        failed episode keeps its status (env_error / env_timeout) and is never scored."""
        mode = job.env.reward or EpisodeReward.ENV
        for path, episode in zip(paths, episodes):
            path.reward_status = episode.status
            path.reward = episode.reward if mode != EpisodeReward.REWARD_FN else 0.0
            path.reward_components["env"] = episode.reward
            if episode.detail:
                path.env_info["error"] = episode.detail
        scored = [p for p in paths if p.reward_status == RewardStatus.OK]
        if mode != EpisodeReward.ENV:
            for path, result in self._results([(job.reward_fn, job, p) for p in scored], 1):
                path.reward += result.reward
                path.reward_status = result.status
                path.reward_components.update(result.components)
                path.reward_components[job.reward_fn] = result.reward
        if job.verifier_fn:
            self.verify(job, [p for p in scored if p.reward_status == RewardStatus.OK])

    def verify(self, job: common_pb2.PromptJob, paths: list[common_pb2.Path]) -> None:
        """The run's held-out verifier on its sample of the paths (the learner's reward-hacking
        monitor compares it with the training reward; it never enters the update)."""
        self.verify_groups([(job, paths)])

    def verify_groups(self, groups: list[tuple[common_pb2.PromptJob, list[common_pb2.Path]]]):
        asked = [
            (job.verifier_fn, job, p)
            for job, paths in groups
            for p in paths
            if sampling.verifies(p.path_id, job.verifier_sample)
        ]
        for path, result in self._results(asked, len(groups)):
            path.verifier_reward = result.reward
            path.verifier_status = result.status or RewardStatus.OK

    def prefix_scores(self, job, texts: dict[int, str], reward_fn: str) -> list[float]:
        """``reward_fn`` on the texts of candidate ``index → prefix text``, in their order."""
        items = [
            reward_pb2.ScoreRequest(
                id=str(i), prompt=job.prompt, completion=t, reference=job.reference, extra=job.extra
            )
            for i, t in texts.items()
        ]
        request = reward_pb2.ScoreBatchRequest(reward_fn=reward_fn, items=items)
        return [r.reward for r in self._call(request).results]

    def _results(self, asked: list[tuple], groups: int):
        """(path, result) for each (function, job, path) of ``groups`` groups: one request per
        function."""
        by_fn: dict[str, list[tuple]] = {}
        for fn, job, path in asked:
            by_fn.setdefault(fn, []).append((job, path))
        for fn, pairs in by_fn.items():
            for (_, path), result in zip(pairs, self._score_pairs(fn, pairs, groups)):
                yield path, result

    def _score_pairs(self, reward_fn: str, pairs: list[tuple], groups: int = 1) -> list:
        """``reward_fn``'s results for (job, path) pairs of ``groups`` groups, in their order;
        one request."""
        if not pairs:
            return []
        items = [
            reward_pb2.ScoreRequest(
                id=p.path_id,
                prompt=job.prompt,
                completion=p.text,
                reference=job.reference,
                extra=job.extra,
            )
            for job, p in pairs
        ]
        request = reward_pb2.ScoreBatchRequest(reward_fn=reward_fn, items=items)
        return list(self._call(request, groups).results)

    def _call(self, request, groups: int = 1):
        timeout = self.deadline_s * max(groups, 1)
        return rpc.call_with_retry(self.stub.ScoreBatch, request, timeout=timeout)
