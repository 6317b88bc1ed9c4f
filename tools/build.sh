#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# Kueue's manager, kwok) and helm (chart tests) from the pinned Go tools modules into tools/bin/
# (git-ignored).
#
# A binary is rebuilt only when its module's go.mod/go.sum (or this script's build settings)
# change: tools/bin/.stamp/<binary> records the sha256 of those inputs.
#
# Usage: bash tools/build.sh [binary ...]     (default: all)
# Env:   FORCE=1 rebuilds even when the stamps match.
set -euo pipefail

TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN="$TOOLS/bin"
STAMPS="$BIN/.stamp"
export CGO_ENABLED=0 GOTOOLCHAIN=local
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
)
ORDER=(etcd kube-apiserver kueue kube-controller-manager kube-scheduler kwok helm)

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

build_one() { # <binary>
  local name="$1" dir pkg flags stamp t0
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
