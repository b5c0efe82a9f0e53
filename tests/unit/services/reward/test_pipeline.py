from services.reward.base import Score, ScoreItem
from services.reward.config import PipelineSpec
from services.reward.functions.math_verifier import FormatReward
from services.reward.functions.pipeline import Pipeline
from services.reward.registry import Registry


class CountingScorer:
    """An 'expensive' scorer that records which completions reached it."""

    name, description = "expensive", "counts calls"

    def __init__(self, reward: float = 5.0):
        self.seen: list[str] = []
        self.reward = reward

    def score_batch(self, items):
        self.seen += [i.completion for i in items]
        return [Score(self.reward, components={"raw": self.reward}) for _ in items]


def make(**spec):
    scorer = CountingScorer(spec.pop("scorer_reward", 5.0))
    registry = Registry([FormatReward(), scorer], clip=0)
    pipe = Pipeline("p", PipelineSpec(scorer="expensive", **spec), registry)
    registry.add(pipe)
    return registry, scorer


def items(*completions):
    return [ScoreItem(str(i), "q", c, "") for i, c in enumerate(completions)]


def test_expensive_scorer_sees_only_paths_that_pass_cheap_checks():
    registry, scorer = make(
        gates={"format": 1.0}, min_chars=1, forbid_regex=["13"], fail_reward=-1.0
    )
    scores = registry.score("p", items("42", "not a number", "", "13", "7"))
    assert scorer.seen == ["42", "7"]
    assert [s.reward for s in scores] == [3.0, -1.0, -1.0, -1.0, 3.0]  # clipped to the default ±3
    assert [s.components["exit_stage"] for s in scores] == [3.0, 2.0, 1.0, 1.0, 3.0]
    assert (
        "gate format" in scores[1].detail
        and "min_chars" in scores[2].detail
        and "forbid_regex" in scores[3].detail
    )
    assert scores[0].components["gate/format"] == 1.0 and scores[0].components["raw"] == 5.0
    assert all(s.status == "ok" for s in scores)


def test_safety_filters_come_first():
    registry, scorer = make(sensitive_words=["password"], max_chars=5, filtered_reward=-0.5)
    scores = registry.score("p", items("my PASSWORD is", "123456789", "abcde password"))
    assert (
        scores[0].status == "filtered"
        and scores[0].reward == -0.5
        and "PASSWORD" in scores[0].detail
    )
    assert scores[1].status == "ok" and scores[1].components["truncated"] == 1.0
    assert scores[2].status == "filtered"  # past max_chars, but the policy still wrote it
    assert scorer.seen == ["12345"]


def test_clip_is_configurable():
    registry, _ = make(clip=1.5, scorer_reward=-9.0)
    assert registry.score("p", items("1"))[0].reward == -1.5
    registry, _ = make(clip=0, scorer_reward=-9.0)
    assert registry.score("p", items("1"))[0].reward == -9.0


def test_a_failing_gate_passes_on_its_status():
    class Broken:
        name, description = "broken", "raises"

        def score_batch(self, items):
            raise RuntimeError("boom")

    scorer = CountingScorer()
    registry = Registry([Broken(), scorer])
    registry.add(Pipeline("p", PipelineSpec(scorer="expensive", gates={"broken": 0.0}), registry))
    [s] = registry.score("p", items("x"))
    assert s.status == "error" and "boom" in s.detail and scorer.seen == []
