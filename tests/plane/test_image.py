"""The Dockerfile builds an image that runs: built with buildah (Debian's package; no Docker
engine and no container registry here), on a base image made from Debian packages
(debootstrap bookworm + python3.11, standing in for python:3.11-slim-bookworm, passed as the
Dockerfile's PYTHON_IMAGE build argument). In the image, as UID 65532 like the Deployment:
`--dry-run --from-file` prints the plan, and `--health-check` against the test plane is healthy.

Run by `make test` and `make image-test` (2 min with the base image cached, about 3.5 min
without; a bare `pytest` leaves it out); buildah and debootstrap come from `make image-tools`.
The base image is kept in buildah's storage between runs (made again when missing, about 80 s).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.plane import Plane

pytestmark = [pytest.mark.plane, pytest.mark.image]

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/wdrf-debian-python:bookworm"
IMAGE = "localhost/wdrf-controller:test"
# The machine's CA bundle goes into the base image: pip inside the build must trust the same
# TLS endpoints (e.g. an egress proxy) as pip outside it.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONTEXT_FILES = ("Dockerfile", "requirements.lock", "pyproject.toml", "README.md")


def buildah(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", "--storage-driver", "vfs", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def make_base(tmp: Path) -> None:
    rootfs = tmp / "rootfs"
    r = subprocess.run(["debootstrap", "--variant=minbase",
                        "--include=python3,python3-venv,python-is-python3,ca-certificates",
                        "bookworm", str(rootfs), "http://deb.debian.org/debian"],
                       capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, "debootstrap failed:\n" + (r.stdout + r.stderr)[-3000:]
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (rootfs / junk).glob("*"):
            if f.is_file():
                f.unlink()
    if CA_BUNDLE.exists():
        shutil.copy(CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
    tar = tmp / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True, timeout=300)
    ctr = ok(buildah("from", "scratch")).strip()
    ok(buildah("add", ctr, str(tar), "/"))
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    ok(buildah("config", "--env", f"PATH={path}",
               "--env", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt", ctr))
    ok(buildah("commit", "--rm", ctr, BASE))


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for tool in ("buildah", "debootstrap"):
        assert shutil.which(tool), (f"{tool} is not installed: `make image-tools` installs "
                                    "Debian's buildah and debootstrap packages")
    tmp = tmp_path_factory.mktemp("image")
    if buildah("inspect", "--type", "image", BASE).returncode != 0:
        make_base(tmp)
    context = tmp / "context"
    context.mkdir()
    for name in CONTEXT_FILES:
        shutil.copy(ROOT / name, context / name)
    shutil.copytree(ROOT / "controller", context / "controller",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    t0 = time.monotonic()
    ok(buildah("bud", "--isolation", "chroot", "--network", "host", "--build-arg",
               f"PYTHON_IMAGE={BASE}", "-t", IMAGE, str(context), timeout=900))
    print(f"image built in {time.monotonic() - t0:.0f} s")
    try:
        yield IMAGE
    finally:
        buildah("rmi", "-f", IMAGE)


def run_in(image: str, *args: str, volumes: tuple[str, ...] = (),
           env: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`buildah run` of the image's entrypoint with `args`, as the image's user."""
    cmd = ["run", "--isolation", "chroot", "--network", "host"]
    for v in volumes:
        cmd += ["-v", v]
    for e in env:
        cmd += ["--env", e]
    ctr = ok(buildah("from", image)).strip()
    try:
        user = ok(buildah("inspect", "--format", "{{.OCIv1.Config.User}}", image)).strip()
        entry = ok(buildah("inspect", "--format", "{{.OCIv1.Config.Entrypoint}}", image))
        assert entry.strip() == "[python -m controller]", entry
        return buildah(*cmd, "--user", user, ctr, "--", "python", "-m", "controller", *args,
                       timeout=300)
    finally:
        buildah("rm", ctr)


def test_image_runs_non_root_with_only_the_runtime_deps(image: str) -> None:
    user = ok(buildah("inspect", "--format", "{{.OCIv1.Config.User}}", image)).strip()
    assert user == "65532:65532"
    r = run_in(image, "--help")
    assert r.returncode == 0 and "WDRF controller" in r.stdout, r.stdout + r.stderr


def test_dry_run_from_file_in_the_image(image: str) -> None:
    r = run_in(image, "--dry-run", "--from-file", "/examples/cluster-snapshot.yaml",
               volumes=(f"{ROOT / 'examples'}:/examples:ro",))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Plan at " in r.stdout and "pending workload" in r.stdout, r.stdout[:2000]


def test_health_check_in_the_image_against_the_plane(
    image: str, plane: Plane, tmp_path: Path
) -> None:
    # the plane's admin kubeconfig and CA, mounted at /kube (host network: same server URL)
    kube_dir = tmp_path / "kube"
    kube_dir.mkdir()
    shutil.copy(plane.pki.ca_crt, kube_dir / "ca.crt")
    kc = yaml.safe_load(plane.kubeconfig.read_text())
    kc["clusters"][0]["cluster"]["certificate-authority"] = "/kube/ca.crt"
    (kube_dir / "config").write_text(yaml.safe_dump(kc))
    kube_dir.chmod(0o755)
    for f in kube_dir.iterdir():
        f.chmod(0o644)  # readable by UID 65532
    r = run_in(image, "--health-check", volumes=(f"{kube_dir}:/kube:ro",),
               env=("KUBECONFIG=/kube/config",))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "HEALTHY" in r.stdout and "[OK  ] Kueue API served" in r.stdout, r.stdout
