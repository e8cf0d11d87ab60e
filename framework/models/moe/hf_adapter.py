"""Our MoE decoder's weights <-> Hugging Face's Mixtral layout (MixtralForCausalLM safetensors + config.json).

Attention, norms, embedding and head are Llama's names and rotary reordering (llama/hf_adapter.py).
Experts are written as Mixtral's published checkpoints hold them and as transformers 5's save_pretrained
writes them, one 2-D tensor per expert (`block_sparse_moe.experts.{e}.w1|w3|w2.weight`; transformers
fuses them into gate_up_proj/down_proj on load); our 3-D (expert, out, in) weights are those stacked.
Mixtral computes softmax scores, renormalised top-k, no shared expert and no routing bias: a model
configured otherwise has no Mixtral form and is refused.

Qwen3-MoE is not written: its attention normalises q and k per head (q_norm, k_norm), which this
decoder's attention lacks.
"""
from __future__ import annotations

import re

import torch

from framework.models.hf_files import LayoutError, SafetensorsDir
from framework.models.llama import hf_adapter as llama
from framework.models.moe.model import MoEArgs

_EXPERTS = re.compile(r"^layers\.(\d+)\.feed_forward\.experts\.(w[123])$")
_ROUTER = re.compile(r"^layers\.(\d+)\.feed_forward\.router\.gate\.weight$")
_BIAS = re.compile(r"^layers\.\d+\.feed_forward\.router\.expert_bias$")


def mixtral_form_errors(args: MoEArgs) -> list[str]:
    """What keeps this configuration from computing what MixtralForCausalLM computes."""
    errors = []
    if args.score_func != "softmax":
        errors.append(f"model.score_func={args.score_func} (Mixtral: softmax)")
    if not args.norm_topk_prob:
        errors.append("model.norm_topk_prob=false (Mixtral renormalises the top-k weights)")
    if args.shared_ffn_dim:
        errors.append(f"model.shared_ffn_dim={args.shared_ffn_dim} (Mixtral has no shared expert)")
    if args.balance == "bias":
        errors.append("model.balance=bias (Mixtral has no routing bias)")
    return errors


def expected_shapes(args: MoEArgs) -> dict[str, tuple[int, ...]]:
    """Our parameter name -> full shape, for the names the HF layout holds (routing biases left out)."""
    shapes = {k: v for k, v in llama.expected_shapes(args).items() if ".feed_forward." not in k}
    e, d, h = args.n_experts, args.dim, args.moe_ffn_dim
    for i in range(args.n_layers):
        shapes[f"layers.{i}.feed_forward.router.gate.weight"] = (e, d)
        shapes.update({f"layers.{i}.feed_forward.experts.w1": (e, h, d),
                       f"layers.{i}.feed_forward.experts.w3": (e, h, d),
                       f"layers.{i}.feed_forward.experts.w2": (e, d, h)})
    return shapes


def _expert_key(layer: str, e: int, w: str) -> str:
    return f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight"


def to_hf(state: dict[str, torch.Tensor], args: MoEArgs) -> dict[str, torch.Tensor]:
    errors = mixtral_form_errors(args)
    if errors:
        raise LayoutError(f"no Mixtral layout for {'; '.join(errors)}")
    shapes = expected_shapes(args)
    missing = sorted(set(shapes) - set(state))
    if missing:
        raise LayoutError(f"the checkpoint lacks {len(missing)} MoE weights, e.g. {missing[0]!r}")
    dense = {k: state[k] for k in shapes if ".feed_forward." not in k}
    out = _dense_to_hf(dense, args)
    for name, shape in shapes.items():
        w = state[name].detach().float().cpu()
        if tuple(w.shape) != shape:
            raise LayoutError(f"{name} has shape {tuple(w.shape)}, the model config says {shape}")
        if m := _ROUTER.match(name):
            out[f"model.layers.{m.group(1)}.block_sparse_moe.gate.weight"] = w.contiguous()
        elif m := _EXPERTS.match(name):
            for e in range(args.n_experts):
                out[_expert_key(m.group(1), e, m.group(2))] = w[e].contiguous()
    return out


