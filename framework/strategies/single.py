from framework.config.schema import Config
from framework.strategies.torch_strategy import TorchStrategy, TorchTraits
from framework.strategies.traits import AutoLayout


class SingleTraits(TorchTraits):
    """What parallel=single declares for the launcher, validation and the planner."""
    name = "single"
    needs_process_group = False
    precisions = ("fp32", "bf16", "fp16", "float8")
    activation_checkpointing = ("none", "full", "layer", "op")
    zero_support = {0: None,
                    1: "sharding needs several ranks: use parallel=ddp (stage1), fsdp or deepspeed",
                    2: "sharding needs several ranks: use parallel=fsdp or deepspeed",
                    3: "sharding needs several ranks: use parallel=fsdp or deepspeed"}
    machinery = 0
    adapter_base_dtypes = ("float32", "bfloat16", "float8", "nf4")

    @classmethod
    def auto_layouts(cls, cfg: Config, world_size: int, per_node: int) -> list[AutoLayout]:
        return [AutoLayout(zero=0)] if world_size == 1 else []

    @classmethod
    def check(cls, cfg: Config, world_size: int) -> None:
        if world_size != 1:
            from framework.errors import ConfigError
            raise ConfigError("launcher.nproc_per_node",
                              f"parallel=single runs one process, not {world_size}; use parallel=ddp for several")


class SingleDeviceStrategy(SingleTraits, TorchStrategy):
    """One process, one device: the reference every parallel layout is checked against."""
