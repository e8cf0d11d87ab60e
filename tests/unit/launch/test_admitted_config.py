"""After admission the job's config is read, never edited (framework/launch/admission.py sets it read-only before
config.yaml is written; framework/train/worker.py sets the config a worker receives read-only too): a write
raises. The whole suite, whose combination matrix runs every strategy and option, is what holds that nothing
writes after admission; this shows the worker gets the admitted config already frozen, and any write fails."""
import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from framework.launch import admission
from framework.train import worker
from tests.harness.helpers import FAST


def test_the_worker_trains_on_the_admitted_config_read_only(compose_config, tmp_path, monkeypatch):
    seen = {}
    trained = worker._run

    def run(cfg, run_dir, on_record, says_refusals):
        seen["read_only"] = OmegaConf.is_readonly(cfg)
        with pytest.raises(ReadonlyConfigError):
            cfg.trainer.max_steps = 5
        trained(cfg, run_dir, on_record, says_refusals)

    monkeypatch.setattr(worker, "_run", run)
    cfg = compose_config([*FAST, "parallel=single", "trainer.max_steps=1"])
    admission.run(cfg, str(tmp_path / "run"))
    assert seen == {"read_only": True}
    assert (tmp_path / "run" / "config.yaml").is_file()


def test_a_spawned_workers_rebuilt_config_is_read_only_too(monkeypatch):
    seen = []
    monkeypatch.setattr(worker, "_run", lambda cfg, *rest: seen.append(OmegaConf.is_readonly(cfg)))
    worker.run_worker(OmegaConf.create("checkpoint: {storage_timeout_s: 60.0}\ntrainer: {deterministic: false}\n"),
                      "unused")
    assert seen == [True]


def test_admission_validates_a_read_only_config_which_its_derivations_completed(compose_config, monkeypatch):
    """validate writes nothing: admission hands it the config already read-only, after the named derivations
    filled in what the resolved config shows (here the micro batch)."""
    seen = {}
    checked = admission.validate

    def validate(cfg, *args, **kwargs):
        seen["read_only"] = OmegaConf.is_readonly(cfg)
        seen["micro_batch_size"] = cfg.trainer.micro_batch_size
        checked(cfg, *args, **kwargs)

    monkeypatch.setattr(admission, "validate", validate)
    cfg = compose_config([*FAST, "parallel=single", "trainer.global_batch_size=4",
                          "trainer.micro_batch_size=null"])
    assert cfg.trainer.micro_batch_size is None
    admission.admit(cfg, explicit=set())
    assert seen == {"read_only": True, "micro_batch_size": 4}
