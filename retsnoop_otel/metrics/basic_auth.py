"""HTTP basic authentication against the web config's bcrypt hashes, the way exporter-toolkit does it.

bcrypt at cost 10 takes 50-100 ms, so verified results are cached (keyed by a digest of user, hash and
password, as the toolkit keys its cache by them; the plaintext password is not kept), and only one
bcrypt check runs at a time. An unknown user is checked against a decoy hash of the configured cost, so
a wrong user costs what a wrong password does (no user enumeration by timing).
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import random
import threading
from collections.abc import Mapping

import bcrypt

CACHE_SIZE = 100  # (user, hash, password) results kept, as in the toolkit
REALM = "retsnoop-otel"
BCRYPT_MAX_BYTES = 72  # bcrypt reads no further (Go's and htpasswd's too); bcrypt>=5 raises instead of truncating


def credentials(authorization: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) of an `Authorization: Basic ...` header; None when absent or malformed."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    return (user, password) if sep else None


class BasicAuth:
    """Checks credentials against the users of the web config in force (they may change between calls)."""

    def __init__(self) -> None:
        self._cache: dict[bytes, bool] = {}
        self._cache_lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()  # bcrypt is the CPU-heavy part: one at a time, as in the toolkit
        self._decoys: dict[int, bytes] = {}

    def allowed(self, authorization: str | None, users: Mapping[str, str]) -> bool:
        creds = credentials(authorization)
        if creds is None:
            return False
        user, password = creds
        hashed = None
        for name, h in users.items():  # every name compared, in constant time each
            if hmac.compare_digest(name.encode(), user):
                hashed = h.encode()
        known = hashed is not None
        if hashed is None:
            hashed = self._decoy(users)
        key = hashlib.sha256(b"".join(len(p).to_bytes(4, "big") + p for p in (user, hashed, password))).digest()
        with self._cache_lock:
            cached = self._cache.get(key)
        if cached is None:
            with self._bcrypt_lock:
                with self._cache_lock:  # a scrape that waited for the lock may find its answer now
                    cached = self._cache.get(key)
                if cached is None:
                    try:
                        cached = bcrypt.checkpw(password[:BCRYPT_MAX_BYTES], hashed)
                    except ValueError:  # a hash this bcrypt cannot use (the web config refuses those)
                        cached = False
                    self._remember(key, cached)
        return cached and known

    def _remember(self, key: bytes, ok: bool) -> None:
        with self._cache_lock:
            if len(self._cache) >= CACHE_SIZE:  # random eviction of a tenth, as in the toolkit
                for old in random.sample(list(self._cache), max(1, len(self._cache) // 10)):
                    del self._cache[old]
            self._cache[key] = ok

    def _decoy(self, users: Mapping[str, str]) -> bytes:
        """A hash no password matches, at the cost most configured hashes have (the toolkit's decoy is
        always cost 10, which a cost-12 file would give away)."""
        costs = collections.Counter(int(h[4:6]) if h[3] == "$" else int(h[3:5]) for h in users.values())
        cost = max(costs.items(), key=lambda kv: (kv[1], kv[0]))[0] if costs else 10
        decoy = self._decoys.get(cost)
        if decoy is None:
            # a fresh salt with a real hash's checksum part: well-formed, matches nothing, costs one full bcrypt
            tail = next(iter(users.values()), "$2b$10$" + "." * 53)[-31:].encode()
            decoy = self._decoys[cost] = bcrypt.gensalt(cost)[:29] + tail
        return decoy
