"""Fill the data section from prepared datasets' manifests, in the launching process before validation
(after the source's own resolve: a source that tokenizes at launch prepares its dataset there).

A prepared dataset knows its vocabulary, EOS id and tokenizer; the user should not have to repeat them.
data.vocab_size, data.eos_id and data.tokenizer come from the manifest. For every source that says so
(vocab_from_data: tokens, megatron, mix) model.vocab_size follows data.vocab_size unless it was given on the
command line (a smaller one is then refused by validation); the byte-level sources keep the model's own.
"""
from __future__ import annotations

import os

from framework.errors import ConfigError
from framework.data import token_dataset
from framework.data.sources import source_of
from framework.data.tokenizer import TOKENIZER_FILE


def apply_dataset_manifests(cfg, model_vocab_given: bool) -> None:
    source = source_of(cfg.data)
    source.resolve(cfg.data)
    _apply_manifests(cfg.data, source.dataset_dirs(cfg.data))
    if source.vocab_from_data and not model_vocab_given and "vocab_size" in cfg.model:
        cfg.model.vocab_size = cfg.data.vocab_size


def _apply_manifests(data_cfg, dataset_dirs: list[tuple[str, str]]) -> None:
    found = []
    for key, path in dataset_dirs:
        try:
            found.append((key, path, token_dataset.read_manifest(path)))
        except token_dataset.DatasetError as e:
            raise ConfigError(key, str(e)) from None
    if not found:
        return
    first_key, first_path, first = found[0]
    for key, path, manifest in found[1:]:
        if manifest.get("tokenizer_sha256") != first.get("tokenizer_sha256"):
            raise ConfigError(key, f"{path} was tokenized with another tokenizer than {first_path}; "
                                   f"a mixture needs one vocabulary")
    data_cfg.vocab_size = first["vocab_size"]
    data_cfg.eos_id = first["eos_id"]
    data_cfg.tokenizer = os.path.abspath(os.path.join(first_path, first.get("tokenizer", TOKENIZER_FILE)))


def given_on_command_line(key: str) -> bool:
    """Whether a Hydra override of this run sets `key` (so a default may not replace it)."""
    from hydra.core.hydra_config import HydraConfig
    if not HydraConfig.initialized():
        return False
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in HydraConfig.get().overrides.task)
