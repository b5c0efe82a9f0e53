"""Create the demo's tiny causal LM and its character-level tokenizer in Hugging Face format.

The model is a randomly initialised Qwen2-architecture network; vLLM and transformers both
load the directory. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

# Character vocabulary of the arithmetic task; ids 0..3 are special tokens.
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789+-*=() ")


def build_tokenizer(chars: list[str] = CHARS):
    """A character tokenizer: the special tokens, then one token per character of ``chars``
    (the arithmetic task's by default; demo.tooluse adds the tool call's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(chars))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character is its own token: split between all characters.
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def create_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position: int = 64,
    seed: int = 0,
    tie_embeddings: bool = True,
    chars: list[str] = CHARS,
) -> Path:
    """Write a fresh random Qwen2 model + tokenizer to ``out_dir`` and return the path."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(chars)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
