"""Where checkpoints and the weights a run starts from live: a local path, or an fsspec URL (s3://bucket/prefix,
gs://, az://, memory:// in tests).

A local path keeps the operating system's own calls (and a save's atomic rename: framework.checkpoint.manager);
a URL goes through fsspec, whose s3fs, gcsfs and adlfs take the endpoint and the credentials from the usual
environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE; GOOGLE_APPLICATION_CREDENTIALS;
AZURE_STORAGE_*). Object stores have no directories and no rename: a "directory" is a key prefix, and
listings are read fresh every time (other ranks and processes write under the same prefix).

What is a URL is said once, here (`is_url`, and `url_problem` for a value the user gave); how long a request may
wait, in framework.storage.timeouts.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import uuid

from framework.storage.timeouts import ensure_set

#: a URL's protocol (RFC 3986's scheme); fsspec chains them with "::" (simplecache::s3://bucket/prefix)
PROTOCOL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
#: the start of a URL with its "//" missing (s3:/bucket, s3:bucket)
HALF_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(?!//)")


class StorageError(OSError):
    """A URL that cannot be used: no such bucket, no access, no such endpoint, a protocol without its package."""


def is_url(path: str | None) -> bool:
    return bool(path) and "://" in str(path)


def url_problem(value: str) -> str | None:
    """Why `value`, given where a local path or a URL is taken, is neither, or None. A URL has protocols fsspec knows
    (their packages installed), no blank, and the bucket (container, host) of a store whose paths begin with one.
    A value that starts like a URL of a known protocol but lacks its "//" (s3:/bucket) is refused too: it would be
    a local directory named "s3:"."""
    import fsspec
    text = str(value)
    known = fsspec.available_protocols()
    if not is_url(text):
        half = HALF_URL.match(text)
        if half and half.group(1).lower() in known:
            return (f"{text} is not a URL: write {half.group(1)}://BUCKET/prefix (a local directory named so: "
                    f"./{text})")
        return None
    if any(c.isspace() for c in text) or not text.isprintable():
        return f"{text!r}: a URL holds no blanks or control characters"
    protocols, _, rest = text.partition("://")
    for name in protocols.split("::"):
        if not PROTOCOL.fullmatch(name):
            return f"{text}: {f'{name!r} is not a protocol' if name else 'no protocol before ://'}; {_URL_EXAMPLES}"
        if name not in known:
            lower = f" (protocols are lower case: {name.lower()}://)" if name.lower() in known else ""
            return f"{text}: fsspec knows no protocol {name!r}{lower}; {_URL_EXAMPLES}"
    try:
        cls = fsspec.get_filesystem_class(name)
    except ImportError as e:         # a protocol whose package is missing
        extra = PROTOCOL_EXTRAS.get(name)
        return f"{text}: " + (f"{name}:// needs s3fs, which is not installed: pip install 'framework[{extra}]'"
                              if extra else _first_line(e))
    if cls.root_marker == "" and not rest.split("/", 1)[0]:      # its paths begin with a bucket, container or host
        return f"{text}: no bucket (container, host) after {name}://; write {name}://BUCKET/prefix"
    return None


#: protocols whose file system one of the framework's extras installs (pyproject.toml)
PROTOCOL_EXTRAS = {"s3": "s3", "s3a": "s3"}
_URL_EXAMPLES = "give a local path or a URL such as s3://BUCKET/prefix, gs://BUCKET/prefix, az://CONTAINER/prefix"


def join(path: str, *parts: str) -> str:
    if is_url(path):
        return "/".join([str(path).rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(path, *parts)


def parent(path: str) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[0] if is_url(path) else os.path.dirname(os.path.abspath(path))


def _fs(url: str):
    """(fsspec file system, its path for `url`)."""
    from fsspec.core import url_to_fs
    ensure_set()
    # Under Hydra's INFO logging the S3 client would say which endpoint it found on every run
    for name in ("botocore", "aiobotocore", "s3fs"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))
    try:
        return url_to_fs(url)
    except (ImportError, ValueError) as e:      # a protocol whose package is missing, or none fsspec knows
        raise StorageError(f"{url}: {str(e).splitlines()[0]}") from None


def _fresh(url: str):
    fs, path = _fs(url)
    fs.invalidate_cache(path)
    return fs, path


def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    fs, p = _fresh(path)
    return fs.exists(p)


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    fs, p = _fresh(path)
    return fs.isfile(p)


def isdir(path: str) -> bool:
    """A local directory, or a URL prefix holding at least one object."""
    if not is_url(path):
        return os.path.isdir(path)
    fs, p = _fresh(path)
    return fs.isdir(p)


def listdir(path: str) -> list[str]:
    """Names directly under `path` (none where it does not exist)."""
    if not is_url(path):
        return os.listdir(path) if os.path.isdir(path) else []
    fs, p = _fresh(path)
    try:
        return sorted({entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(p, detail=False)} - {""})
    except FileNotFoundError:
        return []


def file_sizes(path: str) -> dict[str, int]:
    """{path relative to `path`: bytes} of every file below it."""
    if not is_url(path):
        sizes = {}
        for folder, _, names in os.walk(path):
            for name in names:
                full = os.path.join(folder, name)
                sizes[os.path.relpath(full, path)] = os.path.getsize(full)
        return sizes
    fs, p = _fresh(path)
    found = fs.find(p, detail=True)
    return {name[len(p.rstrip("/")) + 1:]: int(info["size"]) for name, info in found.items()
            if info.get("type") != "directory"}


def size(path: str) -> int:
    if not is_url(path):
        return os.path.getsize(path)
    fs, p = _fresh(path)
    return int(fs.size(p))


def modified(path: str) -> float:
    """When the file was last written (seconds since the epoch)."""
    if not is_url(path):
        return os.path.getmtime(path)
    fs, p = _fs(path)
    return fs.modified(p).timestamp()


def open_read(path: str):
    if not is_url(path):
        return open(path, "rb")
    fs, p = _fs(path)
    return fs.open(p, "rb")


def read_bytes(path: str) -> bytes:
    with open_read(path) as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode()


def write_bytes(path: str, data: bytes) -> None:
    """The whole file; a local one reaches the disk (fsync) before this returns."""
    if is_url(path):
        fs, p = _fs(path)
        with fs.open(p, "wb") as f:
            f.write(data)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode())


def makedirs(path: str) -> None:
    """A local directory; nothing on an object store, whose prefixes exist once an object is under them."""
    if not is_url(path):
        os.makedirs(path, exist_ok=True)


def remove_tree(path: str, first: str | None = None) -> None:
    """Delete `path` and everything below it; `first` (a file under it) goes before the rest, so that what
    marks it complete disappears before any of its data does."""
    if first is not None and isfile(join(path, first)):
        if is_url(path):
            fs, p = _fs(join(path, first))
            fs.rm(p)
        else:
            os.remove(join(path, first))
    if not is_url(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    fs, p = _fresh(path)
    if fs.exists(p):
        fs.rm(p, recursive=True)


def check_writable(url: str) -> None:
    """Write and delete one small object under `url`, so a bucket that does not exist, refuses access or sits
    behind an unreachable endpoint is refused before any work (StorageError, one line)."""
    probe = join(url, f".framework-write-check-{uuid.uuid4().hex[:12]}")
    try:
        write_bytes(probe, b"")
        fs, p = _fs(probe)
        fs.rm(p)
    except StorageError:
        raise
    except FileNotFoundError:
        raise StorageError(f"{url}: no such bucket or container") from None
    except PermissionError as e:
        raise StorageError(f"{url}: access denied ({_first_line(e)})") from None
    except Exception as e:    # an endpoint that does not answer, credentials the store refuses, ...
        raise StorageError(f"{url}: cannot write there ({type(e).__name__}: {_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def local_copy(url: str) -> str:
    """A local directory holding the files under `url`, downloaded once per machine and user into a cache dir (for
    what reads local files only: safetensors' memory maps); a local path is returned as it is."""
    if not is_url(url):
        return url
    files = file_sizes(url)
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "framework", "downloads")
    # named after the URL and what is there now: new files under the same URL are downloaded again
    target = os.path.join(cache, hashlib.sha256(repr((url, sorted(files.items()))).encode()).hexdigest()[:16])
    if os.path.isdir(target):
        return target
    os.makedirs(cache, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".download-", dir=cache)
    try:
        for rel in files:
            dest = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(read_bytes(join(url, rel)))
        try:
            os.rename(tmp, target)       # another process of this machine may have been first: keep its copy
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
