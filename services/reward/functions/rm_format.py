"""The reward-model directory format, shared by serving (``reward_model.py``) and training
(``training/rm_train.py``).

A directory holds a transformers ``AutoModelForSequenceClassification`` (one label), its tokenizer
and ``brorl_rm.json`` (``META_FILE``: template, append_eos, max_length, margin, validation metrics).
Both sides join prompt and completion with ``fill_template`` and tokenise with ``encode``, so
serving formats text exactly as training did. Serving owns this module; training imports it, never
the other way round.
"""

from __future__ import annotations

import re

META_FILE = "brorl_rm.json"

_SLOT = re.compile(r"\{(prompt|completion)\}")


def fill_template(template: str, prompt: str, completion: str) -> str:
    """``{prompt}`` and ``{completion}`` filled in one pass (other braces are left alone)."""
    return _SLOT.sub(lambda m: prompt if m.group(1) == "prompt" else completion, template)


def encode(tok, texts: list[str], max_length: int, append_eos: bool):
    """Right-padded (input_ids, attention_mask): [BOS] text [EOS]; long texts keep their tail
    (the answer).

    BOS gives attention a place to rest; the score is read at EOS, after the whole answer."""
    import torch

    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    eos = [tok.eos_token_id] if append_eos and tok.eos_token_id is not None else []
    rows = []
    for ids in tok(texts, add_special_tokens=False)["input_ids"]:
        ids = ids + eos
        rows.append(bos + ids[-(max_length - len(bos)) :] or [tok.pad_token_id])
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return input_ids, mask
