"""The learner's side of the dead-letter stream: every prompt job it sent ends as a group, or
here. A job dead-lettered by the workers (delivered too often, refused by the reward service)
is re-sent ``dead_letter_retries`` times under a new job id; after that its part is given up —
the intake then completes the group from the parts that did arrive, or drops it — so its
in-flight slot is freed and the run goes on."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from brorl.v1 import common_pb2
from services.learner.feed import ids

log = logging.getLogger(__name__)


@dataclass
class LostPart:
    group_id: str
    part_index: int
    part_count: int
    reason: str


class DeadLetterWatch:
    def __init__(self, channels, prompt_queue, retries: int, after: str | None = None):
        """Reads ``channels``' dead letters after entry ``after`` (default: from now on)."""
        self.channels, self.prompts, self.retries = channels, prompt_queue, retries
        self.after = channels.last_dead_id() if after is None else after
        self.resent: Counter = Counter()  # (group id, part) → times re-sent
        self.counts: Counter = Counter()  # dead letters seen, re-sent, given up

    def poll(self) -> list[LostPart]:
        """Handle new dead letters: re-send what may be retried; return the parts given up."""
        self.after, letters = self.channels.read_dead(self.after)
        lost = []
        for letter in letters:
            if not self.channels.is_prompt_stream(letter.source):
                self.counts["other"] += 1  # e.g. a path group the learner could not read
                continue
            try:
                job = common_pb2.PromptJob.FromString(letter.data)
            except DecodeError:
                self.counts["unreadable"] += 1
                continue
            self.counts["jobs"] += 1
            key = (job.group_id, job.part_index)
            if self.resent[key] < self.retries:
                self.resent[key] += 1
                job.job_id = ids.retry_job_id(job.job_id, self.resent[key])
                self.prompts.put(job.SerializeToString())
                self.counts["resent"] += 1
                log.warning("re-sent dead-lettered job %s (%s)", job.job_id, letter.reason)
                continue
            self.counts["given_up"] += 1
            if job.eval:  # its evaluation round closes without it (services.learner.feed.heldout)
                log.error("gave up evaluation job %s: %s", job.job_id, letter.reason)
                continue
            lost.append(LostPart(job.group_id, job.part_index, job.part_count, letter.reason))
            log.error("gave up job %s of group %s: %s", job.job_id, job.group_id, letter.reason)
        return lost
