"""What is a URL is one rule (framework.storage.url_problem): a key that takes a path or a URL (checkpoint.dir,
checkpoint.resume, checkpoint.initial_load) is refused in one line, before any work, when its value is neither; a
data key that takes a local path is refused when given a URL. `checkpoint.dir=s3://` used to become a local
directory `./s3:/` (the job trained into it, or failed after training without credentials)."""
import pytest

from framework import storage
from framework.errors import ConfigError
from framework.strategies.registry import strategy_class
from tests.harness.helpers import FAST, derive_and_validate
from tests.harness.servers import forget_s3_file_systems, refused

BAD = [
    ("s3://", "s3://: no bucket (container, host) after s3://; write s3://BUCKET/prefix"),
    ("s3:///run", "s3:///run: no bucket (container, host) after s3://; write s3://BUCKET/prefix"),
    ("s3:/bucket/run", "s3:/bucket/run is not a URL: write s3://BUCKET/prefix (a local directory named so: "
                       "./s3:/bucket/run)"),
    ("s3:bucket", "s3:bucket is not a URL: write s3://BUCKET/prefix (a local directory named so: ./s3:bucket)"),
    ("://bucket/run", "://bucket/run: no protocol before ://; give a local path or a URL such as s3://BUCKET/prefix"),
    ("nosuch://bucket/run", "nosuch://bucket/run: fsspec knows no protocol 'nosuch'; give a local path"),
    ("S3://bucket/run", "S3://bucket/run: fsspec knows no protocol 'S3' (protocols are lower case: s3://)"),
    ("s3://my bucket/run", "'s3://my bucket/run': a URL holds no blanks or control characters"),
    ("s3://bucket/run\n", "'s3://bucket/run\\n': a URL holds no blanks or control characters"),
    ("simplecache::s3://", "simplecache::s3://: no bucket (container, host) after s3://"),
]
GOOD = ["s3://bucket/run", "s3://bucket", "memory://", "memory://fw/run", "file:///tmp/run", "simplecache::s3://b/run",
        "run/checkpoints", "/abs/run", "./s3:/x", "auto", "run:2"]


@pytest.mark.parametrize("value,said", BAD)
def test_a_value_that_is_neither_a_path_nor_a_usable_url_is_named(value, said):
    assert storage.url_problem(value).startswith(said)


@pytest.mark.parametrize("value", GOOD)
def test_paths_and_well_formed_urls_pass(value):
    assert storage.url_problem(value) is None


def test_a_protocol_whose_package_is_missing_says_which():
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed here")
    except ImportError:
        pass
    assert storage.url_problem("gs://bucket/run") == "gs://bucket/run: Please install gcsfs to access Google Storage"


@pytest.mark.parametrize("credentials", [True, False], ids=["with credentials", "without"])
def test_a_bucketless_checkpoint_dir_is_one_line_and_exit_2_before_any_work(credentials, s3_env, monkeypatch, tmp_path,
                                                                             compose_config):
    """Where a bucket could be reached and where none could: the same line, and no local `s3:` directory."""
    for key, value in s3_env.items():
        if credentials:
            monkeypatch.setenv(key, value)
        else:
            monkeypatch.delenv(key, raising=False)
    forget_s3_file_systems()
    monkeypatch.chdir(tmp_path)
    cfg = compose_config([*FAST, "parallel=single", "checkpoint.enabled=true", "checkpoint.dir=s3://"])
    assert refused(cfg, tmp_path / "run") == [
        "error: checkpoint.dir: s3://: no bucket (container, host) after s3://; write s3://BUCKET/prefix"]
    assert not (tmp_path / "s3:").exists()


@pytest.mark.parametrize("key", ["checkpoint.dir", "checkpoint.resume", "checkpoint.initial_load"])
@pytest.mark.parametrize("value", ["s3://", "s3:/bucket/x", "://x", "s3://my bucket/x"])
def test_every_key_that_takes_a_url_refuses_a_bad_one_naming_itself(key, value, compose_config):
    cfg = compose_config([*FAST, "parallel=single", f"{key}='{value}'"])
    with pytest.raises(ConfigError) as refusal:
        derive_and_validate(cfg, 1, strategy_class("single"))
    assert str(refusal.value) == f"{key}: {storage.url_problem(value)}"


@pytest.mark.parametrize("key,source", [("data.path", "text"), ("data.cache_dir", "jsonl"),
                                        ("data.tokenizer", "jsonl")])
def test_a_data_key_that_takes_a_local_path_refuses_a_url(key, source, compose_config, tmp_path):
    """Data is opened, memory-mapped and prepared on the local file system: a URL there would be read (or made, for
    data.cache_dir) as a local path named after it."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a"}\n')
    args = {"data.path": str(corpus), "data.tokenizer": "bytes", key: "s3://bucket/x"}
    if source == "text":
        args.pop("data.tokenizer")
    cfg = compose_config([*FAST, f"data={source}", *(f"{k}={v}" for k, v in args.items())])
    with pytest.raises(ConfigError) as refusal:
        derive_and_validate(cfg, 1, strategy_class("single"))
    assert str(refusal.value) == f"{key}: s3://bucket/x: takes a local path, not a URL; copy the files down first"
