"""Certificates and keys the user names, parsed where they are given rather than only checked for readability.

Random bytes, an empty file, a DER file where PEM is expected, an encrypted key or the key of another
certificate would otherwise pass start-up and fail at the first TLS handshake, minutes later and in a log
line of the exporter. OpenSSL (the `ssl` module) parses them, so what is accepted here is what the TLS stacks
that use them later accept. Every refusal is one line raised as the caller's error type. `ssl` is imported
only when a file is given: `trace` without TLS starts without it (tests/unit/test_startup.py).

The bytes read and checked here are what the TLS contexts and channels are built from: no file is read twice in
one start (tests/unit/test_start_reads.py). OpenSSL loads a certificate chain from a path only, so the checked
bytes reach it through a memfd (never a temporary file on disk, where a key could be left behind).
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

from retsnoop_otel.inputs.files import MAX_PEM_BYTES, ErrorFactory, read_bytes

if TYPE_CHECKING:
    import ssl

_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
_PEM_KEY = b"PRIVATE KEY-----"


class KeyPair(NamedTuple):
    """A certificate (chain) and its private key, as read and checked at start: the bytes a context loads."""

    cert: bytes
    key: bytes

    def __repr__(self) -> str:  # the settings that hold it may be printed: never the key
        return f"KeyPair(cert=<{len(self.cert)} bytes>, key=<{len(self.key)} bytes, not shown>)"


class _Encrypted(Exception):
    pass


def _no_password() -> bytes:
    raise _Encrypted  # never OpenSSL's own prompt on the terminal of a daemon


def _is_der_certificate(data: bytes) -> bool:
    import ssl
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data)
    except (ssl.SSLError, ValueError):
        return False
    return True


def _pem_certificates(path: str, error: ErrorFactory, what: str) -> bytes:
    data = read_bytes(path, what, MAX_PEM_BYTES, error)
    if _PEM_CERT not in data:
        if data and _is_der_certificate(data):
            raise error(f"{path}: a DER certificate, PEM is expected; convert it with "
                        f"openssl x509 -inform der -in {path} -out {path}.pem")
        raise error(f"{path}: no PEM {what} in the file (a file that holds -----BEGIN CERTIFICATE-----)")
    return data


@contextmanager
def _memory_path(data: bytes) -> Iterator[str]:
    """A path that OpenSSL can open, holding `data` in memory only (a memfd, closed on leaving)."""
    fd = os.memfd_create("retsnoop-otel-pem", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def read_ca_bundle(path: str, error: ErrorFactory) -> bytes:
    """A CA bundle's bytes: at least one certificate, and every one of them parses (loaded into a throw-away
    client context)."""
    import ssl
    data = _pem_certificates(path, error, "CA certificate")
    try:
        load_ca_data(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), data)
    except ssl.SSLError:  # OpenSSL's reason ("no start line", "bad base64 decode") says less than this
        raise error(f"{path}: a certificate in the file does not parse (a broken BEGIN/END block or base64)") from None
    return data


def load_ca_data(ctx: "ssl.SSLContext", data: bytes) -> None:
    """CA certificates already read (read_ca_bundle) into `ctx`."""
    ctx.load_verify_locations(cadata=data.decode("latin-1"))


def read_key_pair(cert_path: str, key_path: str, cert_error: ErrorFactory, key_error: ErrorFactory) -> KeyPair:
    """A certificate (chain) and its private key: both parse, the key is not encrypted and it is the certificate's
    key (loaded into a throw-away client context)."""
    import ssl
    cert = _pem_certificates(cert_path, cert_error, "certificate")
    key = read_bytes(key_path, "private key", MAX_PEM_BYTES, key_error)
    if _PEM_KEY not in key:
        raise key_error(f"{key_path}: no PEM private key in the file (a file that holds -----BEGIN ... PRIVATE "
                        f"KEY-----; a DER key converts with openssl pkey -inform der -in {key_path} -out "
                        f"{key_path}.pem)")
    pair = KeyPair(cert, key)
    try:
        load_key_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), pair)
    except _Encrypted:
        raise key_error(f"{key_path}: the key is encrypted; give it unencrypted (openssl pkey -in KEY -out "
                        "KEY.plain), readable by this user only") from None
    except ssl.SSLError as exc:
        if exc.reason in ("KEY_VALUES_MISMATCH", "NO_CERTIFICATE_ASSIGNED"):  # the latter: a key of another type
            raise key_error(f"{key_path} does not match the certificate in {cert_path}") from None
        raise cert_error(f"{cert_path} with {key_path}: cannot load them: {exc.reason or exc}") from None
    return pair


def load_key_pair(ctx: "ssl.SSLContext", pair: KeyPair) -> None:
    """A key pair already read (read_key_pair) into `ctx`, from memory."""
    with _memory_path(pair.cert) as cert, _memory_path(pair.key) as key:
        ctx.load_cert_chain(cert, key, password=_no_password)


class TlsReads:
    """The certificates and keys of one start, each read and checked once however many settings name them (the
    traces' and the metrics' OTLP exporters share OTEL_EXPORTER_OTLP_CERTIFICATE)."""

    def __init__(self) -> None:
        self._done: dict[tuple[str, ...], bytes | KeyPair] = {}

    def ca_bundle(self, path: str, error: ErrorFactory) -> bytes:
        data = self._done.get(("ca", path))
        if not isinstance(data, bytes):
            data = self._done[("ca", path)] = read_ca_bundle(path, error)
        return data

    def key_pair(self, cert_path: str, key_path: str, cert_error: ErrorFactory, key_error: ErrorFactory) -> KeyPair:
        pair = self._done.get(("pair", cert_path, key_path))
        if not isinstance(pair, KeyPair):
            pair = self._done[("pair", cert_path, key_path)] = read_key_pair(cert_path, key_path, cert_error,
                                                                             key_error)
        return pair
