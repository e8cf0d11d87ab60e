"""Blocks alike cost alike: the planner traces a model shortened to a few whole periods of blocks (a period
is what layer-wise checkpointing repeats: every_n_layers blocks, else one) and extends what one period
costs to the rest, so a 126-layer model is traced in seconds. A model whose spec cannot shorten it, or
that is already this short, is traced whole."""
from __future__ import annotations

from omegaconf import OmegaConf
from typing import TYPE_CHECKING

from framework.models.spec import spec_for

if TYPE_CHECKING:
    from framework.config.schema import Config


def period(cfg: Config) -> int:
    """Blocks per repeating unit of the job: every_n_layers under layer-wise checkpointing, else 1."""
    ac = cfg.activation_checkpointing
    return (ac.get("every_n_layers") or 1) if ac.mode == "layer" else 1


def periods(cfg: Config) -> int:
    """Whole periods in the model; 0 where it cannot be shortened (traced whole then)."""
    spec = spec_for(cfg.model)
    layers = spec.num_layers(cfg.model) if spec.supports_pipeline else 0
    return 0 if layers % period(cfg) else layers // period(cfg)


def shortened(cfg: Config, n_periods: int):
    """cfg with `n_periods` periods of blocks, or None where its spec cannot shorten it or it has no more."""
    if periods(cfg) <= n_periods:
        return None
    fewer = spec_for(cfg.model).with_layers(cfg.model, n_periods * period(cfg))
    if fewer is None:
        return None
    short = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    short.model = fewer
    return short
