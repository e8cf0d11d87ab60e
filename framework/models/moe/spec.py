"""Our MoE decoder as the framework sees it: Llama's spec with the MoE model's arguments, HF layout,
balancing (statistics pass, metrics) and expert counts (total vs active parameters) for FLOPs and the planner."""
from __future__ import annotations

from dataclasses import dataclass

from framework.errors import ConfigError
from framework.models.llama.spec import LlamaSpec
from framework.models.moe import balance, hf_adapter
from framework.models.moe.model import BALANCES, EXPERT_COMPUTE, SCORE_FUNCS, MoEArgs, MoETransformer


@dataclass
class MoEModelConfig(MoEArgs):
    _target_: str = "framework.models.moe.MoETransformer"   # the model class built (the family's)


class MoESpec(LlamaSpec):
    """Llama's spec (init, TP plan, pipeline split, loss chunking, rules) with the MoE arguments, the HF
    layouts of Mixtral and Qwen3-MoE, expert counts and balancing on top."""
    name = "moe"
    hf_model_type = "mixtral"
    args_class = MoEArgs
    has_experts = True
    float8_kept = ("router.gate",)       # its scores pick the experts (torchtitan leaves routers out too)
    adapter = hf_adapter

    def config_schema(self) -> type:
        return MoEModelConfig

    def model_class(self) -> type:
        return MoETransformer

    def lora_skip(self) -> tuple[str, ...]:
        return (r"\.router\.gate$",)      # adapters go on the dense linears; the experts are not nn.Linear

    def active_params(self, model_cfg) -> int:
        return self.args(model_cfg).active_params()

    def dispatch_elements(self, model_cfg) -> int:
        args = self.args(model_cfg)
        return args.top_k * args.dim

    def batch_statistics(self, model_cfg):
        """balance=aux_loss counts its expert fractions over the global batch (balance.py)."""
        args = self.args(model_cfg)
        if args.balance != "aux_loss" or args.aux_loss_coef <= 0:
            return None
        return balance.StepStatistics(args.n_layers, args.n_experts, args.top_k)

    def step_metrics(self, model) -> dict:
        last = balance.last_step()
        if not last:
            return {}
        shares = last["shares"]
        ratio = shares.max(-1).values / shares.mean(-1)
        record = {"moe_aux_loss": last["aux_loss"], "moe_load_max_over_mean": float(ratio.max())}
        for i, (row, r) in enumerate(zip(shares, ratio)):
            record[f"moe_layer{i}_load_max_over_mean"] = float(r)
            record[f"moe_layer{i}_expert_share"] = [round(float(s), 6) for s in row]
        return record

    def validate(self, cfg) -> None:
        super().validate(cfg)
        m = cfg.model
        for key, allowed in (("score_func", SCORE_FUNCS), ("balance", BALANCES),
                             ("expert_compute", EXPERT_COMPUTE)):
            if m[key] not in allowed:
                raise ConfigError(f"model.{key}", f"{m[key]!r} is not one of {', '.join(allowed)}")
        if m.n_experts <= 0 or m.moe_ffn_dim <= 0:
            key = "n_experts" if m.n_experts <= 0 else "moe_ffn_dim"
            raise ConfigError(f"model.{key}", f"must be positive, got {m[key]}")
        if not 0 < m.top_k <= m.n_experts:
            raise ConfigError("model.top_k", f"{m.top_k} must be between 1 and model.n_experts={m.n_experts}")
        if m.shared_ffn_dim < 0:
            raise ConfigError("model.shared_ffn_dim", f"must be 0 (no shared expert) or positive, got {m.shared_ffn_dim}")
        if m.balance == "aux_loss" and m.aux_loss_coef > 0 and cfg.precision.get("name") == "fp16":
            raise ConfigError("model.balance", "the auxiliary loss's gradient does not pass through fp16 loss "
                                               "scaling; use precision=bf16, or model.balance=bias")

    def validate_layout(self, cfg, tp: int, pp: int) -> None:
        super().validate_layout(cfg, tp, pp)
        ep = cfg.parallel.get("ep", 1)
        if cfg.model.n_experts % ep:
            raise ConfigError("parallel.ep", f"model.n_experts={cfg.model.n_experts} experts do not divide among "
                                             f"parallel.ep={ep} ranks")
        if tp > 1 and cfg.model.qk_norm:
            # each tp rank normalises its own heads with the one replicated weight, whose gradient would
            # then need a sum over tp that the plan does not make
            raise ConfigError("model.qk_norm", f"the per-head q/k norms are not split by parallel.tp={tp}; "
                                               f"use parallel.tp=1 (ep and pp take Qwen3-MoE shapes)")
        if tp > 1 and cfg.parallel.get("sequence_parallel"):
            raise ConfigError("parallel.sequence_parallel", "MoE layers run whole on every tensor-parallel "
                                                            "rank and need every token there; set it to false")

    def reads_hf(self, model_type) -> bool:
        return model_type in hf_adapter.LAYOUTS

    def model_cfg_from_hf(self, hf):
        layout = hf_adapter.LAYOUTS[hf.get("model_type")]
        cfg = super().model_cfg_from_hf(hf)
        cfg.pop("ffn_dim", None)
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        cfg.update({"_target_": MoEModelConfig._target_, "moe_ffn_dim": hf[layout.ffn_key],
                    "n_experts": hf[layout.n_experts_key], "top_k": hf["num_experts_per_tok"],
                    "attn_head_dim": head_dim, "qk_norm": layout is hf_adapter.QWEN3_MOE,
                    "norm_topk_prob": bool(hf.get("norm_topk_prob", True))})
        return cfg


SPEC = MoESpec()
