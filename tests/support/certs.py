"""Test PKI made at runtime with the ``openssl`` command: one CA, one serving certificate for
127.0.0.1/localhost (used by kube-apiserver and Kueue's webhook/metrics servers), one RSA
key for service-account token signing, and the aggregation layer's front-proxy CA with the
client certificate kube-apiserver presents to extension API servers (Kueue's visibility server).

:func:`shared_serving_cert` makes (once per machine) the visibility server's certificate in
the fixed folder Kueue reads it from."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
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
    front_proxy_ca_crt: Path
    front_proxy_crt: Path
    front_proxy_key: Path

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


EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
FRONT_PROXY_CLIENT = "front-proxy-client"


def _ca(d: Path, stem: str, cn: str) -> None:
    _openssl("req", "-x509", *EC, "-keyout", str(d / f"{stem}.key"),
             "-out", str(d / f"{stem}.crt"), "-days", "3650", "-subj", f"/CN={cn}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")


def _leaf(d: Path, stem: str, ca: str, cn: str, ext: str) -> None:
    _openssl("req", *EC, "-keyout", str(d / f"{stem}.key"), "-out", str(d / f"{stem}.csr"),
             "-subj", f"/CN={cn}")
    (d / f"{stem}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", str(d / f"{stem}.csr"), "-CA", str(d / f"{ca}.crt"),
             "-CAkey", str(d / f"{ca}.key"), "-CAcreateserial", "-out", str(d / f"{stem}.crt"),
             "-days", "3650", "-extfile", str(d / f"{stem}.ext"))


def make_pki(directory: Path) -> Pki:
    """Create a CA, a serving certificate (SAN IP 127.0.0.1, DNS localhost), an SA key, and a
    front-proxy CA with its client certificate (CN ``front-proxy-client``)."""
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    _ca(d, "ca", "wdrf-test-ca")
    _leaf(d, "tls", "ca", "127.0.0.1",
          "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
          "extendedKeyUsage=serverAuth,clientAuth\n"
          "keyUsage=critical,digitalSignature,keyEncipherment\n")
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", str(d / "sa.key"))
    _ca(d, "front-proxy-ca", "wdrf-test-front-proxy-ca")
    _leaf(d, "front-proxy-client", "front-proxy-ca", FRONT_PROXY_CLIENT,
          "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n")
    return Pki(d / "ca.crt", d / "ca.key", d / "tls.crt", d / "tls.key", d / "sa.key",
               d / "front-proxy-ca.crt", d / "front-proxy-client.crt",
               d / "front-proxy-client.key")


def _verifies(ca: Path, crt: Path, key: Path, dns_names: tuple[str, ...]) -> bool:
    """Whether ``crt`` chains to ``ca``, is valid for 30 more days, names every DNS name, and
    ``key`` is its private key."""
    exe = shutil.which("openssl")
    if exe is None or not (ca.is_file() and crt.is_file() and key.is_file()):
        return False

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], capture_output=True, text=True, check=False)

    ok = run("verify", "-CAfile", str(ca), str(crt)).returncode == 0
    ok = ok and run("x509", "-in", str(crt), "-noout",
                    "-checkend", str(30 * 86400)).returncode == 0
    ok = ok and all(run("x509", "-in", str(crt), "-noout", "-checkhost", n).stdout.strip()
                    .endswith("does match certificate") for n in dns_names)
    if not ok:
        return False
    pub_crt = run("x509", "-in", str(crt), "-noout", "-pubkey").stdout
    pub_key = run("pkey", "-in", str(key), "-pubout").stdout
    return bool(pub_crt) and pub_crt == pub_key


def shared_serving_cert(directory: Path, dns_names: tuple[str, ...]) -> Path:
    """A serving certificate ``tls.crt``/``tls.key`` in ``directory`` for ``dns_names`` (and
    127.0.0.1), signed by ``ca.crt`` there; returns the CA's path.

    For a folder every plane on the machine shares (Kueue reads its visibility server's
    certificate from the fixed path ``/visibility``, and reloads it when the files change):
    made once under a file lock and reused while valid, so concurrent planes never swap the
    certificate under a running Kueue. The CA key is not kept."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, crt, key = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _verifies(ca, crt, key, dns_names):
            return ca
        with tempfile.TemporaryDirectory(prefix="wdrf-shared-cert-") as tmp:
            t = Path(tmp)
            _ca(t, "ca", "wdrf-test-shared-ca")
            san = ",".join([f"DNS:{n}" for n in dns_names] + ["IP:127.0.0.1"])
            _leaf(t, "tls", "ca", dns_names[0],
                  f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n"
                  "keyUsage=critical,digitalSignature,keyEncipherment\n")
            # key before certificate, each replaced atomically: a reader never sees a
            # certificate whose key is not there yet
            for name in ("ca.crt", "tls.key", "tls.crt"):
                part = directory / f".{name}.{os.getpid()}"
                shutil.copyfile(t / name, part)
                if name == "tls.key":
                    os.chmod(part, 0o600)
                part.replace(directory / name)
        return ca
