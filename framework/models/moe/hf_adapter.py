"""Our MoE decoder's weights <-> Hugging Face's Mixtral and Qwen3-MoE layouts (MixtralForCausalLM /
Qwen3MoeForCausalLM safetensors + config.json).

Attention, norms, embedding and head are Llama's names and rotary reordering (llama/hf_adapter.py).
Experts are written as the published checkpoints hold them and as transformers 5's save_pretrained
writes them, one 2-D tensor per expert (Mixtral `block_sparse_moe.experts.{e}.w1|w3|w2.weight`, Qwen3
`mlp.experts.{e}.gate_proj|up_proj|down_proj.weight`; transformers fuses them on load); our 3-D
(expert, out, in) weights are those stacked. Which layout follows from `qk_norm`: Qwen3 normalises each
head's q and k (q_norm/k_norm, whose head_dim entries take the same rotary reordering as a q row),
Mixtral does not. Both compute softmax scores and have no shared expert and no routing bias; Mixtral
always renormalises the top k, Qwen3 as norm_topk_prob says. A model configured otherwise is refused.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from framework.models.hf_files import LayoutError, SafetensorsDir
from framework.models.llama import hf_adapter as llama
from framework.models.moe.model import MoEArgs

_EXPERTS = re.compile(r"^layers\.(\d+)\.feed_forward\.experts\.(w[123])$")
_ROUTER = re.compile(r"^layers\.(\d+)\.feed_forward\.router\.gate\.weight$")
_BIAS = re.compile(r"^layers\.\d+\.feed_forward\.router\.expert_bias$")
_QK_NORM = re.compile(r"^layers\.(\d+)\.attention\.([qk]_norm)\.weight$")


@dataclass(frozen=True)
class Layout:
    architecture: str
    model_type: str
    moe: str                       # the MoE block's name in a decoder layer
    experts: dict[str, str]        # our expert weight -> theirs
    n_experts_key: str
    ffn_key: str


MIXTRAL = Layout("MixtralForCausalLM", "mixtral", "block_sparse_moe", {"w1": "w1", "w3": "w3", "w2": "w2"},
                 "num_local_experts", "intermediate_size")
QWEN3_MOE = Layout("Qwen3MoeForCausalLM", "qwen3_moe", "mlp", {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"},
                   "num_experts", "moe_intermediate_size")
LAYOUTS = {layout.model_type: layout for layout in (MIXTRAL, QWEN3_MOE)}


def layout_of(args: MoEArgs) -> Layout:
    return QWEN3_MOE if args.qk_norm else MIXTRAL


def form_errors(args: MoEArgs) -> list[str]:
    """What keeps this configuration from computing what its HF class (layout_of) computes."""
    name = "Qwen3-MoE" if args.qk_norm else "Mixtral"
    errors = []
    if args.score_func != "softmax":
        errors.append(f"model.score_func={args.score_func} ({name}: softmax)")
    if not args.norm_topk_prob and not args.qk_norm:
        errors.append("model.norm_topk_prob=false (Mixtral renormalises the top-k weights)")
    if args.shared_ffn_dim:
        errors.append(f"model.shared_ffn_dim={args.shared_ffn_dim} ({name} has no shared expert)")
    if args.balance == "bias":
        errors.append(f"model.balance=bias ({name} has no routing bias)")
    return errors


def expected_shapes(args: MoEArgs) -> dict[str, tuple[int, ...]]:
    """Our parameter name -> full shape, for the names the HF layout holds (routing biases left out)."""
    shapes = {k: v for k, v in llama.expected_shapes(args).items() if ".feed_forward." not in k}
    e, d, h = args.n_experts, args.dim, args.moe_ffn_dim
    for i in range(args.n_layers):
        if args.qk_norm:
            shapes.update({f"layers.{i}.attention.q_norm.weight": (args.head_dim,),
                           f"layers.{i}.attention.k_norm.weight": (args.head_dim,)})
        shapes[f"layers.{i}.feed_forward.router.gate.weight"] = (e, d)
        shapes.update({f"layers.{i}.feed_forward.experts.w1": (e, h, d),
                       f"layers.{i}.feed_forward.experts.w3": (e, h, d),
                       f"layers.{i}.feed_forward.experts.w2": (e, d, h)})
    return shapes


def hf_key(name: str, args: MoEArgs, expert: int | None = None) -> str:
    """The HF name of one of our parameters (of expert `expert` of a 3-D expert weight)."""
    layout = layout_of(args)
    if m := _EXPERTS.match(name):
        return f"model.layers.{m.group(1)}.{layout.moe}.experts.{expert}.{layout.experts[m.group(2)]}.weight"
    if m := _ROUTER.match(name):
        return f"model.layers.{m.group(1)}.{layout.moe}.gate.weight"
    if m := _QK_NORM.match(name):
        return f"model.layers.{m.group(1)}.self_attn.{m.group(2)}.weight"
    return llama.hf_name(name, args)


def _rotary_rows(name: str, args: MoEArgs) -> int | None:
    """How many rotary heads a weight's rows hold (a q/k norm: one head's entries), None if not rotary."""
    return 1 if _QK_NORM.match(name) else llama._heads(name, args)


def to_hf(state: dict[str, torch.Tensor], args: MoEArgs) -> dict[str, torch.Tensor]:
    errors = form_errors(args)
    if errors:
        raise LayoutError(f"no {layout_of(args).architecture} layout for {'; '.join(errors)}")
    shapes = expected_shapes(args)
    missing = sorted(set(shapes) - set(state))
    if missing:
        raise LayoutError(f"the checkpoint lacks {len(missing)} MoE weights, e.g. {missing[0]!r}")
    out = {}
    for name, shape in shapes.items():
        w = state[name].detach().float().cpu()
        if tuple(w.shape) != shape:
            raise LayoutError(f"{name} has shape {tuple(w.shape)}, the model config says {shape}")
        if _EXPERTS.match(name):
            for e in range(args.n_experts):
                out[hf_key(name, args, e)] = w[e].contiguous()
            continue
        heads = _rotary_rows(name, args)
        if heads:
            w = llama.interleaved_to_halves(w.reshape(shape[0], -1), heads).reshape(shape)
        out[hf_key(name, args)] = w.contiguous()
    return out


def linear_to_hf(name: str, rows: torch.Tensor, args: MoEArgs) -> tuple[str, torch.Tensor]:
    """One dense linear's weight-shaped tensor (a LoRA B) -> (HF name, rows in HF's order)."""
    heads = _rotary_rows(name, args)
    return hf_key(name, args), (llama.interleaved_to_halves(rows, heads) if heads else rows)


def hf_config(args: MoEArgs) -> dict:
    layout = layout_of(args)
    config = llama.hf_config(args)
    config.pop("mlp_bias", None)
    config.update({"architectures": [layout.architecture], "model_type": layout.model_type,
                   "intermediate_size": args.moe_ffn_dim, layout.ffn_key: args.moe_ffn_dim,
                   layout.n_experts_key: args.n_experts, "num_experts_per_tok": args.top_k,
                   "router_aux_loss_coef": args.aux_loss_coef, "output_router_logits": False,
                   "sliding_window": None})
    if layout is MIXTRAL:
        config["router_jitter_noise"] = 0.0
    else:
        config.update({"norm_topk_prob": args.norm_topk_prob, "decoder_sparse_step": 1, "mlp_only_layers": [],
                       "use_sliding_window": False})
    return config


# Qwen3-MoE config.json values this decoder cannot compute: every layer MoE, full attention everywhere
_QWEN3_FIXED = {"decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": False}


def function_values(hf: dict) -> list[tuple[str, str, object]]:
    """Llama's, and what the layout says: Qwen3 has q/k norms and its own norm_topk_prob."""
    layout = LAYOUTS.get(hf.get("model_type"))
    if layout is None:
        raise LayoutError(f"model_type={hf.get('model_type')!r}; the MoE family reads {' and '.join(LAYOUTS)}")
    if layout is QWEN3_MOE:
        for key, ours in _QWEN3_FIXED.items():
            if (hf.get(key) or ours) != ours:
                raise LayoutError(f"{key}={hf[key]}; this MoE decoder computes only {key}={ours}")
    # head_dim is a shape here (model.attn_head_dim, SHAPE_KEYS), not a Llama refusal
    values = llama.function_values({k: v for k, v in hf.items() if k != "head_dim"})
    # no config.json key says it, the model_type does (a refusal reads "... contradicts mixtral q/k norms=False")
    return values + [(f"{layout.model_type} q/k norms", "qk_norm", layout is QWEN3_MOE),
                     ("norm_topk_prob", "norm_topk_prob", bool(hf.get("norm_topk_prob", True)))]


