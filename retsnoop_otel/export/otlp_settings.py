"""OTLP exporter settings resolved as the OpenTelemetry specification defines them (protocol/exporter.md).

Each setting comes from the user's configuration, else the per-signal variable
(OTEL_EXPORTER_OTLP_TRACES_X / _METRICS_X), else the generic one (OTEL_EXPORTER_OTLP_X), else the
default. An empty variable counts as unset (sdk-environment-variables.md). A bad value of a config key
or flag raises OtlpConfigError at start-up, one line naming it (exit 2). A bad value of a variable is,
as the specification says, warned about and ignored: the variable counts as unset and the setting is
resolved again from the next source (the generic variable after the per-signal one, then the default);
the warning, one line naming the variable (never a header's value or an endpoint's secrets), is
collected in otel_env.EnvWarnings for the runtime to say at start.
Only the standard library is used, so nothing here depends on the OpenTelemetry SDK.
"""

import math
import re
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from retsnoop_otel.export.otel_env import IGNORED, OTLP_PROTOCOL, EnvWarnings, otlp_var, warnings_or_new
from retsnoop_otel.inputs.files import ErrorFactory, shown
from retsnoop_otel.inputs.tls_files import KeyPair, TlsReads

SIGNALS = ("traces", "metrics")
PROTOCOLS = ("grpc", "http/protobuf")
COMPRESSIONS = ("gzip", "deflate", "none")  # the config's: deflate is this tool's own addition
ENV_COMPRESSIONS = ("gzip", "none")  # what OTEL_EXPORTER_OTLP_*COMPRESSION takes (protocol/exporter.md)
DEFAULT_PROTOCOL = "http/protobuf"  # the specification's default (protocol/exporter.md, "Specify Protocol")
DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 3600.0  # an export request: an hour is past any use (1e30 overflowed the sockets' timeouts)
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_HTTP_BASE = "http://localhost:4318/"
GRPC_DEFAULT_PORT = 4317
_HTTP_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP field name (RFC 9110 token)
_GRPC_KEY = re.compile(r"[0-9a-z_.-]+")  # a gRPC metadata key


class OtlpConfig(NamedTuple):
    """What the user configured for one OTLP destination; None / () = not set (then the environment, then the
    default)."""

    endpoint: str | None = None
    protocol: str | None = None  # "grpc" | "http/protobuf"
    headers: tuple[tuple[str, str], ...] = ()  # non-empty: replaces the environment's headers entirely
    compression: str | None = None  # "gzip" | "deflate" | "none"
    timeout_s: float | None = None  # seconds (the environment variable is in milliseconds)
    insecure: bool | None = None  # gRPC only
    certificate: str | None = None  # CA bundle (PEM) to verify the server
    client_key: str | None = None  # mTLS
    client_certificate: str | None = None  # mTLS


class OtlpSettings(NamedTuple):
    """Fully resolved settings for one signal: what a sender needs, nothing left to look up."""

    signal: str  # "traces" | "metrics"
    protocol: str  # "grpc" | "http/protobuf"
    url: str  # http/protobuf: the full POST URL; grpc: the endpoint as a URL (scheme://host:port)
    target: str  # grpc: "host:port" for grpc channels; http: ""
    tls: bool
    headers: tuple[tuple[str, str], ...]  # names lower-cased for gRPC (metadata keys must be lower case)
    compression: str  # "gzip" | "deflate" | "none"
    timeout_s: float
    certificate: str | None
    client_key: str | None
    client_certificate: str | None
    endpoint_from: str = "default"  # where the endpoint came from: "config", "signal", "generic" or "default"
    ca_data: bytes | None = None  # the certificate file's bytes, read and checked once at start
    client_pair: KeyPair | None = None  # the client certificate's and key's bytes, read and checked once at start


