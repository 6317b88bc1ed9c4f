"""The Dockerfile builds an image that runs: built with buildah (Debian's package; no Docker
engine and no container registry here), on a base image made from Debian packages
(debootstrap bookworm + python3.11 and its headers, standing in for python:3.11-slim-bookworm,
passed as the Dockerfile's PYTHON_IMAGE build argument). The image is built as shipped
(COMPILED=true): its planner is compiled with mypyc in the build stage. In the image, as UID
65532 like the Deployment: the planner's modules are the compiled extensions, made from the
sources here; `--dry-run --from-file` prints the plan byte for byte as pure Python on this
machine prints it; no compiler and no mypy are left; `--health-check` against the test plane
is healthy.

Run by `make test` and `make image-test` (about 4 min with the base image cached, on 2 cores
at load 4-5: the build 1.8-2.8 min, about 1.5 min more than a pure-Python one, for apt-get,
mypy's environment and the compile; a bare `pytest` leaves it out); buildah and debootstrap
come from `make image-tools`. The base image is kept in buildah's storage between runs (made
again when missing, about 90 s).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.builders import compile_tool
from tests.support.plane import Plane

pytestmark = [pytest.mark.plane, pytest.mark.image]

ROOT = Path(__file__).resolve().parents[2]
# The tag names what is in the base: a base made before the Python headers were added is not
# reused (the compile needs them; python:3.11-slim-bookworm has them). Debian's headers package
# also brings the libc headers (through zlib1g-dev), which the slim image lacks: the build
# stage installs them either way.
BASE = "localhost/wdrf-debian-python:bookworm-headers"
IMAGE = "localhost/wdrf-controller:test"
# The machine's CA bundle goes into the base image: pip inside the build must trust the same
# TLS endpoints (e.g. an egress proxy) as pip outside it.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# What the Dockerfile copies (.dockerignore, copied too, lets only these through), and what
# the context never carries: a compiled build of this tree (the image compiles its own).
CONTEXT_FILES = (".dockerignore", "Dockerfile", "requirements.lock", "requirements-dev.lock",
                 "pyproject.toml", "README.md", "tools/compile.py")
NOT_IN_CONTEXT = ("__pycache__", "*.pyc", "*.so", ".compiled-sources")
SNAPSHOT = ROOT / "examples" / "cluster-snapshot.yaml"
# The plan's tables wrap at the terminal's width ($COLUMNS first): the same on both sides.
COLUMNS = "120"


def buildah(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", "--storage-driver", "vfs", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def make_base(tmp: Path) -> None:
    rootfs = tmp / "rootfs"
    r = subprocess.run(["debootstrap", "--variant=minbase",
                        "--include=python3,python3-venv,python-is-python3,libpython3.11-dev,"
                        "ca-certificates",
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
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, context / name)
    shutil.copytree(ROOT / "controller", context / "controller",
                    ignore=shutil.ignore_patterns(*NOT_IN_CONTEXT))
    t0 = time.monotonic()
    ok(buildah("bud", "--isolation", "chroot", "--network", "host", "--build-arg",
               f"PYTHON_IMAGE={BASE}", "-t", IMAGE, str(context), timeout=900))
    print(f"image built in {time.monotonic() - t0:.0f} s")
    try:
        yield IMAGE
    finally:
        buildah("rmi", "-f", IMAGE)


def run_argv(image: str, *argv: str, volumes: tuple[str, ...] = (),
             env: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`buildah run` of `argv` in a container of the image, as the image's user."""
    cmd = ["run", "--isolation", "chroot", "--network", "host"]
    for v in volumes:
        cmd += ["-v", v]
    for e in env:
        cmd += ["--env", e]
    ctr = ok(buildah("from", image)).strip()
    try:
        user = ok(buildah("inspect", "--format", "{{.OCIv1.Config.User}}", image)).strip()
        return buildah(*cmd, "--user", user, ctr, "--", *argv, timeout=300)
    finally:
        buildah("rm", ctr)


