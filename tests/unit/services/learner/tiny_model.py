"""A few-thousand-parameter Qwen2 for tests of the learner's forward and loss."""

from __future__ import annotations


def tiny_qwen2(vocab: int = 21, attention: str = "eager", seed: int = 0, sliding_window: int = 0):
    """``sliding_window``: every layer attends to at most that many positions back (0: all)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attn_implementation=attention,
        use_sliding_window=sliding_window > 0,
        sliding_window=sliding_window or None,
        max_window_layers=0,
    )
    return Qwen2ForCausalLM(config).float()
