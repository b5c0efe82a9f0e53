"""Loading the run's Hugging Face model: the policy, its frozen reference and the critic's trunk
are read the same way (fp32 master weights, one attention backend)."""

from __future__ import annotations

import torch

from services.learner.model import prefix_attention


def attention_backend() -> str:
    """On CPU eager attention beats SDPA's kernels at the few-token lengths RL paths have here,
    and prefix_attention's beats eager (docs/performance.md); on CUDA SDPA is the faster one."""
    return "sdpa" if torch.cuda.is_available() else prefix_attention.ATTENTION


def causal_lm(model_dir: str):
    """The model with its LM head (the policy, the reference)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attention_backend()
    )


def trunk(model_dir: str):
    """The model without its LM head (the critic's trunk)."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attention_backend()
    )
