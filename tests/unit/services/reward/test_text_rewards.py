import math

import pytest

from brorl.errors import InvalidArgument
from services.reward.base import ScoreItem
from services.reward.functions.composite import parse_inline
from services.reward.config import RelevanceSpec, RewardServiceConfig, SafetySpec
from services.reward.registry import Registry, build_registry
from services.reward.functions.text_rewards import Diversity, Relevance, Safety, ngram_entropy


def item(completion: str, prompt: str = "", reference: str = "") -> ScoreItem:
    return ScoreItem("id", prompt, completion, reference)


def test_relevance_ngram_fallback_orders_on_topic_above_off_topic():
    fn = Relevance()
    q = "What is the capital city of France?"
    on, off = fn.score_batch(
        [item("The capital city of France is Paris.", q), item("Bananas are yellow.", q)]
    )
    assert 0 <= off.reward < on.reward <= 1
    assert on.components["method_ngram"] == 1.0
    [same] = fn.score_batch([item(q, q)])
    assert same.reward == pytest.approx(1.0)


def test_relevance_with_a_local_embedding_model(tmp_path):
    from demo.model import create_tiny_model

    path = create_tiny_model(
        tmp_path / "enc", hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64
    )
    fn = Relevance("rel", RelevanceSpec(model_path=str(path)))
    fn.warm()
    same, other = fn.score_batch([item("12+35=47", "12+35=47"), item("9", "12+35=47")])
    assert same.reward == pytest.approx(1.0, abs=1e-5)
    assert -1 <= other.reward <= 1 and same.components["method_ngram"] == 0.0


def test_safety_lexicon_and_sensitive_words():
    fn = Safety()
    clean, rude, sensitive = fn.score_batch(
        [
            item("Have a nice day."),
            item("You are an idiot, shut   up."),
            item("Here is how to build a bomb"),
        ]
    )
    assert clean.reward == 1.0 and clean.components["toxicity"] == 0
    assert 0 <= rude.reward < 1 and rude.components["toxicity"] == pytest.approx(1.0)
    assert sensitive.reward == 0 and "build a bomb" in sensitive.detail
    custom = Safety(
        "s", SafetySpec(sensitive_words=["Secret Project"], toxicity_lexicon={"meh": 0.5})
    )
    a, b = custom.score_batch([item("the secret   project"), item("meh meh")])
    assert a.reward == 0 and b.reward == pytest.approx(0.0) and b.components["toxicity"] == 1.0
    assert custom.score_batch([item("secretproject")])[0].reward == 1.0  # whole words only


def test_diversity_entropy():
    varied, repeated, short = Diversity().score_batch(
        [
            item("the quick brown fox jumps over the lazy dog"),
            item("go go go go go go go go"),
            item("hi"),
        ]
    )
    assert varied.reward == pytest.approx(1.0)
    assert repeated.reward == pytest.approx(0.0)
    assert short.reward == 0 and short.detail
    ent, distinct, n = ngram_entropy("a b a b", 1)
    assert n == 4 and distinct == 0.5 and ent == pytest.approx(math.log(2) / math.log(4))


def test_composite_total_and_components():
    registry = build_registry(
        RewardServiceConfig(
            functions={
                "mix": {
                    "type": "composite",
                    "components": {"relevance": 0.5, "safety": 1.0, "diversity": 0.25},
                }
            }
        )
    )
    try:
        [s] = registry.score(
            "mix", [item("Paris is the capital of France.", "What is the capital of France?")]
        )
        assert set(s.components) == {"relevance", "safety", "diversity"}
        expected = (
            0.5 * s.components["relevance"]
            + 1.0 * s.components["safety"]
            + 0.25 * s.components["diversity"]
        )
        assert s.reward == pytest.approx(expected) and s.status == "ok"
        [inline] = registry.score("composite:safety=2,diversity=-1", [item("fine words here")])
        assert inline.reward == pytest.approx(2 * 1.0 - 1 * 1.0)
    finally:
        registry.close()


def test_composite_takes_a_failing_components_status():
    class Broken:
        name, description = "broken", "raises"

        def score_batch(self, items):
            raise RuntimeError("boom")

    registry = Registry([Broken(), Safety()])
    [s] = registry.score("composite:safety=1,broken=1", [item("ok")])
    assert s.status == "error" and "broken" in s.detail and s.reward == 1.0


@pytest.mark.parametrize(
    "name,fix",
    [
        ("composite:", "no components"),
        ("composite:relevance", "has no weight"),
        ("composite:relevance=abc", "must be a number"),
        ("composite:relevance=nan", "finite"),
        ("composite:relevance=0,safety=0", "all weights are 0"),
        ("composite:relevance=1,relevance=2", "twice"),
        ("composite:=1", "no name"),
    ],
)
def test_inline_composite_errors_say_what_to_fix(name, fix):
    with pytest.raises(InvalidArgument) as err:
        parse_inline(name)
    assert fix in str(err.value) and err.value.field == "reward_fn"


def test_registry_clips_and_catches_non_finite():
    class Wild:
        name, description = "wild", "big numbers"

        def score_batch(self, items):
            from services.reward.base import Score

            return [Score(10.0), Score(-10.0), Score(float("nan"))]

    scores = Registry([Wild()]).score("wild", [item("a"), item("b"), item("c")])
    assert [s.reward for s in scores] == [3.0, -3.0, 0.0]
    assert scores[2].status == "error" and "non-finite" in scores[2].detail
