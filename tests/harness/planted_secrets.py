"""Secrets a test plants in a job (a password in the MLflow URL of its command line, secrets in its environment),
and the search for them in whatever the job wrote or printed (tests/integration/launch/test_secrets.py,
tests/integration/launch/test_ray_engine.py)."""
from __future__ import annotations

import base64
import uuid
from pathlib import Path

USER = "fwuser"
PASSWORD = f"pw{uuid.uuid4().hex}"
ENV_SECRET = f"env{uuid.uuid4().hex}"
#: every form a leak could take: the password, the environment's secret, and HTTP basic auth's header value
MARKERS = (PASSWORD, ENV_SECRET, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
SHOWN = f"{USER}:***@"


def with_password(uri: str) -> str:
    """http://host:port -> http://USER:PASSWORD@host:port"""
    scheme, _, rest = uri.partition("://")
    return f"{scheme}://{USER}:{PASSWORD}@{rest}"


def redacted_uri(uri: str) -> str:
    scheme, _, rest = uri.partition("://")
    return f"{scheme}://{SHOWN}{rest}"


def wandb_offline(home: Path) -> dict:
    """W&B offline, with every folder of its own under `home` (so that those files are searched too)."""
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CACHE_DIR": str(home / "wandb_cache"),
            "WANDB_CONFIG_DIR": str(home / "wandb_config"), "WANDB_DATA_DIR": str(home / "wandb_data")}


def planted_env(s3_env: dict, home: Path) -> dict:
    """The job's environment: the S3 server's (its secret key a marker: the bucket accepts any), another secret,
    W&B offline (wandb_offline)."""
    return {**s3_env, "AWS_SECRET_ACCESS_KEY": ENV_SECRET, "FRAMEWORK_TEST_SECRET_TOKEN": ENV_SECRET,
            **wandb_offline(home)}


def files_under(*roots: Path) -> dict[str, bytes]:
    """Path -> contents of every regular file under `roots`."""
    found = {}
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file() and not path.is_symlink():
                try:
                    found[str(path)] = path.read_bytes()
                except OSError:        # a socket or a file gone meanwhile
                    pass
    return found


def bucket_objects(s3_env: dict, bucket: str) -> dict[str, bytes]:
    """s3://bucket/key -> contents of every object in the tests' S3 bucket."""
    import boto3
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name=s3_env["AWS_DEFAULT_REGION"],
                          aws_access_key_id=s3_env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=s3_env["AWS_SECRET_ACCESS_KEY"])
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            found[f"s3://{bucket}/{item['Key']}"] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


def leaks(contents: dict[str, bytes | str]) -> list[str]:
    """'<where>: <marker>' for each marker found (an empty list: nothing leaked)."""
    out = []
    for where, data in contents.items():
        data = data.encode() if isinstance(data, str) else data
        out += [f"{where}: {marker}" for marker in MARKERS if marker.encode() in data]
    return out