def _dense_to_hf(dense: dict[str, torch.Tensor], args: MoEArgs) -> dict[str, torch.Tensor]:
    out = {}
    for name, w in dense.items():
        w = w.detach().float().cpu()
        heads = llama._heads(name, args)
        out[llama.hf_name(name, args)] = (llama.interleaved_to_halves(w, heads) if heads else w).contiguous()
    return out


def hf_config(args: MoEArgs) -> dict:
    config = llama.hf_config(args)
    config.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                   "intermediate_size": args.moe_ffn_dim, "num_local_experts": args.n_experts,
                   "num_experts_per_tok": args.top_k, "router_aux_loss_coef": args.aux_loss_coef,
                   "output_router_logits": False, "sliding_window": None, "router_jitter_noise": 0.0})
    for key in ("mlp_bias",):
        config.pop(key, None)
    return config


def function_values(hf: dict) -> list[tuple[str, str, object]]:
    return llama.function_values(hf)


SHAPE_KEYS = {
    "hidden_size": ("dim", lambda a: a.dim),
    "intermediate_size": ("moe_ffn_dim", lambda a: a.moe_ffn_dim),
    "num_hidden_layers": ("n_layers", lambda a: a.n_layers),
    "num_attention_heads": ("n_heads", lambda a: a.n_heads),
    "num_key_value_heads": ("n_kv_heads", lambda a: a.kv_heads),
    "vocab_size": ("vocab_size", lambda a: a.vocab_size),
    "num_local_experts": ("n_experts", lambda a: a.n_experts),
    "num_experts_per_tok": ("top_k", lambda a: a.top_k),
    "tie_word_embeddings": ("tie_embeddings", lambda a: a.tie_embeddings),
}


def config_mismatches(hf: dict, args: MoEArgs) -> list[tuple[str, str, object, object]]:
    out = []
    for key, (ours, read) in SHAPE_KEYS.items():
        theirs = hf.get(key, hf.get("num_attention_heads") if key == "num_key_value_heads" else None)
        if key == "tie_word_embeddings":
            theirs = bool(hf.get(key, False))
        if theirs != read(args):
            out.append((key, ours, theirs, read(args)))
    return out


class HFWeights:
    """Read a Mixtral-layout dir back into our names and layout, one parameter at a time (an expert
    weight stacks its E per-expert tensors; routing biases, which Mixtral lacks, start at zero)."""

    def __init__(self, path: str, args: MoEArgs):
        self.args = args
        self._files = SafetensorsDir(path)

    def _keys(self, name: str) -> list[str]:
        if m := _EXPERTS.match(name):
            return [_expert_key(m.group(1), e, m.group(2)) for e in range(self.args.n_experts)]
        if m := _ROUTER.match(name):
            return [f"model.layers.{m.group(1)}.block_sparse_moe.gate.weight"]
        return [llama.hf_name(name, self.args)]

    def shape_errors(self) -> list[str]:
        errors = []
        for name, shape in expected_shapes(self.args).items():
            expert = _EXPERTS.match(name) is not None
            for key in self._keys(name):
                want = shape[1:] if expert else shape
                if key not in self._files:
                    errors.append(f"{key} is missing")
                elif self._files.shape(key) != want:
                    errors.append(f"{key} has shape {self._files.shape(key)}, the model needs {want}")
        return errors

    def full(self, name: str) -> torch.Tensor:
        if _BIAS.match(name):
            return torch.zeros(self.args.n_experts)
        if _EXPERTS.match(name):
            return torch.stack([self._files.tensor(k).float() for k in self._keys(name)])
        if _ROUTER.match(name):
            return self._files.tensor(self._keys(name)[0]).float()
        w = self._files.tensor(llama.hf_name(name, self.args)).float()
        heads = llama._heads(name, self.args)
        return llama.halves_to_interleaved(w, heads) if heads else w

    def part(self, name: str, index: tuple) -> torch.Tensor:
        return self.full(name)[index]
