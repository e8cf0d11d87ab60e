"""Load balancing and expert-load bookkeeping for the MoE layers of this process.

Every training forward of a layer adds its tokens per expert to the layer's tally (not the recompute of
activation checkpointing, which runs inside backward; but the one metadata-inference forward torch's
pipeline schedules run in their first step is counted in that step's numbers, not in any gradient). After each optimizer step one all-reduce over
the world sums the tallies of every layer (a pipeline stage contributes its own layers; tensor-parallel
copies count alike, so shares are unchanged), then:
  - `last_step()` holds each layer's share of routed tokens per expert and the mean auxiliary loss,
    which the spec reports as metrics;
  - balance=bias moves each expert's routing bias by rate * sign(mean share - its share) (DeepSeek-V3),
    identically on every rank, outside the gradient.

balance=aux_loss adds coef * E * sum_e f_e * P_e (f_e: tokens routed to e per token, P_e: mean score
of e; Switch/Mixtral) to the gradient without the trainer knowing: the hidden states carry it through
an identity whose backward also feeds the loss its gradient, weighted like the micro-batch's LM loss
(framework.loss.micro_batch_weight), so the sum over a step's micro-batches is layout-independent.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from framework.loss import micro_batch_weight

_LAYERS: "weakref.WeakSet" = weakref.WeakSet()
_HOOK = None
_LAST: dict = {}


class _AddAuxiliaryLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, aux, weight: float):
        ctx.weight = weight
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.full((), ctx.weight, dtype=torch.float32, device=grad.device), None


def aux_loss(scores: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """E * sum_e (tokens routed to e / tokens) * mean score of e, with scores normalised per token."""
    n_tokens, n_experts = scores.shape
    probs = scores / scores.sum(-1, keepdim=True)
    return n_experts * (counts.to(probs.dtype) / n_tokens * probs.mean(0)).sum()


def _counts_now(counts: torch.Tensor) -> bool:
    """A training forward, not activation checkpointing's recompute inside backward, nor the planner's
    pass over fake tensors."""
    from torch._subclasses.fake_tensor import is_fake
    return torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1 and not is_fake(counts)


def observe(layer, scores: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor):
    """Tally a training forward of `layer`; the auxiliary loss to attach (None where there is none)."""
    if not (layer.training and _counts_now(counts)):
        return None
    _register(layer)
    aux = aux_loss(scores, ids, counts)
    layer.load_tally = layer.load_tally + counts.detach().double()
    layer.aux_tally = layer.aux_tally + aux.detach().double()
    layer.forwards += 1
    return aux if layer.args.balance == "aux_loss" and layer.args.aux_loss_coef > 0 else None


def with_aux_loss(hidden: torch.Tensor, aux, coef: float) -> torch.Tensor:
    """`hidden` unchanged; backward also sends coef * (the micro-batch's loss weight) into `aux`."""
    if aux is None:
        return hidden
    return _AddAuxiliaryLoss.apply(hidden, aux * coef, micro_batch_weight())


def _register(layer) -> None:
    global _HOOK
    if layer not in _LAYERS:
        layer.load_tally = torch.zeros(layer.args.n_experts, dtype=torch.float64, device=counts_device(layer))
        layer.aux_tally = torch.zeros((), dtype=torch.float64, device=counts_device(layer))
        layer.forwards = 0
        _LAYERS.add(layer)
    if _HOOK is None:
        _HOOK = register_optimizer_step_post_hook(_after_optimizer_step)


def counts_device(layer) -> torch.device:
    return layer.router.gate.weight.device


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    layers = sorted(_LAYERS, key=lambda l: l.layer_id)
    if not layers:
        return
    first = layers[0].args
    device = counts_device(layers[0])
    loads = torch.zeros(first.n_layers, first.n_experts, dtype=torch.float64, device=device)
    aux = torch.zeros(first.n_layers, 2, dtype=torch.float64, device=device)
    for layer in layers:
        loads[layer.layer_id] += layer.load_tally
        aux[layer.layer_id, 0] += layer.aux_tally
        aux[layer.layer_id, 1] += layer.forwards
        layer.load_tally.zero_()
        layer.aux_tally.zero_()
        layer.forwards = 0
    if dist.is_initialized():
        dist.all_reduce(loads)
        dist.all_reduce(aux)
    if not aux[:, 1].sum():
        return      # no forward since the last step (a second optimizer on this rank)
    shares = loads / loads.sum(-1, keepdim=True).clamp(min=1)
    _LAST.clear()
    _LAST.update(shares=shares.cpu(), aux_loss=float((aux[:, 0] / aux[:, 1].clamp(min=1)).sum()))
    if first.balance == "bias":
        for layer in layers:
            _move_bias(layer.router.expert_bias, shares[layer.layer_id], layer.args.bias_update_rate)


@torch.no_grad()
def _move_bias(bias, shares: torch.Tensor, rate: float) -> None:
    delta = (rate * torch.sign(shares.mean() - shares)).float()
    from torch.distributed.tensor import DTensor     # sharded layouts hold a slice of the bias
    if isinstance(bias, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        shape, offset = compute_local_shape_and_global_offset(bias.shape, bias.device_mesh, bias.placements)
        bias.to_local().add_(delta[offset[0]:offset[0] + shape[0]].to(bias.device))
    else:
        bias.add_(delta.to(bias.device))


def last_step() -> dict:
    """{'shares': (layers, experts) share of routed tokens, 'aux_loss': float} of the last optimizer step
    ({} before the first)."""
    return dict(_LAST)
