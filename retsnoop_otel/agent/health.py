"""`agent --health`: a container's health check, asking the running agent's /healthz where and how its config
serves it (metrics.port and address; plain HTTP, or TLS from the web config; basic auth).

A HEALTHCHECK that hard-codes http://127.0.0.1:9464 breaks as soon as a user moves the port or turns TLS on; this
reads the same files the agent reads.
"""

import http.client
import ssl
from typing import NamedTuple

from retsnoop_otel.agent.config_file import ConfigError, load_config
from retsnoop_otel.command.errors import EXIT_HOST, EXIT_INPUT, EXIT_OK
from retsnoop_otel.metrics.web_config import WebConfigError
from retsnoop_otel.metrics.web_tls import load_web_config
from retsnoop_otel.runtime.config import MetricsConfig

LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


class Health(NamedTuple):
    healthy: bool
    message: str


def _client_context() -> ssl.SSLContext:
    """The agent's own endpoint on this host: liveness, not the server's identity, is in question (its certificate
    names the host as clients reach it, not the loopback address)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check_health(metrics: MetricsConfig, timeout_s: float = 5.0) -> Health:
    if metrics.port is None:
        return Health(True, "the config serves no /healthz (metrics.port is null): nothing to ask")
    web = load_web_config(metrics.web_config_file) if metrics.web_config_file else None
    host = LOOPBACK.get(metrics.host, metrics.host)
    scheme = "https" if web is not None and web.tls is not None else "http"
    url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{metrics.port}/healthz"
    conn = (http.client.HTTPSConnection(host, metrics.port, timeout=timeout_s, context=_client_context())
            if scheme == "https" else http.client.HTTPConnection(host, metrics.port, timeout=timeout_s))
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        body = resp.read(512).decode(errors="replace").strip()
    except ConnectionRefusedError:  # the port is bound at start but answers only once every probe is attached
        return Health(False, f"{url}: connection refused (the agent is not running, or still attaching its probes)")
    except (OSError, http.client.HTTPException) as exc:
        return Health(False, f"{url}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}")
    finally:
        conn.close()
    if resp.status == 200:
        return Health(True, f"{url}: {body or 'ok'}")
    if resp.status == 401 and web is not None and web.users:
        # the password is not in the web config (only its bcrypt hash): an answer at all is what can be seen
        return Health(True, f"{url}: answers (401: its state is behind basic auth)")
    return Health(False, f"{url}: {resp.status} {body}")


def main(config_path: str) -> tuple[int, str]:
    """Exit code and one line: 0 healthy, 1 unhealthy, 2 when the config or web config cannot be read."""
    try:
        health = check_health(load_config(config_path, "--config file").runtime.metrics)
    except (ConfigError, WebConfigError) as exc:
        return EXIT_INPUT.code, str(exc)
    return (EXIT_OK if health.healthy else EXIT_HOST).code, health.message
