"""The safety filter stage before reward (services/reward/functions/safety_filter.py): each kind
of filter, the penalty instead of a score, the reason on the path, and a local classifier model
(a tiny randomly initialised one written here; nothing is downloaded)."""

from __future__ import annotations

import pytest

from brorl.errors import InvalidArgument
from services.reward.base import ScoreItem
from services.reward.config import RewardServiceConfig
from services.reward.functions.safety_filter import SafetyClassifier
from services.reward.pipeline_config import PipelineSpec, SafetyClassifierSpec
from services.reward.registry import build_registry
from tests.unit.services.reward.test_pipeline import make


def items(*completions):
    return [ScoreItem(str(i), "q", c, "") for i, c in enumerate(completions)]


def reasons(scores):
    return [
        next((k.split("/", 1)[1] for k in s.components if k.startswith("filtered/")), None)
        for s in scores
    ]


def test_each_cheap_filter_kind_gets_the_penalty_and_its_reason():
    registry, scorer = make(
        filter_max_chars=20,
        sensitive_words=["Secret plan"],
        filter_regex=[r"rm\s+-rf"],
        filtered_reward=-2.0,
        scorer_reward=1.0,
    )
    texts = ("fine", "x" * 21, "the secret   PLAN", "rm  -rf /", "secretplan")
    scores = registry.score("p", items(*texts))
    assert reasons(scores) == [None, "too_long", "word", "regex", None]
    assert [s.status for s in scores] == ["ok", "filtered", "filtered", "filtered", "ok"]
    assert [s.reward for s in scores] == [1.0, -2.0, -2.0, -2.0, 1.0]
    assert scorer.seen == ["fine", "secretplan"]  # filtered paths are never scored
    assert "filter_max_chars=20" in scores[1].detail


def test_the_first_reason_wins_and_the_whole_completion_is_checked():
    # truncation to max_chars does not hide a word past the cut; too_long is checked first
    registry, _ = make(
        max_chars=4, filter_max_chars=30, sensitive_words=["bad"], filter_regex=["ba[d]"]
    )
    scores = registry.score("p", items("okay then bad", "bad " * 10, "okay then bads"))
    assert reasons(scores) == ["word", "too_long", "regex"]  # length, words, regexes: in order


def test_a_bad_filter_regex_is_refused_by_the_config():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        PipelineSpec(scorer="x", filter_regex=["(unclosed"])


def tiny_classifier(path, bias=None, seed=0):
    """A 1-layer BERT sequence classifier with a character tokenizer, saved to ``path``;
    ``bias`` (safe, unsafe) replaces the head's bias, with zero head weights."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    chars = list("abcdefghijklmnopqrstuvwxyz0123456789 ")
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    if bias is not None:
        with torch.no_grad():
            model.classifier.weight.zero_()
            model.classifier.bias.copy_(torch.tensor(bias))
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def test_classifier_probabilities_are_the_models_softmax(tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = tiny_classifier(tmp_path / "clf", seed=3)
    texts = ["hello there", "drop the table", "x", "a much longer text than the rest of them"]
    clf = SafetyClassifier("p", SafetyClassifierSpec(path=str(path), batch_size=3))
    got = clf.unsafe_probabilities(texts)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    with torch.no_grad():  # one at a time: batching and padding must not change a probability
        want = [
            torch.softmax(model(**tok([t], return_tensors="pt")).logits.double(), -1)[0, 1].item()
            for t in texts
        ]
    assert got == pytest.approx(want, abs=1e-6)
    assert len(set(round(p, 6) for p in got)) > 1  # a real model: texts differ


def test_classifier_filters_at_its_threshold_through_the_registry(tmp_path):
    flag_all = tiny_classifier(tmp_path / "unsafe", bias=[-5.0, 5.0])
    even = tiny_classifier(tmp_path / "even", bias=[0.0, 0.0])  # p(unsafe) = 0.5 for any text
    config = RewardServiceConfig(
        functions={
            "guarded": {
                "type": "pipeline",
                "scorer": "format",
                "filtered_reward": -1.0,
                "classifier": {"path": str(flag_all)},
            },
            "even_low": {
                "type": "pipeline",
                "scorer": "format",
                "classifier": {"path": str(even), "threshold": 0.4},
            },
            "even_high": {
                "type": "pipeline",
                "scorer": "format",
                "sensitive_words": ["nope"],
                "classifier": {"path": str(even), "threshold": 0.6},
            },
        }
    )
    registry = build_registry(config)
    registry.warm()  # loads the classifiers before the service says SERVING
    scores = registry.score("guarded", items("42", "7"))
    assert [(s.reward, s.status) for s in scores] == [(-1.0, "filtered")] * 2
    assert reasons(scores) == ["classifier"] * 2 and "probability 1.000" in scores[0].detail
    assert reasons(registry.score("even_low", items("42"))) == ["classifier"]
    high = registry.score("even_high", items("42", "nope"))
    assert reasons(high) == [None, "word"] and high[0].reward == 1.0


def test_classifier_directory_and_label_are_checked(tmp_path):
    with pytest.raises(InvalidArgument, match="classifier.path"):
        SafetyClassifier("p", SafetyClassifierSpec(path=str(tmp_path)))
    path = tiny_classifier(tmp_path / "clf")
    clf = SafetyClassifier("p", SafetyClassifierSpec(path=str(path), unsafe_label=2))
    with pytest.raises(ValueError, match="unsafe_label 2 but the model has 2 labels"):
        clf.load()
