"""A checkpoint saved before a model key existed reads that key as its schema default."""
import json

import pytest

from framework.checkpoint.compat import check_compatible, fingerprint
from framework.checkpoint.names import FORMAT_VERSION, META, STATE, CheckpointError


def _checkpoint(tmp_path, fp):
    (tmp_path / STATE).mkdir()
    (tmp_path / STATE / "shard").write_text("x")
    (tmp_path / META).write_text(json.dumps({"version": FORMAT_VERSION, "format": "dcp", "parallel": "single",
                                             "step": 4, "fingerprint": fp}))
    return str(tmp_path)


def test_a_key_added_since_the_save_reads_as_its_default(tmp_path, compose_config):
    cfg = compose_config(["model=tiny"])
    old = fingerprint(cfg)
    del old["model"]["rope_scaling"]            # saved by a version without model.rope_scaling
    path = _checkpoint(tmp_path, old)
    check_compatible(path, cfg, "dcp")
    scaled = compose_config(["model=tiny", "model.rope_scaling.rope_type=llama3"])
    with pytest.raises(CheckpointError, match="model.rope_scaling"):
        check_compatible(path, scaled, "dcp")
