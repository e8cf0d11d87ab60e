from framework.data.sources import load_tokens
from framework.data.batches import GlobalBatchSampler

__all__ = ["load_tokens", "GlobalBatchSampler"]
