"""precision.store_dtype=bfloat16 as whole jobs: fsdp zero3 x2 (each rank materialises its shards of the bf16
parameters) gives single's run of the same mode (tests/harness/parity.py kind bf16-params), both save bf16
parameters and no fp32 copy, the planner's model-state bytes equal what rank 0 measured, and the export writes the
checkpoint's bf16 values as they are. torch's AdamW steps here (no compile); optimizer=adamw_bf16 is held to
torchao by tests/unit/optim/test_adamw_bf16.py."""
import json

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from framework.checkpoint.names import STATE
from framework.export.read import read_dcp
from tests.harness.helpers import assert_planned_model_states, check_ok, run_framework, train_run
from tests.harness.parity import assert_parity, final_checkpoint, parity_kind

BF16_PARAMS = ["precision=bf16", "precision.store_dtype=bfloat16"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bf16_params")
    return {"single": train_run(tmp, "single", [*BF16_PARAMS, "parallel=single"]),
            "fsdp": train_run(tmp, "fsdp", [*BF16_PARAMS, "parallel=fsdp", "zero=stage3",
                                            "launcher.nproc_per_node=2"])}


def test_fsdp_gives_single_run(runs):
    assert parity_kind(BF16_PARAMS) == "bf16-params"
    assert_parity(runs["fsdp"], runs["single"])


@pytest.mark.parametrize("layout", ["single", "fsdp"])
def test_states_are_bf16_and_planned(runs, layout):
    metrics = [json.loads(line) for line in (runs[layout] / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1].get("master_param_bytes", 0) == 0
    assert_planned_model_states(runs[layout])
    step_dir = final_checkpoint(runs[layout])
    entries = FileSystemReader(str(step_dir / STATE)).read_metadata().state_dict_metadata
    dtypes = {meta.properties.dtype for key, meta in entries.items() if key.startswith("model.")}
    assert dtypes == {torch.bfloat16}


def test_export_writes_the_bf16_values(runs, tmp_path):
    step_dir = final_checkpoint(runs["single"])
    out = tmp_path / "hf"
    check_ok(run_framework([str(step_dir), str(out)], module="framework.export"))
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(out / "model.safetensors")
    assert config["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    # the checkpoint's values, each one, in the HF layout (renamed, q and k rows reordered): compared as sorted lists
    exported = torch.cat([t.float().flatten() for t in tensors.values()]).sort().values
    trained = torch.cat([t.flatten() for t in read_dcp(str(step_dir)).values()]).sort().values
    assert torch.equal(exported, trained)
