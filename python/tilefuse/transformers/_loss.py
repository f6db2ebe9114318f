"""The causal-LM loss through tilefuse's cross-entropy: the loss hook every
`…ForCausalLM` calls (`model.loss_function`), and the forward that fuses the
language-model head into the loss (`linear_cross_entropy`)."""

from __future__ import annotations

import functools

import torch
from torch import nn

from tilefuse import functional as TF


def _shifted_labels(labels, ignore_index: int, shift_labels):
    """Hugging Face's shift: the token at t + 1 is the target at t, the last
    position has none (ForCausalLMLoss)."""
    if shift_labels is not None:
        return shift_labels
    return nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]


def _normalized(loss, num_items_in_batch):
    """A summed loss over the tokens of the whole accumulated batch, as
    fixed_cross_entropy divides it (gradient accumulation)."""
    if num_items_in_batch is None:
        return loss
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def causal_lm_loss(logits, labels, vocab_size: int, num_items_in_batch=None,
                   ignore_index: int = -100, shift_labels=None, **kwargs):
    """transformers' ForCausalLMLoss with tilefuse's fused cross-entropy:
    the same shift, `ignore_index`, and the 'sum' / `num_items_in_batch`
    normalization. 16-bit logits are read as they are (the kernel computes in
    float32; the loss is float32), not upcast to a float32 copy first."""
    target = _shifted_labels(labels, ignore_index, shift_labels).to(logits.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = TF.cross_entropy(logits.reshape(-1, vocab_size), target.reshape(-1),
                            ignore_index=ignore_index, reduction=reduction)
    return _normalized(loss, num_items_in_batch)
