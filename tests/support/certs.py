"""Test PKI made at runtime with the ``openssl`` command: one CA, one serving certificate for
127.0.0.1/localhost (used by kube-apiserver and Kueue's webhook/metrics servers), and one RSA
key for service-account token signing."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import PlaneError


@dataclass(frozen=True)
class Pki:
    """Paths of the generated key material."""

    ca_crt: Path
    ca_key: Path
    serving_crt: Path
    serving_key: Path
    sa_key: Path

    @property
    def ca_pem(self) -> bytes:
        return self.ca_crt.read_bytes()


def _openssl(*args: str) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise PlaneError("what is missing: the 'openssl' command (needed to make the test PKI)")
    r = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise PlaneError(f"openssl {' '.join(args)} failed:\n{r.stderr}")


def make_pki(directory: Path) -> Pki:
    """Create a CA, a serving certificate (SAN IP 127.0.0.1, DNS localhost) and an SA key."""
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"),
             "-days", "3650", "-subj", "/CN=wdrf-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl("req", *ec, "-keyout", str(d / "tls.key"), "-out", str(d / "tls.csr"),
             "-subj", "/CN=127.0.0.1")
    ext = d / "tls.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    _openssl("x509", "-req", "-in", str(d / "tls.csr"), "-CA", str(d / "ca.crt"),
             "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "tls.crt"),
             "-days", "3650", "-extfile", str(ext))
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", str(d / "sa.key"))
    return Pki(d / "ca.crt", d / "ca.key", d / "tls.crt", d / "tls.key", d / "sa.key")
