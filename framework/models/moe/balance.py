"""Load balancing and expert-load bookkeeping for the MoE layers of this process.

balance=aux_loss adds coef * E * sum_e f_e * P_e to the gradient (Switch/Mixtral; f_e: tokens routed to
e per token, P_e: mean score of e, scores normalised per token), counted over the GLOBAL batch of the
step (Qwen's global-batch balancing), so that its value and gradient are the same for every micro-batch
size, data/expert-parallel layout and pipeline split:
  - f_e has no gradient. Before a step's training forwards, a statistics pass (`StepStatistics`, run by
    the strategy: every micro-batch of the step once, without gradient) tallies each layer's tokens per
    expert and summed scores; one all-reduce over the world makes them the global batch's f_e and P_e.
  - each training forward then adds E * sum_e f_e * P_e(its tokens) through an identity on the hidden
    states whose backward feeds it, weighted like the micro-batch's LM loss
    (framework.models.loss.micro_batch_weight); summed over the step's micro-batches and averaged over the
    data-parallel ranks as the gradients are, that is exactly the gradient of E * sum_e f_e * P_e of the
    global batch. The pass costs one forward without gradient a step; a step that is one forward in the
    world (one process, one micro-batch) is its own global batch and runs none.
Without a pass (balance=bias or none, or that one forward), every training forward adds its tokens per
expert to the layer's tally instead. Neither counts the recompute of activation checkpointing inside
backward (which computes the same auxiliary loss again, so that it saves the same tensors), torch's
pipeline shape inference, nor the planner's pass over fake tensors.

After each optimizer step, from the pass or from one all-reduce of the tallies over the world (a pipeline
stage contributes its own layers; tensor-parallel copies count alike, so shares are unchanged):
  - `last_step()` holds each layer's share of routed tokens per expert and the auxiliary loss (summed over
    layers), which the spec reports as metrics;
  - balance=bias moves each expert's routing bias by rate * sign(mean share - its share) (DeepSeek-V3),
    identically on every rank, outside the gradient.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from framework.models.loss import micro_batch_weight
from framework.models.shape_inference import inferring

_LAYERS: "weakref.WeakSet" = weakref.WeakSet()
_HOOK = None
_LAST: dict = {}
#: the step's global statistics from its pass: "fractions" (layers, E) f_e, "shares", "aux_loss"
_STEP: dict = {}
#: the pass in progress: (2, layers, E) sums of tokens per expert and of normalised scores
_GATHERING: list = [None]


class _AddAuxiliaryLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, aux, weight: float):
        ctx.weight = weight
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.full((), ctx.weight, dtype=torch.float32, device=grad.device), None


def normalised(scores: torch.Tensor) -> torch.Tensor:
    return scores / scores.sum(-1, keepdim=True)


def aux_loss(scores: torch.Tensor, fractions: torch.Tensor) -> torch.Tensor:
    """E * sum_e fractions_e * (mean normalised score of e over these tokens)."""
    probs = normalised(scores)
    return scores.shape[-1] * (fractions.to(probs.dtype) * probs.mean(0)).sum()


def local_fractions(counts: torch.Tensor, top_k: int) -> torch.Tensor:
    """Tokens routed to each expert per token, from (E,) choices of k per token."""
    return counts.double() * top_k / counts.sum().clamp(min=1)


class StepStatistics:
    """The statistics pass of balance=aux_loss (see the module doc): `gathering(device)` around a forward of
    each of the step's micro-batches, without gradient, on every rank."""

    def __init__(self, n_layers: int, n_experts: int, top_k: int):
        self.n_layers, self.n_experts, self.top_k = n_layers, n_experts, top_k

    def gathering(self, device):
        return _Gathering(self, device)


class _Gathering:
    def __init__(self, stats: StepStatistics, device):
        self.stats, self.device = stats, device

    def __enter__(self):
        _ensure_hook()
        _GATHERING[0] = torch.zeros(2, self.stats.n_layers, self.stats.n_experts, dtype=torch.float64,
                                    device=self.device)

    def __exit__(self, kind, value, traceback):
        sums, _GATHERING[0] = _GATHERING[0], None
        if kind is not None:
            return
        if dist.is_initialized():
            dist.all_reduce(sums)
        counts, scores = sums
        tokens = (counts.sum(-1, keepdim=True) / self.stats.top_k).clamp(min=1)
        fractions = counts / tokens
        aux = self.stats.n_experts * (fractions * scores / tokens).sum(-1)
        _STEP.clear()
        _STEP.update(fractions=fractions, shares=counts / counts.sum(-1, keepdim=True).clamp(min=1),
                     aux_loss=float(aux.sum()))


