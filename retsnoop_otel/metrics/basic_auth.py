"""HTTP basic authentication against the web config's bcrypt hashes, the way exporter-toolkit does it, with the
CPU it may spend bounded (issue 47: "Nothing pins a CPU").

bcrypt at cost 10 takes 50-100 ms, so verified results are cached (keyed by a digest of user, hash and password,
as the toolkit keys its cache by them; the plaintext password is not kept). An unknown user is checked against a
decoy hash of the configured cost, so a wrong user costs what a wrong password does (no user enumeration by
timing). What a login can cost is bounded three ways:

- each check: the web config refuses hashes above web_config.MAX_BCRYPT_COST, the decoy never exceeds it, and a
  hash above it that reaches this class anyway is refused without a check;
- checks at once: at most MAX_CHECKS, each in its connection's own worker thread (never the accepting one, so
  other connections are accepted and served meanwhile); a login that needs a check when all are taken is
  answered BUSY at once (the server's 503 with Retry-After), not queued: a queue would hold a thread per waiting
  connection and serve nobody sooner. A login whose check is already running (a second scrape with the same
  credentials) waits for that check's answer instead, up to CHECK_WAIT_S;
- the cache: verified logins and refused ones are kept apart, so a flood of wrong passwords evicts only refusals,
  never the entry of a scraper that logged in (which then needs no check at all).
"""

from __future__ import annotations

import base64
import binascii
import collections
import enum
import hashlib
import hmac
import random
import threading
from collections.abc import Mapping

import bcrypt

from retsnoop_otel.metrics.web_config import MAX_BCRYPT_COST

CACHE_SIZE = 100  # results kept of each kind, verified and refused (the toolkit keeps 100 of both together)
REALM = "retsnoop-otel"
BCRYPT_MAX_BYTES = 72  # bcrypt reads no further (Go's and htpasswd's too); bcrypt>=5 raises instead of truncating
# bcrypt checks at once: two cores at most, and a slow or hostile login leaves room for another client's
MAX_CHECKS = 2
CHECK_WAIT_S = 30.0  # a login waiting for the same credentials' running check: longer than one check at the cost cap


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    REFUSED = "refused"  # 401
    BUSY = "busy"  # every check slot is taken: 503, try again


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


def hash_cost(hashed: str) -> int:
    """The cost of a `$2?$NN$...` (or `$2$NN$...`) hash; 0 when it has none."""
    digits = hashed[4:6] if hashed[3:4] == "$" else hashed[3:5]
    return int(digits) if digits.isdigit() else 0


class _Check:
    """One running bcrypt check, which logins with the same credentials wait for."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok: bool | None = None  # None: it failed (the waiters answer BUSY)


class BasicAuth:
    """Checks credentials against the users of the web config in force (they may change between calls)."""

    def __init__(self, max_checks: int = MAX_CHECKS) -> None:
        self.max_checks = max_checks
        self._lock = threading.Lock()
        self._verified: dict[bytes, bool] = {}
        self._refused: dict[bytes, bool] = {}
        self._running: dict[bytes, _Check] = {}
        self._decoys: dict[int, bytes] = {}

    def allowed(self, authorization: str | None, users: Mapping[str, str]) -> bool:
        return self.check(authorization, users) is Verdict.ALLOWED

    def check(self, authorization: str | None, users: Mapping[str, str]) -> Verdict:
        creds = credentials(authorization)
        if creds is None:
            return Verdict.REFUSED
        user, password = creds
        hashed = None
        for name, h in users.items():  # every name compared, in constant time each
            if hmac.compare_digest(name.encode(), user):
                hashed = h.encode()
        known = hashed is not None
        if hashed is None:
            hashed = self._decoy(users)
        key = hashlib.sha256(b"".join(len(p).to_bytes(4, "big") + p for p in (user, hashed, password))).digest()
        with self._lock:
            cached = self._verified.get(key, self._refused.get(key))
            running = self._running.get(key) if cached is None else None
            mine = cached is None and running is None
            if mine:
                if len(self._running) >= self.max_checks:
                    return Verdict.BUSY
                running = self._running[key] = _Check()
        if cached is not None:
            ok: bool | None = cached
        elif mine:
            assert running is not None
            ok = self._run(running, key, password, hashed)
        else:
            assert running is not None
            ok = running.ok if running.done.wait(CHECK_WAIT_S) else None
        if ok is None:
            return Verdict.BUSY
        return Verdict.ALLOWED if ok and known else Verdict.REFUSED

    def _run(self, check: _Check, key: bytes, password: bytes, hashed: bytes) -> bool | None:
        try:
            check.ok = _checkpw(password, hashed)
            self._remember(key, check.ok)
        finally:
            with self._lock:
                del self._running[key]
            check.done.set()
        return check.ok

    def _remember(self, key: bytes, ok: bool) -> None:
        with self._lock:
            cache = self._verified if ok else self._refused
            if len(cache) >= CACHE_SIZE:  # random eviction of a tenth, as in the toolkit
                for old in random.sample(list(cache), max(1, len(cache) // 10)):
                    del cache[old]
            cache[key] = ok

    def _decoy(self, users: Mapping[str, str]) -> bytes:
        """A hash no password matches, at the cost most configured hashes have (the toolkit's decoy is
        always cost 10, which a cost-12 file would give away), and never above the cap."""
        costs = collections.Counter(hash_cost(h) for h in users.values())
        cost = max(costs.items(), key=lambda kv: (kv[1], kv[0]))[0] if costs else 10
        cost = min(max(cost, 4), MAX_BCRYPT_COST)
        with self._lock:
            decoy = self._decoys.get(cost)
            if decoy is None:
                # a fresh salt with a real hash's checksum part: well-formed, matches nothing, costs one full bcrypt
                tail = next(iter(users.values()), "$2b$10$" + "." * 53)[-31:].encode()
                decoy = self._decoys[cost] = bcrypt.gensalt(cost)[:29] + tail
        return decoy


def _checkpw(password: bytes, hashed: bytes) -> bool:
    if hash_cost(hashed.decode("ascii", "replace")) > MAX_BCRYPT_COST:
        return False  # never run: the web config refuses such a hash, and one check could take over a day
    try:
        return bcrypt.checkpw(password[:BCRYPT_MAX_BYTES], hashed)
    except ValueError:  # a hash this bcrypt cannot use (the web config refuses those)
        return False
