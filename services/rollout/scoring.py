"""The worker's calls to the reward service: a group's paths scored by the job's reward function,
its held-out verifier on a sample of them, and a reward function on path prefixes (the quality
predictor of hierarchical selection). Every call has a deadline and is retried while the reward
service is unavailable (brorl.rpc.call_with_retry)."""

from __future__ import annotations

from brorl import rpc, sampling
from brorl.contract import EpisodeReward, RewardStatus
from brorl.v1 import common_pb2, reward_pb2


class RewardCalls:
    def __init__(self, reward_stub, deadline_s: float):
        self.stub, self.deadline_s = reward_stub, deadline_s

    def score(self, job: common_pb2.PromptJob, paths: list[common_pb2.Path]) -> None:
        """Set every path's reward, status and components (and the verifier's on its sample)."""
        if not paths:
            return
        for path, result in zip(paths, self._score_with(job.reward_fn, job, paths)):
            path.reward = result.reward
            path.reward_status = result.status
            path.reward_components.update(result.components)
        if job.verifier_fn:
            self.verify(job, paths)

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
            for path, result in zip(scored, self._score_with(job.reward_fn, job, scored)):
                path.reward += result.reward
                path.reward_status = result.status
                path.reward_components.update(result.components)
                path.reward_components[job.reward_fn] = result.reward
        if job.verifier_fn:
            self.verify(job, [p for p in scored if p.reward_status == RewardStatus.OK])

    def verify(self, job: common_pb2.PromptJob, paths: list[common_pb2.Path]) -> None:
        """The run's held-out verifier on its sample of the paths (the learner's reward-hacking
        monitor compares it with the training reward; it never enters the update)."""
        sample = [p for p in paths if sampling.verifies(p.path_id, job.verifier_sample)]
        for path, result in zip(sample, self._score_with(job.verifier_fn, job, sample)):
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

    def _score_with(self, reward_fn: str, job, paths: list[common_pb2.Path]) -> list:
        if not paths:
            return []
        request = reward_pb2.ScoreBatchRequest(
            reward_fn=reward_fn,
            items=[
                reward_pb2.ScoreRequest(
                    id=p.path_id,
                    prompt=job.prompt,
                    completion=p.text,
                    reference=job.reference,
                    extra=job.extra,
                )
                for p in paths
            ],
        )
        return list(self._call(request).results)

    def _call(self, request):
        return rpc.call_with_retry(self.stub.ScoreBatch, request, timeout=self.deadline_s)
