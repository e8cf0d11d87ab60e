"""Credentials inside values are never written or printed: `redacted` hides them on the way out (config files,
tracker parameters, console lines, error messages), and the config itself keeps them for the clients that need
them (a tracker's, a bucket's).

What counts as a credential: the password of a URL (`scheme://user:PASSWORD@host...`, shown `user:***@host`),
the lone user part of a web URL (`https://TOKEN@host`, shown `https://***@host`: how git and many HTTP clients
carry an access token; an ssh URL's `git@host` is a name and stays) and the value of a URL query parameter whose
name says it is one (`?token=`, `&X-Amz-Signature=`, `key=`...).
A leaf: imports nothing of the package.
"""
from __future__ import annotations

import logging
import os
import re
from urllib.parse import unquote, urlsplit, urlunsplit

SHOWN = "***"
# scheme://user:password@ -- neither part holds a '/' (a URL's authority ends at one), so an '@' in a path after a
# port is not mistaken for one;
# Hydra's records of a sweep's overrides escape each ':' (http\://user\:password@host)
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*\\?://[^\s/?#@:\\]*)(?P<colon>\\?:)(?P<secret>[^\s@/?#]*)@")
# https://TOKEN@host -- http(s) and ws(s) only: there a user part without a password is a bearer token
_LONE_USER = re.compile(r"(?P<head>\b(?:https?|wss?)\\?://)(?P<secret>[^\s/?#@:\\]+)@", re.IGNORECASE)
_QUERY = re.compile(r"(?P<head>[?&;][^=&#\s]*(?:token|key|secret|password|passwd|pwd|signature|sig|credential|auth)"
                    r"[^=&#\s]*=)(?P<secret>[^&#\s]+)", re.IGNORECASE)


def redacted(value):
    """`value` with every credential replaced by ***: a string, or the strings inside a dict / list / tuple
    (keys kept); anything else as it is."""
    if isinstance(value, str):
        value = _USERINFO.sub(rf"\g<head>\g<colon>{SHOWN}@", value)
        return _QUERY.sub(rf"\g<head>{SHOWN}", _LONE_USER.sub(rf"\g<head>{SHOWN}@", value))
    if isinstance(value, dict):
        return {key: redacted(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redacted(item) for item in value)
    return value


def redacted_yaml(cfg) -> str:
    """A config, resolved, as YAML with its credentials redacted: what a config.yaml a run writes holds."""
    from omegaconf import OmegaConf
    return OmegaConf.to_yaml(OmegaConf.create(redacted(OmegaConf.to_container(cfg, resolve=True))))


def has_credentials(value: str) -> bool:
    return isinstance(value, str) and redacted(value) != value


def without_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """(the URL without `user:password@`, the user, the password), decoded; (url, None, None) where it has none."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    host = parts.netloc.rpartition("@")[2]
    return (urlunsplit(parts._replace(netloc=host)), unquote(parts.username or ""),
            None if parts.password is None else unquote(parts.password))


def redact_files(paths) -> None:
    """Rewrite each of these text files (those that exist) with its credentials redacted, in one rename."""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        if redacted(text) != text:
            with open(f"{path}.redacted", "w", encoding="utf-8") as f:
                f.write(redacted(text))
            os.replace(f"{path}.redacted", path)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts every record's message (Hydra's own lines name the command line's
    overrides: conf/hydra/*_logging/redacted.yaml put it on the console handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = redacted(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True


class RedactingStream:
    """A text stream writing through another with credentials redacted: Hydra prints a bad override, value and
    all, on stderr itself (`To append to your config use +key=value`)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(redacted(text))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

