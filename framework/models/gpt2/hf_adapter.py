"""Our GPT-2's weights <-> the Hugging Face GPT-2 layout (GPT2LMHeadModel safetensors + config.json).

HF keeps GPT-2's original Conv1D layers, whose weight is (in, out): every linear is transposed, and
q, k and v are one fused `c_attn` (columns q | k | v). The head is tied to `transformer.wte.weight`
and not stored.
"""
from __future__ import annotations

import re

import torch

from framework.models.gpt2.model import TIED, GPT2Args
from framework.models.hf_files import LayoutError, SafetensorsDir

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_QKV = ("attn.wq", "attn.wk", "attn.wv")
# our per-layer module -> HF module; True where HF's Conv1D stores the weight transposed
_LAYER_MODULES = {"ln_1": ("ln_1", False), "ln_2": ("ln_2", False), "attn.wo": ("attn.c_proj", True),
                  "mlp.fc": ("mlp.c_fc", True), "mlp.proj": ("mlp.c_proj", True)}
_TOP = {"wte.weight": "transformer.wte.weight", "wpe.weight": "transformer.wpe.weight",
        "ln_f.weight": "transformer.ln_f.weight", "ln_f.bias": "transformer.ln_f.bias"}
_ALIASES = {alias: canonical for canonical, alias in TIED}


def expected_shapes(args: GPT2Args) -> dict[str, tuple[int, ...]]:
    """Our parameter name -> full shape (the tied head left out)."""
    d, h = args.dim, args.hidden_dim
    shapes = {"wte.weight": (args.vocab_size, d), "wpe.weight": (args.max_seq_len, d),
              "ln_f.weight": (d,), "ln_f.bias": (d,)}
    per_layer = {"ln_1.weight": (d,), "ln_1.bias": (d,), "ln_2.weight": (d,), "ln_2.bias": (d,),
                 "mlp.fc.weight": (h, d), "mlp.fc.bias": (h,), "mlp.proj.weight": (d, h), "mlp.proj.bias": (d,)}
    for w in (*_QKV, "attn.wo"):
        per_layer.update({f"{w}.weight": (d, d), f"{w}.bias": (d,)})
    for i in range(args.n_layers):
        shapes.update({f"layers.{i}.{k}": v for k, v in per_layer.items()})
    return shapes


def _hf_shapes(args: GPT2Args) -> dict[str, tuple[int, ...]]:
    d, h = args.dim, args.hidden_dim
    shapes = {_TOP[k]: v for k, v in expected_shapes(args).items() if k in _TOP}
    for i in range(args.n_layers):
        p = f"transformer.h.{i}."
        shapes.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                       p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
                       p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                       p + "mlp.c_fc.weight": (d, h), p + "mlp.c_fc.bias": (h,),
                       p + "mlp.c_proj.weight": (h, d), p + "mlp.c_proj.bias": (d,)})
    return shapes


def to_hf(state: dict[str, torch.Tensor], args: GPT2Args) -> dict[str, torch.Tensor]:
    """A full fp32 state dict of our GPT-2 -> HF tensors (contiguous, ready for save_file)."""
    shapes = expected_shapes(args)
    missing = sorted(set(shapes) - set(state))
    if missing:
        raise LayoutError(f"the checkpoint lacks {len(missing)} GPT-2 weights, e.g. {missing[0]!r}")
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise LayoutError(f"{name} has shape {tuple(state[name].shape)}, the model config says {shape}")
    w = {k: state[k].detach().float().cpu() for k in shapes}
    out = {hf: w[ours] for ours, hf in _TOP.items()}
    for i in range(args.n_layers):
        ours, theirs = f"layers.{i}.", f"transformer.h.{i}."
        out[theirs + "attn.c_attn.weight"] = torch.cat([w[f"{ours}{q}.weight"] for q in _QKV]).t()
        out[theirs + "attn.c_attn.bias"] = torch.cat([w[f"{ours}{q}.bias"] for q in _QKV])
        for module, (hf_module, transposed) in _LAYER_MODULES.items():
            weight = w[f"{ours}{module}.weight"]
            out[f"{theirs}{hf_module}.weight"] = weight.t() if transposed else weight
            out[f"{theirs}{hf_module}.bias"] = w[f"{ours}{module}.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(args: GPT2Args) -> dict:
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "n_embd": args.dim, "n_layer": args.n_layers, "n_head": args.n_heads, "n_inner": None,
        "n_positions": args.max_seq_len, "n_ctx": args.max_seq_len, "vocab_size": args.vocab_size,
        "layer_norm_epsilon": args.norm_eps, "initializer_range": args.init_std,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "scale_attn_weights": True,
        "tie_word_embeddings": True, "torch_dtype": "float32",
    }