def run_in(image: str, *args: str, volumes: tuple[str, ...] = (),
           env: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`buildah run` of the image's entrypoint with `args`, as the image's user."""
    entry = ok(buildah("inspect", "--format", "{{.OCIv1.Config.Entrypoint}}", image))
    assert entry.strip() == "[python -m controller]", entry
    return run_argv(image, "python", "-m", "controller", *args, volumes=volumes, env=env)


def python_in(image: str, code: str, *args: str) -> object:
    """What `code`, run by the image's python as the image's user, prints as JSON."""
    r = run_argv(image, "python", "-c", code, *args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout)


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


def test_the_planner_in_the_image_is_the_compiled_build_of_these_sources(image: str) -> None:
    tool = compile_tool()
    found = python_in(image, """if True:
        import importlib, json, pathlib, sys
        mods = {m: importlib.import_module("controller." + m) for m in sys.argv[1:]}
        pkg = pathlib.Path(importlib.import_module("controller").__file__).parent
        print(json.dumps({
            "files": {m: mod.__file__ for m, mod in mods.items()},
            "loaders": {m: type(mod.__loader__).__name__ for m, mod in mods.items()},
            "stamp": (pkg / ".compiled-sources").read_text(),
            "pure": importlib.import_module("controller.cli").__file__}))
        """, *tool.MODULES)
    assert isinstance(found, dict)
    assert set(found["files"]) == set(tool.MODULES)
    for name, path in found["files"].items():
        assert path.startswith("/opt/wdrf/") and path.endswith(".so"), (name, path)
        assert found["loaders"][name] == "ExtensionFileLoader", (name, found["loaders"][name])
    # a module the compile leaves alone stays Python: the check can tell the two apart
    assert found["pure"].startswith("/opt/wdrf/") and found["pure"].endswith("/cli.py")
    # made from this tree's sources: the stamp the build wrote = their hashes computed here
    assert found["stamp"] == tool.source_hashes()


def test_the_compiled_dry_run_prints_what_pure_python_prints(
    image: str, tmp_path: Path
) -> None:
    """The plan of examples/cluster-snapshot.yaml, compiled in the image and pure Python here,
    byte for byte. Nothing in it comes from the clock: "Plan at" is the snapshot's time."""
    r = run_in(image, "--dry-run", "--from-file", "/examples/cluster-snapshot.yaml",
               volumes=(f"{SNAPSHOT.parent}:/examples:ro",), env=(f"COLUMNS={COLUMNS}",))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # Pure Python by construction: the sources alone (no .so), first on sys.path (cwd), with
    # no config.yaml and none of this environment's settings.
    shutil.copytree(ROOT / "controller", tmp_path / "controller",
                    ignore=shutil.ignore_patterns(*NOT_IN_CONTEXT))
    env = {"PATH": os.environ["PATH"], "COLUMNS": COLUMNS, "PYTHONDONTWRITEBYTECODE": "1"}

    def host(*argv: str) -> str:
        h = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300, check=False)
        assert h.returncode == 0, h.stdout[-2000:] + h.stderr[-2000:]
        return h.stdout

    policy = host("-c", "import controller.policy as m; print(m.__file__)").strip()
    assert policy == str(tmp_path / "controller" / "policy.py"), policy
    pure = host("-m", "controller", "--dry-run", "--from-file", str(SNAPSHOT))
    assert "Plan at 2025-11-20 " in pure and "pending workload" in pure, pure[:2000]
    assert r.stdout == pure


def test_no_compiler_and_no_mypy_in_the_image(image: str) -> None:
    found = python_in(image, """if True:
        import importlib.util, json, os, shutil, subprocess
        dpkg = subprocess.run(["dpkg-query", "-W", "-f=${Package}\\n"], capture_output=True,
                              text=True, check=True).stdout.split()
        print(json.dumps({
            "on_path": [c for c in ("gcc", "cc", "cpp", "gcc-12", "x86_64-linux-gnu-gcc-12")
                        if shutil.which(c)],
            "packages": sorted(set(dpkg) & {"gcc", "gcc-12", "cpp", "cpp-12", "libgcc-12-dev"}),
            "libc6": "libc6" in dpkg,
            "modules": {m: importlib.util.find_spec(m) is not None
                        for m in ("mypy", "mypyc", "yaml")},
            "opt": sorted(os.listdir("/opt"))}))
        """)
    assert isinstance(found, dict)
    assert found["on_path"] == [] and found["packages"] == [], found
    assert found["modules"] == {"mypy": False, "mypyc": False, "yaml": True}, found
    assert found["libc6"] and found["opt"] == ["wdrf"], found  # the witnesses can see
