"""Test certificates made at test time with the openssl CLI (no private key is committed).

One CA signs a server certificate (SANs localhost and 127.0.0.1) and a client certificate (SANs
DNS:scraper and a SPIFFE URI); a second CA signs a client certificate the first CA does not vouch for.
EC P-256 keys: fast to make, also in the VM under emulation. Used by the tests and by
bench/metrics_tls_cost.py: it imports nothing of tests/ or bench/, so the bench may import it without tying
itself to the tests.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

CLIENT_URI = "spiffe://cluster.local/ns/monitoring/sa/prometheus"


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_client_cert: Path  # signed by another CA
    other_client_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True, timeout=120)


def make_ca(d: Path, name: str) -> None:
    """A self-signed CA `name`.crt / `name`.key in `d`."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN={name}", cwd=d)


def leaf(d: Path, name: str, ca: str, sans: str, days: int = 2) -> tuple[Path, Path]:
    """A key and a certificate signed by CA `ca` (made by make_pki in `d`) with subjectAltName `sans`."""
    (d / f"{name}.ext").write_text(f"subjectAltName={sans}\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", str(days), "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)
    return d / f"{name}.crt", d / f"{name}.key"


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    server = leaf(d, "server", "ca", "DNS:localhost,IP:127.0.0.1,IP:::1")
    client = leaf(d, "client", "ca", f"DNS:scraper,URI:{CLIENT_URI}")
    other = leaf(d, "intruder", "other-ca", "DNS:scraper")
    return Pki(d, d / "ca.crt", *server, *client, *other)
