"""Checkpoints that only the holder of a key could have written: meta.json signed with HMAC-SHA256.

The CRC-32 manifest finds damage, not tampering: whoever can write a checkpoint's files can rewrite its
meta.json, and CRC-32 is linear (four chosen bytes give any file any CRC). With a key in the environment
variable FRAMEWORK_CHECKPOINT_KEY:
- a save records the SHA-256 of every file in meta.json's manifest and signs meta.json: its "signature" is
  the HMAC-SHA256, under the key, of the canonical JSON of everything else in it (keys sorted, compact);
- a resume (the launching process's check and every worker), an export and generation refuse a checkpoint
  that is unsigned, signed under another key or edited since, or has a file whose SHA-256 differs from the
  signed one or that the signed manifest does not list, before any of its bytes are unpickled.
Without the variable nothing is signed or verified: a signed checkpoint loads as any other (CRC-32 checked).

The key is read from the environment only: no config key holds it, so it never reaches config.yaml, the
logs or a tracker, and nothing here prints it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os

KEY_ENV = "FRAMEWORK_CHECKPOINT_KEY"
MIN_KEY_CHARS = 32
SIGNATURE = "signature"
KEY_ADVICE = "e.g. the 64 characters of `python -c \"import secrets; print(secrets.token_hex(32))\"`"


class SigningKeyError(ValueError):
    """FRAMEWORK_CHECKPOINT_KEY is set to something that is not a usable key (`reason`: what is wrong)."""

    @property
    def reason(self) -> str:
        return self.args[0]

    def __str__(self) -> str:
        return f"{KEY_ENV}: {self.reason}"


def signing_key() -> bytes | None:
    """The key, or None when FRAMEWORK_CHECKPOINT_KEY is not set."""
    value = os.environ.get(KEY_ENV)
    if value is None:
        return None
    if len(value) < MIN_KEY_CHARS:
        raise SigningKeyError(f"holds {len(value)} characters; a signing key needs at least {MIN_KEY_CHARS} "
                              f"({KEY_ADVICE})")
    return value.encode()


def _canonical(meta: dict) -> bytes:
    return json.dumps({k: v for k, v in meta.items() if k != SIGNATURE}, sort_keys=True,
                      separators=(",", ":")).encode()


def _signature(meta: dict, key: bytes) -> str:
    return hmac.new(key, _canonical(meta), hashlib.sha256).hexdigest()


def signed(meta: dict, key: bytes) -> dict:
    """meta with its signature, as meta.json will read back (tuples as lists, keys as strings)."""
    meta = json.loads(json.dumps(meta))
    return {**meta, SIGNATURE: _signature(meta, key)}


def signature_problem(meta: dict, key: bytes) -> str | None:
    """What is wrong with meta.json's signature under `key`, or None when it verifies."""
    found = meta.get(SIGNATURE)
    if not isinstance(found, str):
        return f"is not signed, and {KEY_ENV} is set: only checkpoints signed with that key load"
    if not hmac.compare_digest(found, _signature(meta, key)):
        return f"has a signature that {KEY_ENV} did not make (signed with another key, or edited since)"
    return None
