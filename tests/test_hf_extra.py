"""model=hf without transformers installed (hidden from import by a sitecustomize) is one line naming the
`hf` extra, exit 2, before any worker starts or run dir is made."""
import json
import os

from tests.helpers import FAST, run_framework

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