class OtlpConfigError(ValueError):
    """One line naming the bad setting (config key or environment variable) and how to fix it. `variable`: the
    environment variable the bad value came from (then it is warned about and ignored), None for a config key."""

    def __init__(self, message: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


class _Value(NamedTuple):
    """A setting's raw value and where it came from, so errors can name the right key or variable."""

    value: object
    name: str  # the config name (as the user wrote it) or the environment variable
    source: str  # "config" | "signal" | "generic" | "default"


class _Lookup:
    def __init__(self, cfg: OtlpConfig, signal: str, environ: Mapping[str, str], names: Mapping[str, str],
                 reads: TlsReads) -> None:
        self.cfg, self.signal, self.environ, self.names, self.reads = cfg, signal, environ, names, reads
        self.ignored: set[str] = set()  # variables whose values were refused: unset from here on

    def name(self, field: str) -> str:
        return self.names.get(field, field)

    def get(self, field: str, var: str) -> _Value:
        value = getattr(self.cfg, field)
        if value is not None and value != ():
            return _Value(value, self.name(field), "config")
        for source, key in (("signal", otlp_var(var, self.signal)), ("generic", otlp_var(var))):
            raw = self.environ.get(key, "").strip()
            if raw and key not in self.ignored:
                return _Value(raw, key, source)
        return _Value(None, self.name(field), "default")


def _variable(v: _Value) -> str | None:
    return v.name if v.source in ("signal", "generic") else None


def _error(v: _Value, problem: str, fix: str, show: bool = True) -> OtlpConfigError:
    """`show=False` for headers: their values can hold API keys, which must not reach logs."""
    return OtlpConfigError(f"{v.name}{f'={shown(v.value)}' if show else ''}: {problem}; {fix}", _variable(v))


def _choice(v: _Value, allowed: tuple[str, ...]) -> str:
    text = str(v.value).strip().lower()  # enum values are case-insensitive (sdk-environment-variables.md)
    if text not in allowed:
        raise _error(v, "unknown value", f"use one of: {', '.join(allowed)}")
    return text


def _compression(v: _Value) -> str:
    """The config's gzip, deflate or none; a variable's gzip or none, as the specification lists them (deflate there
    is warned about and ignored, as every value the specification does not list)."""
    if v.source == "config":
        return _choice(v, COMPRESSIONS)
    if str(v.value).strip().lower() == "deflate":
        raise _error(v, "not a compression of the OTLP exporter variables", "use gzip or none (deflate is "
                     "exporter.otlp.compression's, in the agent's config)")
    return _choice(v, ENV_COMPRESSIONS)


def _protocol(look: _Lookup) -> tuple[str, bool]:
    """(protocol, whether it is the default because nothing set it)."""
    v = look.get("protocol", "PROTOCOL")
    if v.value is None:
        return DEFAULT_PROTOCOL, True
    if str(v.value).strip().lower() == "http/json":
        raise _error(v, "http/json is not supported", "use http/protobuf or grpc")
    return _choice(v, PROTOCOLS), False


MAX_HOST_CHARS = 253  # a DNS name's limit (RFC 1035), written out


def _redacted(text: str) -> str:
    """The endpoint as errors show it: no user info and no query string (either can hold an API key). Text
    only, no URL parser: it has to work on what a parser refuses."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    path, q, _query = tail.partition("?")
    return f"{scheme}{sep}{authority}{path}{'?***' if q else ''}"


def _hide_secrets(v: _Value) -> _Value:
    return _Value(_redacted(str(v.value)), v.name, v.source)


# what RFC 3986 allows between the user info and the path: an [IPv6] literal or an ASCII name, then :port
_HOST_PORT = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+(?:%25[0-9A-Za-z._~-]+)?)\]|[0-9A-Za-z._~%!$&'()*+,;=-]+)"
                        r"(?::[^\[\]@]*)?")  # the port itself: checked by urlsplit, whose message is better


def _is_ipv6(text: str) -> bool:
    import ipaddress  # rare: not on the start path of every run
    try:
        ipaddress.IPv6Address(text.replace("%25", "%"))
    except ValueError:
        return False
    return True


def _split_url(v: _Value, text: str, example: str) -> SplitResult:
    """Scheme http(s), a host, a valid non-zero port if any. Never raises anything but OtlpConfigError, whose
    message names the setting, shows the value without its secrets and says the form expected."""
    v = _hide_secrets(v)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise _error(v, "a control character in the URL", f"remove it; write it like {example}")
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # an unclosed '[' of an IPv6 address, a bad character in the host...
        raise _error(v, f"not a valid URL ({exc})", f"write it like {example} (IPv6: http://[::1]:4317)") from None
    if parts.scheme not in ("http", "https") or any(c.isspace() for c in text):
        raise _error(v, "not an http:// or https:// URL", f"write it like {example}")
    try:
        port = parts.port
        host = parts.hostname
    except ValueError as exc:
        raise _error(v, f"bad port ({exc})", "write a port between 1 and 65535") from None
    if not host:
        raise _error(v, "no host in the URL", f"write it like {example}")
    where = _HOST_PORT.fullmatch(parts.netloc.rpartition("@")[2])
    if where is None or (where.group("v6") is not None and not _is_ipv6(where.group("v6"))):
        raise _error(v, "not a host[:port] after the scheme", f"write it like {example} (IPv6: http://[::1]:4317; "
                     "a host name in ASCII, xn-- for international names)")
    if len(host) > MAX_HOST_CHARS:
        raise _error(v, f"the host has {len(host)} characters, more than a host name can have ({MAX_HOST_CHARS})",
                     f"write it like {example}")
    if port == 0:
        raise _error(v, "port 0", "write a port between 1 and 65535")
    return parts


def _http_url(look: _Lookup, by_default: bool) -> tuple[str, bool]:
    """Per-signal variable as is; the generic variable and a config endpoint are base URLs (spec), except a
    config endpoint that already ends in /v1/<signal>. A scheme-less host:port is OTLP/gRPC's form (spec: only
    gRPC endpoints may omit the scheme), so it is refused with both ways out: a URL, or the gRPC protocol."""
    v = look.get("endpoint", "ENDPOINT")
    text = DEFAULT_HTTP_BASE if v.value is None else str(v.value).strip()
    if v.value is not None and "://" not in text and not any(c.isspace() or ord(c) < 32 for c in text):
        which = "http/protobuf, the default" if by_default else "http/protobuf"
        raise _error(_hide_secrets(v), "not an http:// or https:// URL (a host:port without a scheme is for "
                     f"OTLP/gRPC, and the protocol is {which})", "write it like http://collector:4318, or set "
                     f"{look.name('protocol')}=grpc")  # the one protocol source named: the warning stays in 400
    parts = _split_url(v, text, "http://collector:4318")
    suffix = f"v1/{look.signal}"
    base = v.source in ("generic", "default") or (
        v.source == "config" and not parts.path.rstrip("/").endswith("/" + suffix))
    path = parts.path
    if base:
        path = (path if path.endswith("/") else path + "/") + suffix
    return urlunsplit(parts._replace(path=path or "/")), parts.scheme == "https"


def _grpc_target(look: _Lookup) -> tuple[str, str, bool]:
    """(url, "host:port", tls). http:// and https:// decide TLS themselves; a bare host:port is TLS unless
    insecure is true (spec). gRPC has no paths, so a path is an error that points at OTLP/HTTP."""
    v = look.get("endpoint", "ENDPOINT")
    insecure = _insecure(look)
    text = DEFAULT_GRPC_ENDPOINT if v.value is None else str(v.value).strip()
    if "://" in text:
        parts = _split_url(v, text, "http://collector:4317 or collector:4317")
        tls = parts.scheme == "https"
    else:
        parts = _split_url(v, "http://" + text, "collector:4317")  # host[:port] parsed as a URL; errors show `text`
        tls = not insecure
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise _error(_hide_secrets(v), "gRPC endpoints take no path", f"drop the path, or set "
                     f"{look.name('protocol')}=http/protobuf (or {OTLP_PROTOCOL}) for an OTLP/HTTP URL")
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    target = f"{host}:{parts.port or GRPC_DEFAULT_PORT}"
    return f"{'https' if tls else 'http'}://{target}", target, tls


def _insecure(look: _Lookup) -> bool:
    v = look.get("insecure", "INSECURE")
    if v.value is None or isinstance(v.value, bool):
        return bool(v.value)
    text = str(v.value).strip().lower()
    if text not in ("true", "false"):
        raise _error(v, "not a boolean", "write true or false")
    return text == "true"


def _header_name(n: int, key: str) -> str:
    """How an error names a header: by its key (cut, escaped), never by its value; by position when it has none."""
    return f"header {shown(key, 40)}" if key else f"header #{n}"


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _unescaped(text: str) -> str | None:
    """A percent-encoded part of a header (W3C Baggage's encoding, as the variable's is), None when it cannot be
    decoded: a '%' without two hex digits, or bytes that are not UTF-8 (unquote() would keep or replace them)."""
    if _BAD_ESCAPE.search(text):
        return None
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        return None


def _headers(look: _Lookup, grpc: bool) -> tuple[tuple[str, str], ...]:
    """Pairs from config, or parsed from key1=value1,key2=value2 (percent-decoded). Errors name the header by its
    key and never show a value: a header may hold an API key."""
    v = look.get("headers", "HEADERS")
    if v.value is None:
        return ()
    if v.source == "config":
        pairs = [(n, str(k).strip(), str(val).strip()) for n, (k, val) in enumerate(v.value, 1)]  # type: ignore
    else:
        pairs = []
        for n, item in enumerate(str(v.value).split(","), 1):
            if not item.strip():
                continue  # tolerate "a=1,,b=2" and a trailing comma
            key, eq, val = item.partition("=")
            if not eq:
                # 'Authorization: Bearer x' names its key before ':'; a lone word may be the secret itself
                head, sep, _ = unquote(item).strip().partition(":")
                named = head.strip() if sep and _HTTP_TOKEN.fullmatch(head.strip()) else ""
                what = _header_name(n, named) if named else f"header #{n} (not shown: it may hold a secret)"
                raise _error(v, f"{what} has no '='", "write key1=value1,key2=value2"
                             + (f" ({named}=value, not '{named}: value')" if named else ""), False)
            name, value = _unescaped(key), _unescaped(val)
            if name is None or value is None:
                named = _header_name(n, name.strip()) if name is not None else f"header #{n}"
                raise _error(v, f"{named} has a bad percent-escape in its {'value (not shown)' if name else 'name'}",
                             "write %XX with two hex digits of UTF-8 bytes, such as %20 for a space", False)
            pairs.append((n, name.strip(), value.strip()))
    out: dict[str, str] = {}
    for n, key, val in pairs:
        key = key.lower() if grpc else key  # gRPC metadata keys are lower case
        if not key:
            raise _error(v, f"header #{n} has an empty name", "write key1=value1,key2=value2", False)
        if not (_GRPC_KEY if grpc else _HTTP_TOKEN).fullmatch(key) or grpc and key.endswith("-bin"):
            # only the name's leading letters: 'Authorization: Bearer x' before '=' holds the secret after ':'
            start = re.match(r"[A-Za-z0-9_.-]{1,40}", key)
            what = (_header_name(n, key) if start and start.group() == key
                    else f"header #{n} (its name starts {shown(start.group())})" if start else f"header #{n}")
            raise _error(v, f"{what} has an invalid name", "write key1=value1,key2=value2 with "
                         "names of letters, digits and -_. (gRPC: not ending in -bin)", False)
        if any(ord(c) < 32 or ord(c) == 127 for c in val):
            raise _error(v, f"{_header_name(n, key)} has a control character in its value (not shown)",
                         "remove it (percent-encoded ones such as %0A too)", False)
        out[key] = val
    return tuple(out.items())


def _timeout(look: _Lookup) -> float:
    v = look.get("timeout_s", "TIMEOUT")
    if v.value is None:
        return DEFAULT_TIMEOUT_S
    if v.source == "config":
        seconds = v.value if isinstance(v.value, (int, float)) and not isinstance(v.value, bool) else math.nan
        unit = "seconds, such as 10"
    else:
        try:
            seconds = float(str(v.value)) / 1000.0
        except ValueError:
            seconds = math.nan
        unit = "milliseconds, such as 10000"
    if not (math.isfinite(seconds) and seconds > 0):
        raise _error(v, "not a positive number", f"write a timeout > 0 in {unit}")
    if seconds > MAX_TIMEOUT_S:
        most = f"{MAX_TIMEOUT_S:g} seconds" if v.source == "config" else f"{MAX_TIMEOUT_S * 1000:.0f} milliseconds"
        raise _error(v, "longer than an hour", f"write a timeout of at most {most}, such as {unit.split()[-1]}")
    return float(seconds)


def _file_error(v: _Value) -> ErrorFactory:
    # the path leads the message: not shown twice
    return lambda msg: OtlpConfigError(f"{v.name}: {msg}", _variable(v))


def resolve_settings(cfg: OtlpConfig, signal: str, environ: Mapping[str, str],
                     names: Mapping[str, str] | None = None, warnings: EnvWarnings | None = None,
                     tls_reads: TlsReads | None = None) -> OtlpSettings:
    """Settings for `signal` from cfg, then the environment, then the defaults.

    `names` maps an OtlpConfig field to how the user wrote it (--otlp-endpoint, exporter.otlp.endpoint) so errors
    point at the right place. For gRPC, a certificate or client certificate with an http:// endpoint is accepted
    but ignored: http:// means plaintext (spec: the scheme wins over every other TLS setting).

    A variable whose value cannot work goes to `warnings` and counts as unset: the settings are resolved again
    without it, each variable at most once. A config value that cannot work raises OtlpConfigError.
    The certificate files are read once (`tls_reads`, shared by the signals of one start); the senders use
    their bytes.
    """
    if signal not in SIGNALS:
        raise ValueError(f"signal must be one of {SIGNALS}, not {signal!r}")
    look = _Lookup(cfg, signal, environ, names or {}, tls_reads or TlsReads())
    warnings = warnings_or_new(warnings)
    while True:
        try:
            return _resolve(look)
        except OtlpConfigError as exc:
            if exc.variable is None or exc.variable in look.ignored:
                raise
            look.ignored.add(exc.variable)
            warnings.add(exc.variable, f"{exc}; {IGNORED}")


def _resolve(look: _Lookup) -> OtlpSettings:
    protocol, by_default = _protocol(look)
    if protocol == "grpc":
        url, target, tls = _grpc_target(look)
    else:
        (url, tls), target = _http_url(look, by_default), ""
    compression = look.get("compression", "COMPRESSION")
    certificate = look.get("certificate", "CERTIFICATE")
    key = look.get("client_key", "CLIENT_KEY")
    cert = look.get("client_certificate", "CLIENT_CERTIFICATE")
    if (key.value is None) != (cert.value is None):
        given, missing = (key, "client_certificate") if cert.value is None else (cert, "client_key")
        raise _error(given, f"mTLS needs a client key and certificate, but {missing} is not set",
                     f"set {look.name(missing)} too, or remove {given.name}")
    ca_data = None if certificate.value is None else look.reads.ca_bundle(str(certificate.value),
                                                                            _file_error(certificate))
    pair = None if cert.value is None else look.reads.key_pair(str(cert.value), str(key.value), _file_error(cert),
                                                                _file_error(key))
    return OtlpSettings(
        signal=look.signal, protocol=protocol, url=url, target=target, tls=tls,
        headers=_headers(look, grpc=protocol == "grpc"),
        compression="none" if compression.value is None else _compression(compression),
        timeout_s=_timeout(look),
        certificate=None if certificate.value is None else str(certificate.value),
        client_key=None if key.value is None else str(key.value),
        client_certificate=None if cert.value is None else str(cert.value),
        endpoint_from=look.get("endpoint", "ENDPOINT").source, ca_data=ca_data, client_pair=pair)


def describe(settings: OtlpSettings) -> str:
    """Short text for logs, e.g. "http/protobuf http://localhost:4318/v1/traces (plaintext)" or
    "grpc localhost:4317 (TLS)". Never headers, user info or the query string:
    they can hold API keys."""
    where = settings.target
    if settings.protocol != "grpc":
        parts = urlsplit(settings.url)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        where = f"{parts.scheme}://{host}{'' if parts.port is None else f':{parts.port}'}{parts.path}"
    extra = "" if settings.compression == "none" else f", {settings.compression}"
    return f"{settings.protocol} {where} ({'TLS' if settings.tls else 'plaintext'}{extra})"
