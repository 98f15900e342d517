"""The files a web config names, loaded: the TLS context, the client certificate's SAN check, and reloading
when cert-manager (or anyone) rewrites a file.

exporter-toolkit re-reads its config on every connection. The cheap equivalent here: every new connection
stats the config file and the certificate, key and CA files (a few microseconds), and only a change of
inode, size or mtime reloads them. A change that does not load (cert-manager writes the certificate and
the key one after the other) keeps the previous config and is reported once.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import threading
from collections.abc import Callable
from typing import Any

from retsnoop_otel.inputs.files import MAX_CONFIG_BYTES, read_text
from retsnoop_otel.inputs.tls_files import TlsReads, load_ca_data, load_key_pair
from retsnoop_otel.metrics.web_config import Locate, TlsSettings, WebConfig, WebConfigError, parse_web_config

_VERIFY = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
           "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_K = "tls_server_config"


def build_context(tls: TlsSettings, at: Locate, reads: TlsReads) -> ssl.SSLContext:
    """The server context of the settings; each refusal names the key whose file or value is wrong. The files come
    from `reads`: checked there, read once in a start (an OTLP exporter may name the same CA)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version, ctx.maximum_version = tls.min_version, tls.max_version
    load_key_pair(ctx, reads.key_pair(tls.cert_file, tls.key_file, lambda msg: at(f"{_K}.cert_file", msg),
                                      lambda msg: at(f"{_K}.key_file", msg)))
    if tls.client_ca_file:
        load_ca_data(ctx, reads.ca_bundle(tls.client_ca_file, lambda msg: at(f"{_K}.client_ca_file", msg)))
    ctx.verify_mode = _VERIFY[tls.client_auth]
    if tls.ciphers:
        try:
            ctx.set_ciphers(":".join(tls.ciphers))
        except ssl.SSLError:
            raise at(f"{_K}.cipher_suites", "none of these cipher suites is available in this OpenSSL") from None
    if tls.curve:
        ctx.set_ecdh_curve(tls.curve)
    if tls.prefer_server_ciphers:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    return ctx


def _same(kind: str, value: str, wanted: str) -> bool:
    if kind == "IP Address":  # Python writes IPv6 SANs uncompressed, Go compressed: compare the addresses
        try:
            return ipaddress.ip_address(value.strip()) == ipaddress.ip_address(wanted)
        except ValueError:
            return False
    return value == wanted


def san_allowed(peercert: dict[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """Whether the verified client certificate has one of the allowed DNS, IP, e-mail or URI SANs (exact match,
    as in the toolkit's client_allowed_sans)."""
    sans = [(kind, value) for kind, value in (peercert or {}).get("subjectAltName", ())
            if kind in ("DNS", "IP Address", "email", "URI")]
    return any(_same(kind, value, wanted) for kind, value in sans for wanted in allowed)


def load_web_config(path: str, reads: TlsReads | None = None) -> WebConfig:
    """Read, check and load a web config file, its certificates included (through the start's `reads`, if given;
    a reload after a change of the files reads them anew)."""
    text = read_text(path, "web config file", MAX_CONFIG_BYTES, WebConfigError)
    cfg, at = parse_web_config(text, path)
    if cfg.tls is None:
        return cfg
    return WebConfig(path=cfg.path, tls=cfg.tls, headers=cfg.headers, users=cfg.users, http2=cfg.http2,
                     context=build_context(cfg.tls, at, reads or TlsReads()), files=cfg.files)


def _signature(paths: tuple[str, ...]) -> tuple:
    out = []
    for p in paths:
        try:
            st = os.stat(p)  # follows symlinks: a Kubernetes secret's ..data swap changes the inode
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


class WebWatcher:
    """The web config in force for new connections; `current()` reloads it when one of its files changed.
    `warn` gets the error of a change that does not load."""

    def __init__(self, config: WebConfig, warn: Callable[[str], None] = lambda _msg: None) -> None:
        self._config = config
        self._seen = _signature(config.files)
        self._warn = warn
        self._lock = threading.Lock()

    def current(self) -> WebConfig:
        cfg = self._config
        sig = _signature(cfg.files)
        if sig == self._seen:
            return cfg
        with self._lock:
            if self._config is not cfg:  # another connection reloaded it meanwhile
                return self._config
            self._seen = sig  # a change that fails is reported and retried at the next change only
            try:
                new = load_web_config(cfg.path)
            except WebConfigError as exc:
                self._warn(str(exc))
                return cfg
            # the signature from before the read: a write during it is seen at the next connection
            self._config, self._seen = new, sig if new.files == cfg.files else _signature(new.files)
            return new
