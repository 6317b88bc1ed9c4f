#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# Kueue's manager, kwok), helm (chart tests) and HAMi's scheduler into tools/bin/ (git-ignored).
# All but HAMi come from the pinned Go tools modules; HAMi's module is not served by the module
# proxy, so its source is the tarball ../shared/src/$HAMI_TARBALL beside the repository, pinned
# by name and sha256 below (its dependencies still come from the proxy, checked against go.sum).
#
# A binary is rebuilt only when its inputs (go.mod/go.sum, HAMi's tarball, this script's build
# settings) change: tools/bin/.stamp/<binary> records the sha256 of those inputs.
#
# Usage: bash tools/build.sh [binary ...]     (default: all)
# Env:   FORCE=1 rebuilds even when the stamps match.
#        WDRF_TOOLS_BIN=DIR builds into DIR instead of tools/bin (the tests read the same variable).
#        WDRF_SHARED=DIR is the ../shared folder (default: the one beside the repository).
set -euo pipefail

TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN="${WDRF_TOOLS_BIN:-$TOOLS/bin}"
STAMPS="$BIN/.stamp"
SHARED="${WDRF_SHARED:-$TOOLS/../../shared}"
export CGO_ENABLED=0 GOTOOLCHAIN=local
# HAMi v2.10.0 (commit 4707fb02c91c545bc7343ce26dba4c32919f9a3e), see ../shared/src/README.md.
HAMI_TARBALL=hami-v2.10.0-4707fb0.tar.gz
HAMI_SHA256=0222978e647360ac1113ac50d496266cbb1243a67756ecf9a39a3e2fb7136b68
HAMI_VERSION=v2.10.0
HAMI_REVISION=4707fb02c91c545bc7343ce26dba4c32919f9a3e
# Kueue needs sigs.k8s.io/scheduler-library, whose version is not in the public checksum
# database; go.sum pins its hash, this only matters when go.sum is regenerated.
export GONOSUMDB="${GONOSUMDB:+$GONOSUMDB,}sigs.k8s.io/scheduler-library"

die() {
  echo "tools/build.sh: ERROR: $*" >&2
  exit 1
}
log() { echo "tools/build.sh: $*"; }

command -v go >/dev/null 2>&1 ||
  die "what is missing: the 'go' command (Go >= 1.26) is not on PATH ($PATH). Install Go 1.26 to build the test control plane."

# binary -> "module-dir package"
declare -A SPEC=(
  [etcd]="etcd go.etcd.io/etcd/server/v3"
  [kube-apiserver]="k8s k8s.io/kubernetes/cmd/kube-apiserver"
  [kueue]="kueue sigs.k8s.io/kueue/cmd/kueue"
  [kube-controller-manager]="k8s k8s.io/kubernetes/cmd/kube-controller-manager"
  [kube-scheduler]="k8s k8s.io/kubernetes/cmd/kube-scheduler"
  [kwok]="kwok sigs.k8s.io/kwok/cmd/kwok"
  [helm]="helm helm.sh/helm/v3/cmd/helm"
  [hami-scheduler]="- ./cmd/scheduler"
)
ORDER=(etcd kube-apiserver kueue kube-controller-manager kube-scheduler kwok helm hami-scheduler)

modversion() { # <module-dir> <module path>: the required version, read from go.mod
  local v
  v="$(awk -v m="$2" '($1 == m) {print $2; exit} ($1 == "require" && $2 == m) {print $3; exit}' \
    "$TOOLS/$1/go.mod")"
  [[ -n "$v" ]] || die "tools/$1/go.mod does not require $2"
  echo "$v"
}

ldflags_for() { # <binary>
  local flags="-s -w" v minor
  case "$1" in
  kube-*)
    v="$(modversion k8s k8s.io/kubernetes)"
    minor="$(echo "$v" | cut -d. -f2)"
    flags+=" -X k8s.io/component-base/version.gitVersion=$v"
    flags+=" -X k8s.io/component-base/version.gitMajor=1"
    flags+=" -X k8s.io/component-base/version.gitMinor=$minor"
    flags+=" -X k8s.io/component-base/version.gitTreeState=clean"
    flags+=" -X k8s.io/client-go/pkg/version.gitVersion=$v"
    ;;
  kueue)
    flags+=" -X sigs.k8s.io/kueue/pkg/version.GitVersion=$(modversion kueue sigs.k8s.io/kueue)"
    ;;
  kwok)
    flags+=" -X sigs.k8s.io/kwok/pkg/consts.Version=$(modversion kwok sigs.k8s.io/kwok)"
    ;;
  helm)
    flags+=" -X helm.sh/helm/v3/internal/version.version=$(modversion helm helm.sh/helm/v3)"
    flags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    ;;
  hami-scheduler)
    flags+=" -X github.com/Project-HAMi/HAMi/pkg/version.version=$HAMI_VERSION"
    flags+=" -X github.com/Project-HAMi/HAMi/pkg/version.revision=$HAMI_REVISION"
    ;;
  esac
  echo "$flags"
}

