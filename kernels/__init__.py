"""Fused kernels for the hot tensor math of an RL update (see bench/README.md).

Each op dispatches to a Triton kernel on CUDA (or when ``BRORL_TRITON=1``, which on CPU
needs ``TRITON_INTERPRET=1``) and to a memory-lean PyTorch path otherwise; each has a
``*_reference`` plain-PyTorch twin that the tests use as the oracle.
"""

from kernels.advantages import group_advantages, group_advantages_reference
from kernels.cutoffs import truncate_logits_reference
from kernels.dispatch import use_triton
from kernels.logprobs import token_logprobs_entropy, token_logprobs_entropy_reference
from kernels.policy_loss import clipped_policy_loss, clipped_policy_loss_reference, kl_estimate
from kernels.truncated_logprobs import (
    truncated_logprobs_entropy,
    truncated_logprobs_entropy_reference,
)

__all__ = [
    "clipped_policy_loss",
    "clipped_policy_loss_reference",
    "group_advantages",
    "group_advantages_reference",
    "kl_estimate",
    "token_logprobs_entropy",
    "token_logprobs_entropy_reference",
    "truncate_logits_reference",
    "truncated_logprobs_entropy",
    "truncated_logprobs_entropy_reference",
    "use_triton",
]
