from framework.strategies.base import TorchStrategy


class SingleDeviceStrategy(TorchStrategy):
    """One process, one device: the reference every parallel layout is checked against."""
    name = "single"
    needs_process_group = False
    precisions = ("fp32", "bf16", "fp16", "float8")
    activation_checkpointing = ("none", "full", "layer", "op")
    zero_support = {0: None,
                    1: "sharding needs several ranks: use parallel=ddp (stage1), fsdp or deepspeed",
                    2: "sharding needs several ranks: use parallel=fsdp or deepspeed",
                    3: "sharding needs several ranks: use parallel=fsdp or deepspeed"}

    @classmethod
    def check(cls, cfg, world_size: int) -> None:
        if world_size != 1:
            from framework.errors import ConfigError
            raise ConfigError("launcher.nproc_per_node",
                              f"parallel=single runs one process, not {world_size}; use parallel=ddp for several")