stamp_of() { # <binary> <module-dir> <ldflags>
  { cat "$TOOLS/$2/go.mod" "$TOOLS/$2/go.sum"; echo "$3 $(go env GOVERSION)"; } | sha256sum | cut -d' ' -f1
}

ensure_modules() { # <module-dir>: download what the module needs, or say what is missing
  local out
  if ! out="$(cd "$TOOLS/$1" && go mod download 2>&1)"; then
    echo "$out" | tail -20 >&2
    die "what is missing: the Go modules of tools/$1 are neither in the module cache ($(go env GOMODCACHE)) nor downloadable from the Go module proxy (GOPROXY=$(go env GOPROXY)). Check network access to the module proxy."
  fi
}

hami_tarball() { # the pinned tarball's path, after checking its checksum
  local f="$SHARED/src/$HAMI_TARBALL" sum
  [[ -f "$f" ]] || die "what is missing: $f (HAMi's source; ../shared/src beside the repository, or set WDRF_SHARED)"
  sum="$(sha256sum "$f" | cut -d' ' -f1)"
  [[ "$sum" == "$HAMI_SHA256" ]] || die "$f has sha256 $sum, expected $HAMI_SHA256"
  echo "$f"
}

build_hami() { # HAMi's scheduler (extender + webhook) from the tarball
  local name=hami-scheduler flags stamp t0 tarball src out
  tarball="$(hami_tarball)"
  flags="$(ldflags_for "$name")"
  stamp="$( { echo "$HAMI_SHA256 $flags cgo"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)"
  if [[ -z "${FORCE:-}" && -x "$BIN/$name" && "$(cat "$STAMPS/$name" 2>/dev/null)" == "$stamp" ]]; then
    log "$name: up to date"
    return
  fi
  # HAMi links NVIDIA's NVML bindings, which need cgo (the library itself is only loaded at run
  # time by the device plugin, never by the scheduler).
  command -v "$(go env CC)" >/dev/null 2>&1 ||
    die "what is missing: a C compiler ($(go env CC)); HAMi's scheduler builds with cgo (Debian: apt-get install gcc)"
  src="$BIN/.src"
  rm -rf "$src" && mkdir -p "$src"
  tar -xzf "$tarball" -C "$src"
  log "$name: building ./cmd/scheduler from $HAMI_TARBALL ..."
  t0=$SECONDS
  if ! out="$(cd "$src/hami" && go mod download 2>&1)"; then
    echo "$out" | tail -20 >&2
    die "what is missing: the Go modules HAMi needs are neither in the module cache ($(go env GOMODCACHE)) nor downloadable from the Go module proxy (GOPROXY=$(go env GOPROXY))."
  fi
  # (NVML's header marks many calls deprecated: those warnings say nothing about this build)
  (cd "$src/hami" && CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -trimpath -buildvcs=false -o "$BIN/$name.tmp" -ldflags "$flags" ./cmd/scheduler) ||
    die "building $name failed (see the go output above)"
  mv -f "$BIN/$name.tmp" "$BIN/$name"
  rm -rf "$src"
  echo "$stamp" >"$STAMPS/$name"
  log "$name: built in $((SECONDS - t0)) s ($(du -h "$BIN/$name" | cut -f1))"
}

build_one() { # <binary>
  local name="$1" dir pkg flags stamp t0
  if [[ "$name" == hami-scheduler ]]; then
    build_hami
    return
  fi
  read -r dir pkg <<<"${SPEC[$name]}"
  [[ -f "$TOOLS/$dir/go.sum" ]] || die "what is missing: tools/$dir/go.sum (run 'go mod tidy' in tools/$dir)"
  flags="$(ldflags_for "$name")"
  stamp="$(stamp_of "$name" "$dir" "$flags")"
  if [[ -z "${FORCE:-}" && -x "$BIN/$name" && "$(cat "$STAMPS/$name" 2>/dev/null)" == "$stamp" ]]; then
    log "$name: up to date"
    return
  fi
  ensure_modules "$dir"
  log "$name: building $pkg (tools/$dir) ..."
  t0=$SECONDS
  (cd "$TOOLS/$dir" && go build -o "$BIN/$name.tmp" -ldflags "$flags" "$pkg") ||
    die "building $name failed (see the go output above)"
  mv -f "$BIN/$name.tmp" "$BIN/$name"
  echo "$stamp" >"$STAMPS/$name"
  log "$name: built in $((SECONDS - t0)) s ($(du -h "$BIN/$name" | cut -f1))"
}

mkdir -p "$BIN" "$STAMPS"
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${ORDER[@]}")
start=$SECONDS
for t in "${targets[@]}"; do
  [[ -n "${SPEC[$t]:-}" ]] || die "unknown binary '$t' (known: ${ORDER[*]})"
  build_one "$t"
done
log "done in $((SECONDS - start)) s; binaries in $BIN"
