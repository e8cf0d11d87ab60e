"""Our Llama's weights <-> the Hugging Face Llama layout (LlamaForCausalLM safetensors + config.json).

Names map one to one. Our rotary embedding rotates interleaved pairs (x[2i], x[2i+1]) like Meta's
original Llama; HF's rotates the two halves of each head (rotate_half). The same attention results
need the rows of each q/k head reordered (evens first, then odds) on export and back on import, as
HF's convert_llama_weights_to_hf.py does.
"""
from __future__ import annotations

import re

import torch

from framework.models.hf_files import LayoutError, SafetensorsDir
from framework.models.llama.model import ROPE_SCALING_KEYS, ROPE_TYPES, LlamaArgs, rope_scaling_dict

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def hf_name(name: str, args: LlamaArgs) -> str:
    if name == "output.weight" and args.tie_embeddings:
        return _TOP_NAMES["tok_embeddings.weight"]
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    m = _LAYER.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    raise LayoutError(f"{name!r} is not a parameter of {LlamaArgs.__module__}.Llama")


def _heads(name: str, args: LlamaArgs) -> int | None:
    """How many rotary heads a q/k projection holds (None for every other weight)."""
    if name.endswith("attention.wq.weight"):
        return args.n_heads
    if name.endswith("attention.wk.weight"):
        return args.kv_heads
    return None


def interleaved_to_halves(w: torch.Tensor, heads: int) -> torch.Tensor:
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def halves_to_interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def expected_shapes(args: LlamaArgs) -> dict[str, tuple[int, ...]]:
    """Our parameter name -> full shape (output.weight left out when tied to the embedding)."""
    d, hd, h = args.dim, args.head_dim, args.hidden_dim
    shapes = {"tok_embeddings.weight": (args.vocab_size, d), "norm.weight": (d,)}
    if not args.tie_embeddings:
        shapes["output.weight"] = (args.vocab_size, d)
    per_layer = {"attention.wq.weight": (args.n_heads * hd, d), "attention.wk.weight": (args.kv_heads * hd, d),
                 "attention.wv.weight": (args.kv_heads * hd, d), "attention.wo.weight": (d, args.n_heads * hd),
                 "feed_forward.w1.weight": (h, d), "feed_forward.w3.weight": (h, d),
                 "feed_forward.w2.weight": (d, h), "attention_norm.weight": (d,), "ffn_norm.weight": (d,)}
    for i in range(args.n_layers):
        shapes.update({f"layers.{i}.{k}": v for k, v in per_layer.items()})
    return shapes


def to_hf(state: dict[str, torch.Tensor], args: LlamaArgs) -> dict[str, torch.Tensor]:
    """A full fp32 state dict of our Llama -> HF tensors (contiguous, ready for save_file)."""
    shapes = expected_shapes(args)
    missing = sorted(set(shapes) - set(state))
    if missing:
        raise LayoutError(f"the checkpoint lacks {len(missing)} Llama weights, e.g. {missing[0]!r}")
    out = {}
    for name, shape in shapes.items():
        w = state[name].detach().float().cpu()
        if tuple(w.shape) != shape:
            raise LayoutError(f"{name} has shape {tuple(w.shape)}, the model config says {shape}")
        heads = _heads(name, args)
        out[hf_name(name, args)] = (interleaved_to_halves(w, heads) if heads else w).contiguous()
    return out


def linear_to_hf(name: str, rows: torch.Tensor, args: LlamaArgs) -> tuple[str, torch.Tensor]:
    """One linear's weight-shaped tensor (its output rows first: a LoRA B) -> (HF name, rows in HF's order)."""
    heads = _heads(name, args)
    return hf_name(name, args), (interleaved_to_halves(rows, heads) if heads else rows)