def model_cfg_from_hf(hf: dict, target: str) -> dict:
    return {"_target_": target, "dim": hf["n_embd"], "n_layers": hf["n_layer"], "n_heads": hf["n_head"],
            "vocab_size": hf["vocab_size"], "max_seq_len": hf["n_positions"],
            "norm_eps": hf.get("layer_norm_epsilon", 1e-5)}


def function_values(hf: dict) -> list[tuple[str, str, object]]:
    """(config.json key, our model key, value) of what changes the function but no shape (initial_load adopts
    it unless the command line sets it)."""
    return [("layer_norm_epsilon", "norm_eps", float(hf.get("layer_norm_epsilon", 1e-5)))]


# config.json key -> (our model key, how to read it from GPT2Args): what must agree for the weights to fit
SHAPE_KEYS = {"n_embd": ("dim", lambda a: a.dim), "n_layer": ("n_layers", lambda a: a.n_layers),
              "n_head": ("n_heads", lambda a: a.n_heads), "vocab_size": ("vocab_size", lambda a: a.vocab_size),
              "n_positions": ("max_seq_len", lambda a: a.max_seq_len)}


def config_mismatches(hf: dict, args: GPT2Args) -> list[tuple[str, str, object, object]]:
    out = [(key, ours, hf.get(key), read(args)) for key, (ours, read) in SHAPE_KEYS.items() if hf.get(key) != read(args)]
    if hf.get("n_inner") not in (None, args.hidden_dim):
        out.append(("n_inner", "dim", hf["n_inner"], args.hidden_dim))
    return out


class HFWeights:
    """Read an HF GPT-2 model dir (one or many safetensors files) back into our names and layout, one tensor
    at a time."""

    def __init__(self, path: str, args: GPT2Args):
        self.args = args
        self._file = SafetensorsDir(path)
        self._keys = self._file.keys()

    def _get(self, key: str) -> torch.Tensor:
        return self._file.tensor(key).float()

    def shape_errors(self) -> list[str]:
        errors = []
        for key, shape in _hf_shapes(self.args).items():
            if key not in self._keys:
                errors.append(f"{key} is missing")
            elif self._file.shape(key) != shape:
                errors.append(f"{key} has shape {self._file.shape(key)}, the model needs {shape}")
        return errors

    def full(self, name: str) -> torch.Tensor:
        """The full fp32 tensor of our parameter `name` (the tied head reads the embedding)."""
        name = _ALIASES.get(name, name)
        if name in _TOP:
            return self._get(_TOP[name])
        m = _LAYER.match(name)
        if not m:
            raise LayoutError(f"{name!r} is not a parameter of GPT-2")
        i, rest = m.group(1), m.group(2)
        prefix = f"transformer.h.{i}."
        module, _, kind = rest.rpartition(".")
        if module in _QKV:
            d = self.args.dim
            part = _QKV.index(module)
            fused = self._get(prefix + f"attn.c_attn.{kind}")
            return (fused[:, part * d:(part + 1) * d].t() if kind == "weight" else fused[part * d:(part + 1) * d]).contiguous()
        if module not in _LAYER_MODULES:
            raise LayoutError(f"{name!r} is not a parameter of GPT-2")
        hf_module, transposed = _LAYER_MODULES[module]
        t = self._get(f"{prefix}{hf_module}.{kind}")
        return t.t().contiguous() if transposed and kind == "weight" else t
