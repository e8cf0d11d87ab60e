"""model=hf, and the chat recipes and `prepare --chat-template` (transformers renders chat templates), without
transformers installed: one line naming the key and the `hf` extra, exit 2, before any worker starts or run dir
or dataset is made. model=hf hides transformers alone (a sitecustomize); the chat jobs run in README's
environment (tests/harness/readme_env.py: no extra installed)."""
import json
import os
import time

import pytest

from framework.data.assets import path as asset_path
from tests.harness import readme_env
from tests.harness.helpers import FAST, run_framework

NO_TRANSFORMERS = "import sys\nsys.modules['transformers'] = None   # `import transformers` raises ImportError\n"


def test_model_hf_without_transformers_names_the_extra(tmp_path):
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "sitecustomize.py").write_text(NO_TRANSFORMERS)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "shim"), os.environ.get("PYTHONPATH", "")])}
    args = [*(a for a in FAST if a != "model=tiny"), "model=hf", f"model.config={tmp_path / 'config.json'}",
            "parallel=fsdp", "launcher.nproc_per_node=2"]
    proc = run_framework(args, tmp_path / "run", env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: model: model=hf needs the transformers package, which is not installed; "
                     "pip install 'framework[hf]'"], proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()


CHAT_JOBS = {
    "sft_tiny": ["+recipe=sft_tiny"],
    "lora_tiny": ["+recipe=lora_tiny"],
}


@pytest.mark.parametrize("recipe", CHAT_JOBS)
def test_a_chat_recipe_in_readmes_environment_names_the_extra_and_leaves_nothing(tmp_path, recipe):
    """README's set-up installs no extra; the chat recipes render ChatML through transformers: one line naming
    the key and the extra, exit 2, in seconds, no run dir and no dataset (nor its .partial folder) in the cache."""
    env = {**readme_env.environment(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    started = time.monotonic()
    proc = run_framework([*CHAT_JOBS[recipe], "trainer.max_steps=2"], tmp_path / "run", env=env, cwd=tmp_path,
                         timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: data.chat_template: chat templates are rendered by transformers, which is not installed: "
        "pip install 'framework[hf]'"], proc.stderr[-3000:]
    assert time.monotonic() - started < 60
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_prepare_with_a_chat_template_in_readmes_environment_names_the_extra_and_leaves_nothing(tmp_path):
    env = readme_env.environment()
    started = time.monotonic()
    proc = run_framework(["--input", str(asset_path("tiny_chat.jsonl")), "--tokenizer", "bytes", "--chat-template",
                          "chatml", "--out", "data/chats"], module="framework.data.prepare", env=env, cwd=tmp_path,
                         timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: --chat-template chatml: chat templates are rendered by transformers, which is not installed: "
        "pip install 'framework[hf]'"], proc.stderr[-3000:]
    assert time.monotonic() - started < 60
    assert not os.listdir(tmp_path)


def test_generate_on_a_chat_checkpoint_in_readmes_environment_names_the_extra(tmp_path, sft_run):
    """The checkpoint's chat template renders the prompt through transformers: one line naming the extra (and
    --raw, which needs none), exit 2."""
    step = sft_run / "checkpoints" / "step_00000001"
    env = readme_env.environment()
    proc = run_framework([str(step), "--prompt", "What is 2 plus 3?"], module="framework.generate", env=env,
                         cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {step}: its chat template is rendered by transformers, which is not installed: pip install "
        f"'framework[hf]' (or --raw: continue the prompt as plain text)"], proc.stderr[-3000:]
    raw = run_framework([str(step), "--prompt", "What is", "--raw", "--max-new-tokens", "4"],
                        module="framework.generate", env=env, cwd=tmp_path, timeout=120)
    assert raw.returncode == 0 and raw.stdout.startswith("What is"), raw.stderr[-3000:]
