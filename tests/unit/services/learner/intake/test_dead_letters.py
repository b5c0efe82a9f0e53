"""The learner's side of the dead-letter stream (services/learner/intake/dead_letters.py): a job
the workers dead-lettered is re-sent ``retries`` times under new job ids, then its part is given
up; evaluation jobs and letters from other streams are counted, never returned as lost parts.

Mutations tried, each failing a test here: ``<`` as ``<=`` in the retry check (one re-send too
many), the re-sent job keeping its job id (publish-once would drop its answer as a duplicate),
an evaluation job returned as a lost part, and reading from "0-0" instead of the newest letter
at start (an earlier process's letters handled again)."""

from __future__ import annotations

from brorl.v1 import common_pb2
from services.learner.intake.dead_letters import DeadLetterWatch, LostPart
from tests.memory_queue import MemoryChannels


def job(group="g3", part=1, count=2, **fields) -> common_pb2.PromptJob:
    return common_pb2.PromptJob(
        job_id=f"r/e/3/{part}", group_id=group, part_index=part, part_count=count, **fields
    )


def dead_letter(channels, message, reason="delivered 6 times") -> None:
    """What a worker's queue does with a job delivered too often (brorl.streams)."""
    entry = channels.prompts.put(message.SerializeToString())
    channels.prompts.read(count=1)
    channels.prompts.dead_letter(entry, message.SerializeToString(), reason)


def resent_jobs(channels) -> list[common_pb2.PromptJob]:
    return [common_pb2.PromptJob.FromString(d.data) for d in channels.prompts.read(count=100)]


def test_a_dead_job_is_resent_under_new_ids_then_given_up():
    channels = MemoryChannels("r")
    watch = DeadLetterWatch(channels, channels.prompts, retries=2)
    dead_letter(channels, job())
    assert watch.poll() == []
    [first] = resent_jobs(channels)
    assert first.job_id == "r/e/3/1/retry1" and first.group_id == "g3"
    dead_letter(channels, first)
    assert watch.poll() == []
    [second] = resent_jobs(channels)
    assert second.job_id == "r/e/3/1/retry1/retry2"
    dead_letter(channels, second, reason="reward service refused the job: bad")
    assert watch.poll() == [LostPart("g3", 1, 2, "reward service refused the job: bad")]
    assert resent_jobs(channels) == []
    assert watch.counts == {"jobs": 3, "resent": 2, "given_up": 1}


def test_parts_of_one_group_are_retried_each_on_its_own():
    channels = MemoryChannels("r")
    watch = DeadLetterWatch(channels, channels.prompts, retries=1)
    dead_letter(channels, job(part=0))
    dead_letter(channels, job(part=1))
    watch.poll()
    assert sorted(j.part_index for j in resent_jobs(channels)) == [0, 1]


def test_an_evaluation_job_is_given_up_without_a_lost_part():
    channels = MemoryChannels("r")
    watch = DeadLetterWatch(channels, channels.prompts, retries=0)
    dead_letter(channels, job(group="eval4.0", part=0, count=1, eval=True))
    assert watch.poll() == []
    assert watch.counts == {"jobs": 1, "given_up": 1}


def test_letters_of_other_streams_and_unreadable_ones_are_counted_only():
    channels = MemoryChannels("r")
    watch = DeadLetterWatch(channels, channels.prompts, retries=3)
    entry = channels.paths.put(b"a group")
    channels.paths.dead_letter(entry, b"a group", "not a PathGroup")
    entry = channels.prompts.put(b"\xff\xff")
    channels.prompts.read(count=1)
    channels.prompts.dead_letter(entry, b"\xff\xff", "not a PromptJob")
    assert watch.poll() == []
    assert watch.counts == {"other": 1, "unreadable": 1}
    assert resent_jobs(channels) == []


def test_it_starts_after_the_letters_already_there():
    channels = MemoryChannels("r")
    dead_letter(channels, job(part=0))  # an earlier learner process's letter
    watch = DeadLetterWatch(channels, channels.prompts, retries=1)
    assert watch.poll() == [] and resent_jobs(channels) == []
    everything = DeadLetterWatch(channels, channels.prompts, retries=1, after="0-0")
    everything.poll()
    assert [j.job_id for j in resent_jobs(channels)] == ["r/e/3/0/retry1"]