def rope_of(hf: dict) -> tuple[float, dict]:
    """(rope_theta, our rope_scaling) of a config.json, whichever way transformers wrote it: `rope_theta` +
    `rope_scaling` (before v5) or `rope_parameters` (v5). Raises LayoutError for a RoPE this Llama lacks."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, rope_scaling_dict({})
    if rope_type not in ROPE_TYPES:
        raise LayoutError(f"rope_type {rope_type!r} is not implemented here; this Llama computes "
                          f"{' and '.join(ROPE_TYPES)} RoPE only")
    missing = [k for k in ROPE_SCALING_KEYS if k not in params]
    if missing:
        raise LayoutError(f"llama3 rope scaling lacks {', '.join(missing)}")
    return theta, {"rope_type": rope_type, **{k: params[k] for k in ROPE_SCALING_KEYS}}


def hf_config(args: LlamaArgs) -> dict:
    scaling = rope_scaling_dict(args.rope_scaling)
    scaled = scaling["rope_type"] != "default"
    rope = {**scaling, "rope_theta": args.rope_theta} if scaled else {"rope_type": "default",
                                                                       "rope_theta": args.rope_theta}
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": args.dim, "intermediate_size": args.hidden_dim, "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads, "num_key_value_heads": args.kv_heads, "head_dim": args.head_dim,
        "vocab_size": args.vocab_size, "rms_norm_eps": args.norm_eps, "rope_theta": args.rope_theta,
        "rope_parameters": rope, "max_position_embeddings": args.max_seq_len,
        "tie_word_embeddings": args.tie_embeddings, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "float32",
    }
    if scaled:   # what transformers before v5 reads
        config["rope_scaling"] = scaling
    return config


# config.json values our Llama has no counterpart for: such a checkpoint would load and compute another function
_FIXED = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def _refuse_what_this_llama_lacks(hf: dict) -> None:
    for key, ours in _FIXED.items():
        if hf.get(key, ours) != ours:
            raise LayoutError(f"{key}={hf[key]}; this Llama computes only {key}={ours}")
    head_dim = hf.get("head_dim")
    if head_dim and head_dim != hf["hidden_size"] // hf["num_attention_heads"]:
        raise LayoutError(f"head_dim={head_dim} is not hidden_size / num_attention_heads "
                          f"({hf['hidden_size'] // hf['num_attention_heads']}), which this Llama requires")


def function_values(hf: dict) -> list[tuple[str, str, object]]:
    """(config.json key, our model key, value) for what changes the function without changing a shape:
    the checkpoint's values, which initial_load adopts unless the command line sets them."""
    _refuse_what_this_llama_lacks(hf)
    theta, scaling = rope_of(hf)
    return [("rms_norm_eps", "norm_eps", float(hf.get("rms_norm_eps", 1e-6))),
            ("rope_theta", "rope_theta", theta), ("rope_scaling", "rope_scaling", scaling),
            ("tie_word_embeddings", "tie_embeddings", bool(hf.get("tie_word_embeddings", False)))]


# config.json key -> (our model key, how to read it from LlamaArgs): what must agree for the weights to fit.
SHAPE_KEYS = {
    "hidden_size": ("dim", lambda a: a.dim),
    "intermediate_size": ("ffn_dim", lambda a: a.hidden_dim),
    "num_hidden_layers": ("n_layers", lambda a: a.n_layers),
    "num_attention_heads": ("n_heads", lambda a: a.n_heads),
    "num_key_value_heads": ("n_kv_heads", lambda a: a.kv_heads),
    "vocab_size": ("vocab_size", lambda a: a.vocab_size),
    "tie_word_embeddings": ("tie_embeddings", lambda a: a.tie_embeddings),
}


def config_mismatches(hf: dict, args: LlamaArgs) -> list[tuple[str, str, object, object]]:
    """(config.json key, model key, their value, our value) for each shape-relevant difference."""
    out = []
    for key, (ours, read) in SHAPE_KEYS.items():
        theirs = hf.get(key, hf.get("num_attention_heads") if key == "num_key_value_heads" else None)
        if key == "tie_word_embeddings":
            theirs = bool(hf.get(key, False))
        if theirs != read(args):
            out.append((key, ours, theirs, read(args)))
    return out


class HFWeights:
    """Read an HF-layout dir (one or many safetensors files) back into our names and layout, one tensor at
    a time."""

    def __init__(self, path: str, args: LlamaArgs):
        self.args = args
        self._files = SafetensorsDir(path)

    def shape_errors(self) -> list[str]:
        errors = []
        for name, shape in expected_shapes(self.args).items():
            key = hf_name(name, self.args)
            if key not in self._files:
                errors.append(f"{key} is missing")
            elif self._files.shape(key) != shape:
                errors.append(f"{key} has shape {self._files.shape(key)}, the model needs {shape}")
        return errors

    def full(self, name: str) -> torch.Tensor:
        """The full fp32 tensor of our parameter `name`, in our (interleaved rotary) layout."""
        w = self._files.tensor(hf_name(name, self.args)).float()
        heads = _heads(name, self.args)
        return halves_to_interleaved(w, heads) if heads else w

    def part(self, name: str, index: tuple) -> torch.Tensor:
        """Only `index` (a shard's slices) of our parameter `name`; a q/k projection, whose rows are
        reordered within each head, is read whole first."""
        if _heads(name, self.args):
            return self.full(name)[index]
        return self._files.slice(hf_name(name, self.args), index).float()


@torch.no_grad()
def load_into(model: torch.nn.Module, path: str) -> None:
    """Overwrite every parameter of a plain (unsharded) Llama with the weights in `path`."""
    weights = HFWeights(path, model.args)
    for name, param in model.named_parameters():
        param.copy_(weights.full(name))
