"""RolloutEngine on real vLLM: wide sampling, sampling log-probs, sampling options.

One engine for the whole module (~20-30 s to start on CPU); the reference is transformers
running the same weights in this process.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from demo.model import build_tokenizer  # noqa: E402

from .test_weight_reload_parity import (  # noqa: E402
    hf_greedy,
    hf_token_logprobs,
    load_hf,
    max_diff,
)

PROMPT = "47+385="
TOL = 1e-3  # fp32

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture(scope="module")
def hf(model_dir):
    return load_hf(model_dir)


@pytest.fixture(scope="module")
def engine(tiny_engine):
    assert tiny_engine.weight_version == 0, (
        "an earlier test left reloaded weights in the shared engine"
    )
    return tiny_engine


def check_shapes(samples, max_tokens, eos_id):
    for s in samples:
        assert 1 <= len(s.token_ids) <= max_tokens
        assert len(s.logprobs) == len(s.token_ids)
        assert all(lp <= 1e-6 for lp in s.logprobs)
        assert s.finish_reason in ("stop", "length")
        if s.finish_reason == "length":
            assert len(s.token_ids) == max_tokens
        if eos_id in s.token_ids:  # EOS ends the path and is its last token
            assert s.token_ids.index(eos_id) == len(s.token_ids) - 1
            assert s.finish_reason == "stop"


def test_wide_group_sampling_logprobs(engine, hf):
    """n=512 of one prompt; the sampling log-probs are log_softmax(logits / T)."""
    temperature, max_tokens = 0.7, 16
    eos_id = hf.config.eos_token_id
    [(prompt_ids, samples)] = engine.generate(
        [PROMPT], n=512, temperature=temperature, max_tokens=max_tokens, seed=11
    )
    assert prompt_ids == build_tokenizer().encode(PROMPT)
    assert len(samples) == 512
    check_shapes(samples, max_tokens, eos_id)
    assert len({tuple(s.token_ids) for s in samples}) > 400  # really 512 different draws

    # A few paths, including the longest and the shortest, against transformers.
    by_len = sorted(samples, key=lambda s: len(s.token_ids))
    worst = max(
        max_diff(s.logprobs, hf_token_logprobs(hf, prompt_ids, s.token_ids, temperature))
        for s in by_len[:2] + by_len[-2:] + samples[:4]
    )
    print(f"\n[engine] sampling logprobs T={temperature}: max |diff| = {worst:.2e}")
    assert worst <= TOL
    # Not the temperature-1 log-probs (vLLM's default raw_logprobs mode would give those).
    s = by_len[-1]
    assert max_diff(s.logprobs, hf_token_logprobs(hf, prompt_ids, s.token_ids, 1.0)) > 10 * TOL


def test_greedy_matches_transformers(engine, hf):
    prompts = [PROMPT, "12*3=", "(9-4)*7="]
    results = engine.generate(prompts, n=1, temperature=0.0, max_tokens=16)
    assert len(results) == len(prompts)
    for prompt_ids, (sample,) in results:
        tokens, lps = hf_greedy(hf, prompt_ids, 16, hf.config.eos_token_id)
        assert sample.token_ids == tokens
        assert max_diff(sample.logprobs, lps) <= TOL
        assert sample.text == build_tokenizer().decode(tokens, skip_special_tokens=True)


def test_seed_reproducible(engine):
    def draw(seed):
        [(_, samples)] = engine.generate([PROMPT], n=8, temperature=1.0, max_tokens=12, seed=seed)
        return [s.token_ids for s in samples]

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_top_k_and_top_p(engine, hf):
    """top_k / top_p are applied; log-probs are those of the truncated distribution."""
    temperature, k = 0.9, 3
    [(prompt_ids, samples)] = engine.generate(
        [PROMPT], n=32, temperature=temperature, top_k=k, max_tokens=10, seed=2
    )
    check_shapes(samples, 10, hf.config.eos_token_id)
    with torch.no_grad():
        for s in samples[:4]:
            ids = torch.tensor([prompt_ids + s.token_ids])
            logits = hf(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature  # (T, V)
            top = torch.topk(logits, k, dim=-1)
            for t, (tok, lp) in enumerate(zip(s.token_ids, s.logprobs)):
                assert tok in top.indices[t].tolist()
                expected = logits[t, tok] - torch.logsumexp(top.values[t], dim=-1)
                assert abs(lp - float(expected)) <= TOL

    [(_, samples)] = engine.generate(
        [PROMPT], n=32, temperature=temperature, top_p=0.5, top_k=5, max_tokens=10, seed=2
    )
    check_shapes(samples, 10, hf.config.eos_token_id)


def test_stop_strings(engine):
    [(_, samples)] = engine.generate(
        [PROMPT], n=64, temperature=1.0, max_tokens=16, seed=9, stop=["="]
    )
    check_shapes(samples, 16, eos_id=2)
    assert all("=" not in s.text for s in samples)
    assert any(s.finish_reason == "stop" for s in samples)


def test_reload_rejects_incomplete_weights(engine, model_dir, tmp_path):
    """A weights dir that does not cover the model is refused before the engine is touched."""
    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    partial.mkdir()
    state = load_file(str(model_dir / "model.safetensors"))
    save_file(
        {k: v for k, v in state.items() if "layers.3." not in k}, str(partial / "model.safetensors")
    )
    empty = tmp_path / "empty"
    empty.mkdir()

    before = engine.generate([PROMPT], n=1, temperature=0.0, max_tokens=8)
    with pytest.raises(ValueError, match="lacks"):
        engine.load_weights(str(partial), version=1)
    with pytest.raises(FileNotFoundError):
        engine.load_weights(str(empty), version=1)
    assert engine.weight_version == 0
    after = engine.generate([PROMPT], n=1, temperature=0.0, max_tokens=8)
    assert after[0][1][0].token_ids == before[0][1][0].token_ids


def test_text_decoded_once_equals_vllms_detokenizer(engine):
    """Without stop strings the engine decodes each path's text itself (vLLM's token-by-token
    detokenizing is off); with a stop string that never matches, vLLM detokenizes: the same
    seeded paths must carry the same text, log-probs and ends either way."""
    kwargs = dict(n=64, temperature=1.0, max_tokens=12, seed=5)
    [(_, ours)] = engine.generate([PROMPT], **kwargs)
    [(_, vllms)] = engine.generate([PROMPT], **kwargs, stop=["never in a completion"])
    assert [s.token_ids for s in ours] == [s.token_ids for s in vllms]
    assert [s.text for s in ours] == [s.text for s in vllms]
    assert [s.logprobs for s in ours] == [s.logprobs for s in vllms]
    assert [s.finish_reason for s in ours] == [s.finish_reason for s in vllms]
    assert any(s.text for s in ours)