SHAPE_KEYS = {
    "hidden_size": ("dim", lambda a: a.dim),
    "num_hidden_layers": ("n_layers", lambda a: a.n_layers),
    "num_attention_heads": ("n_heads", lambda a: a.n_heads),
    "num_key_value_heads": ("n_kv_heads", lambda a: a.kv_heads),
    "head_dim": ("attn_head_dim", lambda a: a.head_dim),
    "vocab_size": ("vocab_size", lambda a: a.vocab_size),
    "num_experts_per_tok": ("top_k", lambda a: a.top_k),
    "tie_word_embeddings": ("tie_embeddings", lambda a: a.tie_embeddings),
}


def config_mismatches(hf: dict, args: MoEArgs) -> list[tuple[str, str, object, object]]:
    layout = layout_of(args)
    if hf.get("model_type") != layout.model_type:
        return [("model_type", "qk_norm", hf.get("model_type"), args.qk_norm)]
    keys = {**SHAPE_KEYS, layout.ffn_key: ("moe_ffn_dim", lambda a: a.moe_ffn_dim),
            layout.n_experts_key: ("n_experts", lambda a: a.n_experts)}
    out = []
    for key, (ours, read) in keys.items():
        theirs = hf.get(key)
        if key == "num_key_value_heads" and theirs is None:
            theirs = hf.get("num_attention_heads")
        if key == "head_dim" and theirs is None:
            theirs = hf["hidden_size"] // hf["num_attention_heads"]
        if key == "tie_word_embeddings":
            theirs = bool(hf.get(key, False))
        if theirs != read(args):
            out.append((key, ours, theirs, read(args)))
    return out


class HFWeights:
    """Read a Mixtral- or Qwen3-MoE-layout dir back into our names and layout, one parameter at a time (an
    expert weight stacks its E per-expert tensors; routing biases, which neither has, start at zero)."""

    def __init__(self, path: str, args: MoEArgs):
        self.args = args
        self._files = SafetensorsDir(path)

    def _keys(self, name: str) -> list[str]:
        if _EXPERTS.match(name):
            return [hf_key(name, self.args, e) for e in range(self.args.n_experts)]
        return [hf_key(name, self.args)]

    def shape_errors(self) -> list[str]:
        errors = []
        for name, shape in expected_shapes(self.args).items():
            want = shape[1:] if _EXPERTS.match(name) else shape
            for key in self._keys(name):
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
        w = self._files.tensor(self._keys(name)[0]).float()
        heads = _rotary_rows(name, self.args)
        return llama.halves_to_interleaved(w.reshape(w.shape[0], -1), heads).reshape(w.shape) if heads else w

    def part(self, name: str, index: tuple) -> torch.Tensor:
        return self.full(name)[index]
