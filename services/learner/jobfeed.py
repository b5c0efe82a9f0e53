"""The learner's job feed: keeps ``max_inflight_groups`` groups enqueued but not yet consumed.
A group is one prompt job, or several parts when ``sampling.max_paths_per_job`` fans it out
over workers; what each job asks the workers for is decided by ``brorl.sampling``."""

from __future__ import annotations

from brorl import sampling
from brorl.runconfig import RunConfig
from brorl.v1 import common_pb2
from services.learner.prompts import Prompt, PromptOrder


class JobFeed:
    """``epoch`` names this learner process's jobs: the workers publish a job id once, so a
    learner resumed from a checkpoint re-sends the groups it lost under new job ids."""

    def __init__(self, run_id: str, cfg: RunConfig, prompts: list[Prompt], queue, epoch: str):
        self.run_id, self.cfg, self.prompts, self.queue = run_id, cfg, prompts, queue
        self.epoch = epoch
        self.order = PromptOrder(len(prompts), cfg.data.shuffle_seed)
        self.cursor = 0  # groups enqueued so far (checkpointed)

    def top_up(self, consumed: int, step: int) -> None:
        """Enqueue groups until ``max_inflight_groups`` are in flight (enqueued − ``consumed``)."""
        while self.cursor - consumed < self.cfg.asynchrony.max_inflight_groups:
            self.send(self.cursor, step)
            self.cursor += 1

    def send(self, cursor: int, step: int) -> None:
        """Enqueue the jobs of group ``g<cursor>``."""
        index = self.order[cursor]
        prompt = self.prompts[index]
        for part in sampling.job_parts(self.cfg.sampling, self.cfg.explore, step):
            job = common_pb2.PromptJob(
                run_id=self.run_id,
                job_id=f"{self.run_id}/{self.epoch}/{cursor}/{part.index}",
                group_id=f"g{cursor}",
                prompt_id=f"p{index}",
                prompt=prompt.text,
                reference=prompt.reference,
                reward_fn=self.cfg.reward_fn,
                verifier_fn=self.cfg.monitors.verifier_fn,
                verifier_sample=self.cfg.monitors.verifier_sample,
                learner_step=step,
                part_index=part.index,
                part_count=part.count,
                path_offset=part.path_offset,
                explore=part.explore,
                sampling=part.sampling,
            )
            self.queue.put(job.SerializeToString())
