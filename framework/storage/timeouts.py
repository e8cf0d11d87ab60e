"""How long a request to an object store may wait (checkpoint.storage_timeout_s), set once in each process that
reads or writes one: the launcher before its checks, every worker before it trains.

S3 (s3fs over botocore): each attempt waits at most the timeout to connect, and then at most the timeout for each
next part of the answer (a large upload that keeps moving is never cut); botocore's "standard" retry mode makes
ATTEMPTS attempts of a request that timed out, lost its connection, was throttled or met a 5xx error, with its own
jittered back-off of a second or two between them. An endpoint that accepts connections and never answers thus
fails a call after about ATTEMPTS x the timeout. The user's own fsspec configuration for s3 is kept, but for these
settings. Other stores (gcsfs, adlfs) keep their libraries' timeouts.
"""
from __future__ import annotations

#: seconds an object-store request waits to connect, or for the next part of an answer (the schema's default)
DEFAULT_TIMEOUT_S = 60.0
#: attempts of each object-store request before the call fails
ATTEMPTS = 3
#: the protocols s3fs serves, and where our class for them is (imported only when a job uses one)
S3_PROTOCOLS = ("s3", "s3a")
S3_CLASS = "framework.storage.s3.S3FileSystem"

_timeout_s: float | None = None


def set_timeout(seconds: float) -> None:
    """Every object-store request of this process from now on waits at most `seconds` an attempt (see the module)."""
    global _timeout_s
    import fsspec.config
    from fsspec.registry import known_implementations, register_implementation, registry
    s3 = dict(fsspec.config.conf.get("s3", {}))
    s3["config_kwargs"] = {**s3.get("config_kwargs", {}), "connect_timeout": seconds, "read_timeout": seconds,
                           "retries": {"mode": "standard", "total_max_attempts": ATTEMPTS}}
    fsspec.config.conf["s3"] = s3
    if any(protocol in registry for protocol in S3_PROTOCOLS):    # s3fs is imported already: ours replaces its class
        from framework.storage.s3 import S3FileSystem
        for protocol in S3_PROTOCOLS:
            register_implementation(protocol, S3FileSystem, clobber=True)
    else:                                                           # imported on first use, as fsspec does s3fs
        error = known_implementations.get("s3", {}).get("err")
        for protocol in S3_PROTOCOLS:
            register_implementation(protocol, S3_CLASS, clobber=True, errtxt=error)
    _timeout_s = seconds


def ensure_set() -> None:
    """The default timeout, where this process set none (a command that reads a bucket without a job's config)."""
    if _timeout_s is None:
        set_timeout(DEFAULT_TIMEOUT_S)
