"""In-place weight reload parity: after ``RolloutEngine.load_weights`` the vLLM engine must
compute exactly what transformers computes with the new weights.

Real vLLM (one engine start per parametrization, ~20-30 s each on CPU).
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from demo.model import build_tokenizer, create_tiny_model  # noqa: E402

PROMPTS = ["47+385=", "12*3=", "(9-4)*7=", "0="]
MAX_TOKENS = 16
TOL = 1e-3  # fp32


def load_hf(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def hf_token_logprobs(model, prompt_ids, completion_ids, temperature=1.0):
    """log_softmax(logits / T) of each completion token given everything before it."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    logits = model(ids).logits[0].float()  # (L, V)
    steps = logits[len(prompt_ids) - 1 : ids.shape[1] - 1] / temperature  # (T, V)
    lps = torch.log_softmax(steps, dim=-1)
    return lps.gather(1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


@torch.no_grad()
def hf_greedy(model, prompt_ids, max_tokens, eos_id):
    """Greedy tokens and their log_softmax(logits) under transformers (full forward per step)."""
    ids, out, lps = list(prompt_ids), [], []
    for _ in range(max_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        tok = int(torch.argmax(logits))
        out.append(tok)
        lps.append(float(torch.log_softmax(logits, -1)[tok]))
        ids.append(tok)
        if tok == eos_id:
            break
    return out, lps


def hf_with(model_dir, bits: dict):
    """transformers on reconstructed bf16 serving weights (a tied lm_head follows embed_tokens)."""
    from brorl.weights import codec

    model = load_hf(model_dir)
    state = {n: torch.from_numpy(codec.bits_to_float32(b, "bf16").copy()) for n, b in bits.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return model.eval()


def publish_and_sync(engine, model_dir, store_dir, version: int) -> dict:
    """Publish ``model_dir``'s weights as a bf16 keyframe (the learner's publisher) and bring the
    engine to it through the worker's WeightSync; the serving bits it was given."""
    import threading

    from brorl.weights import codec
    from brorl.weights.store import WeightStore
    from services.learner.publish import WeightPublisher
    from services.rollout.weight_sync import WeightSync

    hf = load_hf(model_dir)
    tied = hf.config.tie_word_embeddings
    weights = {
        n: t.detach().numpy().copy()
        for n, t in hf.state_dict().items()
        if not (tied and n == "lm_head.weight")
    }
    pointers = []
    WeightPublisher(WeightStore(store_dir), "bf16").publish(
        lambda: weights, pointers.append, version, step=version
    )
    assert WeightSync(engine, threading.Lock()).sync("run-parity", pointers[-1])
    assert engine.weight_version == version
    return {n: codec.serving_bits(w, "bf16") for n, w in weights.items()}


def max_diff(a, b):
    assert len(a) == len(b), (len(a), len(b))
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def weights_only(src, dst):
    """What the learner publishes: a directory holding only the *.safetensors state dict."""
    dst.mkdir()
    for f in src.glob("*.safetensors"):
        shutil.copy(f, dst / f.name)
    return dst


def greedy_report(engine, hf, eos_id):
    """Greedy through vLLM; returns (max |Δ logprob| vs HF on vLLM's tokens, tokens equal?)."""
    results = engine.generate(PROMPTS, n=1, temperature=0.0, max_tokens=MAX_TOKENS)
    worst, same_tokens = 0.0, True
    for prompt_ids, (sample,) in results:
        assert len(sample.logprobs) == len(sample.token_ids)
        worst = max(
            worst, max_diff(sample.logprobs, hf_token_logprobs(hf, prompt_ids, sample.token_ids))
        )
        hf_tokens, _ = hf_greedy(hf, prompt_ids, MAX_TOKENS, eos_id)
        same_tokens &= hf_tokens == sample.token_ids
    return results, worst, same_tokens


@pytest.mark.slow
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_reload_matches_transformers(tmp_path, tie, request):
    from services.rollout.engine import RolloutEngine

    # Model A with tied embeddings is the session's tiny model, so that case reuses its engine
    # (and ends by reloading A, which the test checks anyway).
    shared = tie
    dir_a = (
        request.getfixturevalue("tiny_model_dir")
        if shared
        else create_tiny_model(tmp_path / "A", seed=0, tie_embeddings=tie)
    )
    dir_b = create_tiny_model(tmp_path / "B", seed=1, tie_embeddings=tie)
    weights_a = weights_only(dir_a, tmp_path / "weights_A")
    weights_b = weights_only(dir_b, tmp_path / "weights_B")
    hf_a, hf_b = load_hf(dir_a), load_hf(dir_b)
    eos_id = hf_a.config.eos_token_id

    engine = request.getfixturevalue("tiny_engine") if shared else RolloutEngine(str(dir_a))
    start_version = engine.weight_version
    try:
        # Before the reload the engine is model A, and A is measurably different from B.
        before, diff_a, same_a = greedy_report(engine, hf_a, eos_id)
        assert diff_a <= TOL, f"engine differs from transformers(A) before reload: {diff_a}"
        assert same_a, "greedy tokens differ from transformers(A) before reload"
        diff_a_vs_b = max(
            max_diff(s.logprobs, hf_token_logprobs(hf_b, p, s.token_ids)) for p, (s,) in before
        )
        assert diff_a_vs_b > 100 * TOL, "A and B too similar for the test to mean anything"

        # The exact path the rollout service uses.
        engine.load_weights(str(weights_b), version=start_version + 1)
        assert engine.weight_version == start_version + 1

        after, diff_b, same_b = greedy_report(engine, hf_b, eos_id)
        assert same_b, "greedy tokens after reload differ from transformers(B)"
        assert diff_b <= TOL, f"greedy logprobs after reload differ from transformers(B): {diff_b}"

        # A fixed continuation scored through prompt logprobs.
        prompt_ids = after[0][0]
        continuation = build_tokenizer().encode("432") + [eos_id]
        diff_score = max_diff(
            engine.score_continuation(prompt_ids, continuation),
            hf_token_logprobs(hf_b, prompt_ids, continuation),
        )
        assert diff_score <= TOL, f"prompt logprobs after reload: {diff_score}"

        # Sampled paths at T=0.8: sampling logprobs == log_softmax(logits / T) under B.
        temperature = 0.8
        ((prompt_ids, samples),) = engine.generate(
            [PROMPTS[0]], n=8, temperature=temperature, max_tokens=MAX_TOKENS, seed=5
        )
        diff_sampled = max(
            max_diff(s.logprobs, hf_token_logprobs(hf_b, prompt_ids, s.token_ids, temperature))
            for s in samples
        )
        assert diff_sampled <= TOL, f"sampling logprobs after reload: {diff_sampled}"

        # Reloading A again gives back A's outputs exactly (nothing stale survives a reload).
        engine.load_weights(str(weights_a), version=start_version)
        again = engine.generate(PROMPTS, n=1, temperature=0.0, max_tokens=MAX_TOKENS)
        for (_, (s0,)), (_, (s1,)) in zip(before, again):
            assert s1.token_ids == s0.token_ids
            assert max_diff(s1.logprobs, s0.logprobs) <= 1e-5

        if not shared:
            # A published version: the serving state copied in place (an untied lm_head is a
            # parameter of its own, its vocabulary rows padded as the embedding's are).
            bits = publish_and_sync(engine, dir_b, tmp_path / "store", start_version + 2)
            assert engine.last_apply["in_place"] == 1
            hf_b16 = hf_with(dir_b, bits)
            _, diff_pub, same_pub = greedy_report(engine, hf_b16, eos_id)
            assert same_pub and diff_pub <= TOL, f"published B copied in place: {diff_pub}"

        print(
            f"\n[parity tie={tie}] before(A)={diff_a:.2e} A-vs-B={diff_a_vs_b:.2e} "
            f"greedy(B)={diff_b:.2e} prompt_logprobs(B)={diff_score:.2e} "
            f"sampled T=0.8 (B)={diff_sampled:.2e}"
        )
    finally:
        if shared:
            engine.load_weights(
                str(weights_a), version=start_version
            )  # leave the shared engine as found
        else:
            engine.close()
