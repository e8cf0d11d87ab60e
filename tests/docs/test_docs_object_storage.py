"""docs/how-to/object-storage.md: its commands run as written, in order, from a directory outside the checkout
(the training runs shortened to 2 steps), against the session's S3 server standing in for the page's endpoint, in
README's environment plus the s3 extra the page installs."""
import os
import sys

from framework import storage
from tests.harness.helpers import REPO, check_ok, run_in_own_session
from tests.harness.docs_commands import environment, run_by
from tests.harness.servers import make_bucket


def test_the_pages_commands_save_resume_export_and_keep_the_best(s3_here, tmp_path):
    make_bucket(s3_here, "my-bucket")
    save, resume, export, best = commands = run_by(__file__)
    said = {}
    for command in commands:
        args = command.text.split()[2:]
        shorten = ["trainer.max_steps=2"] if args[0] == "framework" else []
        proc = run_in_own_session([sys.executable, "-m", *args, *shorten], cwd=tmp_path, timeout=600,
                                  env={**os.environ, **environment(command, {"PYTHONPATH": str(REPO)}),
                                       "PYTHONUNBUFFERED": "1", **s3_here})
        check_ok(proc)
        said[command] = proc.stdout
    assert storage.listdir("s3://my-bucket/tiny") == ["step_00000002"]
    assert "already complete: s3://my-bucket/tiny/step_00000002" in said[resume]    # shortened: nothing left to do
    assert said[export].startswith("wrote ./tiny-hf from s3://my-bucket/tiny/step_00000002")
    assert (tmp_path / "tiny-hf" / "model.safetensors").is_file()
    assert storage.listdir("s3://my-bucket/best") == ["step_00000002"]
    assert storage.read_text("s3://my-bucket/best/step_00000002/meta.json").count('"val_loss"') == 1
