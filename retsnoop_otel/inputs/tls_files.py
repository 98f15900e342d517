"""Certificates and keys the user names, parsed where they are given rather than only checked for readability.

Random bytes, an empty file, a DER file where PEM is expected, an encrypted key or the key of another
certificate would otherwise pass start-up and fail at the first TLS handshake, minutes later and in a log
line of the exporter. OpenSSL (the `ssl` module) parses them, so what is accepted here is what the TLS stacks
that use them later accept. Every refusal is one line raised as the caller's error type. `ssl` is imported
only when a file is given: `trace` without TLS starts without it (tests/unit/test_startup.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from retsnoop_otel.inputs.files import MAX_PEM_BYTES, ErrorFactory, read_bytes

if TYPE_CHECKING:
    import ssl

_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
_PEM_KEY = b"PRIVATE KEY-----"


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


def load_ca_bundle(ctx: ssl.SSLContext, path: str, error: ErrorFactory) -> None:
    """A CA bundle into `ctx`: at least one certificate, and every one of them parses."""
    import ssl
    data = _pem_certificates(path, error, "CA certificate")
    try:
        ctx.load_verify_locations(cadata=data.decode("latin-1"))
    except ssl.SSLError:  # OpenSSL's reason ("no start line", "bad base64 decode") says less than this
        raise error(f"{path}: a certificate in the file does not parse (a broken BEGIN/END block or base64)") from None


def load_key_pair(ctx: ssl.SSLContext, cert_path: str, key_path: str, cert_error: ErrorFactory,
                  key_error: ErrorFactory) -> None:
    """A certificate (chain) and its private key into `ctx`: both parse, the key is not encrypted and it is the
    certificate's key."""
    import ssl
    _pem_certificates(cert_path, cert_error, "certificate")
    key = read_bytes(key_path, "private key", MAX_PEM_BYTES, key_error)
    if _PEM_KEY not in key:
        raise key_error(f"{key_path}: no PEM private key in the file (a file that holds -----BEGIN ... PRIVATE "
                        f"KEY-----; a DER key converts with openssl pkey -inform der -in {key_path} -out "
                        f"{key_path}.pem)")
    try:
        ctx.load_cert_chain(cert_path, key_path, password=_no_password)
    except _Encrypted:
        raise key_error(f"{key_path}: the key is encrypted; give it unencrypted (openssl pkey -in KEY -out "
                        "KEY.plain), readable by this user only") from None
    except ssl.SSLError as exc:
        if exc.reason in ("KEY_VALUES_MISMATCH", "NO_CERTIFICATE_ASSIGNED"):  # the latter: a key of another type
            raise key_error(f"{key_path} does not match the certificate in {cert_path}") from None
        raise cert_error(f"{cert_path} with {key_path}: cannot load them: {exc.reason or exc}") from None


def check_key_pair(cert_path: str, key_path: str, cert_error: ErrorFactory, key_error: ErrorFactory) -> None:
    """A client certificate and its key, checked as a TLS client will load them."""
    import ssl
    load_key_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert_path, key_path, cert_error, key_error)


def check_ca_bundle(path: str, error: ErrorFactory) -> None:
    """A CA bundle, checked as a TLS client will load it."""
    import ssl
    load_ca_bundle(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), path, error)
