"""What a mixture-of-experts model adds to a plan: total vs active parameters, the expert weights one
rank holds, and the all-to-all traffic of expert parallelism (zero for a dense model)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from framework.models.spec import spec_for
from framework.plan.comm import block_of
from framework.plan.layout import Layout
from framework.plan.shapes import ParamShape

if TYPE_CHECKING:
    from framework.config.schema import Config


def expert_summary(cfg: Config, shapes: list[ParamShape]) -> dict:
    """{} for a dense model; else parameters (total, active per token) and the expert elements this rank holds."""
    spec = spec_for(cfg.model)
    total, active = spec.num_params(cfg.model), spec.active_params(cfg.model)
    if active == total:
        return {}
    return {"params": total, "active_params": active,
            "expert_params_per_rank": sum(s.numel for s in shapes if s.expert)}


def all_to_all_bytes(cfg: Config, layout: Layout, shapes: list[ParamShape]) -> dict[str, int]:
    """Per rank and step: every routed copy of a token goes to its expert's rank and back (dispatch +
    combine) in forward and again in backward; (ep - 1) / ep of it leaves the rank."""
    if layout.ep <= 1:
        return {}
    layers = len({block_of(s.name) for s in shapes if s.expert} - {None})
    tokens = layout.accumulation * layout.micro_batch * layout.seq_len
    per_token = spec_for(cfg.model).dispatch_elements(cfg.model) * layout.compute_bytes
    return {"ep/all_to_all": int(4 * layers * tokens * per_token * (layout.ep - 1) / layout.ep)}