def _counts(counts: torch.Tensor) -> bool:
    """A forward whose routing counts: not shape inference, not the planner's pass over fake tensors."""
    from torch._subclasses.fake_tensor import is_fake
    return not inferring() and not is_fake(counts)


def observe(layer, scores: torch.Tensor, counts: torch.Tensor):
    """Note a forward of `layer` (scores (tokens, E), counts (E,) tokens per expert); the auxiliary loss to
    attach to its output (None where there is none)."""
    if _GATHERING[0] is not None:
        _gather(layer, scores, counts)
        return None
    if not (layer.training and torch.is_grad_enabled()):
        return None
    args = layer.args
    attach = args.balance == "aux_loss" and args.aux_loss_coef > 0
    fractions = _fractions(layer, counts)
    # the same ops in every forward, checkpointing's recompute included (whatever counts): it must save
    # what the forward saved; with gradient only where the loss is attached
    with torch.set_grad_enabled(attach):
        aux = aux_loss(scores, fractions)
    _tally(layer, counts, aux)
    return aux if attach else None


# The bookkeeping runs eagerly inside a compiled block: traced, it would make the graph guard on the layer's
# index and forward count, a recompile per layer and per micro-batch (past dynamo's cache limit on deep models).

@torch.compiler.disable
def _gather(layer, scores: torch.Tensor, counts: torch.Tensor) -> None:
    if _counts(counts):
        _GATHERING[0][0, layer.layer_id] += counts.detach().double()
        _GATHERING[0][1, layer.layer_id] += normalised(scores.detach()).sum(0).double()


@torch.compiler.disable
def _fractions(layer, counts: torch.Tensor) -> torch.Tensor:
    """f_e: the step's global fractions from its pass, else this forward's own."""
    stepped = _STEP.get("fractions")
    return stepped[layer.layer_id] if stepped is not None else local_fractions(counts.detach(), layer.args.top_k)


@torch.compiler.disable
def _tally(layer, counts: torch.Tensor, aux: torch.Tensor) -> None:
    """Without a pass, add a training forward's loads (not a recompute inside backward) to the layer's tally."""
    if "fractions" in _STEP or not _counts(counts) or torch._C._current_graph_task_id() != -1:
        return
    _register(layer)
    layer.load_tally = layer.load_tally + counts.detach().double()
    layer.aux_tally = layer.aux_tally + aux.detach().double()
    layer.forwards += 1


def with_aux_loss(hidden: torch.Tensor, aux, coef: float) -> torch.Tensor:
    """`hidden` unchanged; backward also sends coef * (the micro-batch's loss weight) into `aux`."""
    if aux is None:
        return hidden
    return _AddAuxiliaryLoss.apply(hidden, aux * coef, micro_batch_weight())


def _ensure_hook() -> None:
    global _HOOK
    if _HOOK is None:
        _HOOK = register_optimizer_step_post_hook(_after_optimizer_step)


def _register(layer) -> None:
    if layer not in _LAYERS:
        layer.load_tally = torch.zeros(layer.args.n_experts, dtype=torch.float64, device=counts_device(layer))
        layer.aux_tally = torch.zeros((), dtype=torch.float64, device=counts_device(layer))
        layer.forwards = 0
        _LAYERS.add(layer)
    _ensure_hook()


def counts_device(layer) -> torch.device:
    return layer.router.gate.weight.device


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    if _STEP:
        shares, aux = _STEP["shares"], _STEP["aux_loss"]
        _STEP.clear()
    else:
        tallied = _tallied()
        if tallied is None:
            return
        shares, aux = tallied
    _LAST.clear()
    _LAST.update(shares=shares.cpu(), aux_loss=aux)
    for layer in list(_LAYERS):
        if layer.args.balance == "bias":
            _move_bias(layer.router.expert_bias, shares[layer.layer_id], layer.args.bias_update_rate)


def _tallied():
    """(shares (layers, E), aux loss) of the training forwards since the last step, summed over the world;
    None where there were none."""
    layers = sorted(_LAYERS, key=lambda l: l.layer_id)
    if not layers:
        return None
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
        return None      # no forward since the last step (a second optimizer on this rank)
    shares = loads / loads.sum(-1, keepdim=True).clamp(min=1)
    return shares, float((aux[:, 0] / aux[:, 1].clamp(min=1)).sum())


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
