"""The causal-LM loss through tilefuse's cross-entropy: the loss hook every
`…ForCausalLM` calls (`model.loss_function`), and the forward that fuses the
language-model head into the loss (`linear_cross_entropy`)."""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

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


# at::Reduction's values, as the kernel-level ops take them.
_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
_cross_entropy_fwd = torch.ops.tilefuse.cross_entropy_fwd.default


def _float32_cross_entropy(logits, target, ignore_index: int, reduction: str):
    """The loss in float32 whatever the logits' dtype, as transformers' upcast
    gives it. tilefuse.functional.cross_entropy rounds it to the logits' dtype
    (torch's rule: a bf16 loss is off by up to 0.016 at 5), so this calls the
    differentiable kernel-level op below it, which computes in float32."""
    return _cross_entropy_fwd(logits, target, None, ignore_index, 0.0, 0.0, None,
                              _REDUCTIONS[reduction])[0]


def causal_lm_loss(logits, labels, vocab_size: int, num_items_in_batch=None,
                   ignore_index: int = -100, shift_labels=None, **kwargs):
    """transformers' ForCausalLMLoss with tilefuse's fused cross-entropy:
    the same shift, `ignore_index`, and the 'sum' / `num_items_in_batch`
    normalization. 16-bit logits are read as they are (the kernel computes in
    float32; the loss is float32), not upcast to a float32 copy first."""
    target = _shifted_labels(labels, ignore_index, shift_labels).to(logits.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = _float32_cross_entropy(logits.reshape(-1, vocab_size), target.reshape(-1),
                                  ignore_index, reduction)
    return _normalized(loss, num_items_in_batch)


def _head_and_loss(self, hidden_states, labels, num_items_in_batch=None,
                   ignore_index: int = -100, shift_labels=None, **kwargs):
    """The loss of lm_head(hidden_states) (soft-capped as the model caps its
    logits) without the [tokens, vocab] logits."""
    weight, bias = self.lm_head.weight, self.lm_head.bias
    device = hidden_states.device.type
    if torch.is_autocast_enabled(device):
        # What autocast would make of lm_head's matmul.
        dtype = torch.get_autocast_dtype(device)
        hidden_states, weight = hidden_states.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    target = _shifted_labels(labels, ignore_index, shift_labels).to(hidden_states.device)
    # The kernel-level op, for a float32 loss (see _float32_cross_entropy);
    # chunks of tokens whose logits take at most 256 MiB, as the public op's.
    vocab = weight.shape[0]
    chunk_rows = max(1, (256 << 20) // (vocab * hidden_states.element_size()))
    loss, _ = torch.ops.tilefuse.linear_cross_entropy_fwd(
        hidden_states.reshape(-1, hidden_states.shape[-1]), weight, bias,
        target.reshape(-1), None, ignore_index, 0.0, 0.0,
        getattr(self.config, "final_logit_softcapping", None),
        _REDUCTIONS["mean" if num_items_in_batch is None else "sum"], chunk_rows)
    return _normalized(loss, num_items_in_batch)


def _fused_head(original, self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, inputs_embeds=None, labels=None, use_cache=None,
                logits_to_keep=0, skip_logits=None, **kwargs):
    """`original` (a …ForCausalLM.forward) that, when training with labels
    (or given skip_logits=True), returns the loss of the fused linear
    cross-entropy and no logits; otherwise it runs `original` unchanged."""
    if skip_logits is None:
        skip_logits = self.training and labels is not None
    if not skip_logits:
        return original(self, input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids, past_key_values=past_key_values,
                        inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache,
                        logits_to_keep=logits_to_keep, **kwargs)
    if labels is None:
        raise ValueError(f"{type(self).__name__}: skip_logits=True needs labels")
    return_dict = kwargs.pop("return_dict", None)
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=past_key_values,
                         inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    loss = _head_and_loss(self, outputs.last_hidden_state, labels, **kwargs)
    output = CausalLMOutputWithPast(
        loss=loss, logits=None, past_key_values=outputs.past_key_values,
        hidden_states=outputs.hidden_states, attentions=outputs.attentions)
    if return_dict is None:
        return_dict = self.config.return_dict
    return output if return_dict else output.to_tuple()


def fused_head_forward(original):
    """_fused_head as a …ForCausalLM class's forward."""

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        return _fused_head(original, self, *args, **kwargs)

    forward._tilefuse_kind = "linear_cross_entropy"
    return forward


def bound_fused_head(model):
    """_fused_head as `model`'s own forward; a partial of the model's class,
    not a bound closure, so that torch.save of the model pickles it (the
    class by name, which the classes' patch never replaces) and torch.load
    gives the fused head back."""
    forward = functools.partial(_class_fused_head, type(model), model)
    forward._tilefuse_kind = "linear_cross_entropy"
    return forward


def _class_fused_head(cls, self, *args, **kwargs):
    """_fused_head about `cls`'s own forward (unwrapped where the classes'
    patch fused it)."""
    original = cls.forward
    if hasattr(original, "_tilefuse_kind"):
        original = original.__wrapped__
    return _fused_head(original, self, *args, **kwargs)
