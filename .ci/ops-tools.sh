#!/usr/bin/env bash
# The real operations tools the ops tests (tests/ops) run, installed or built from the
# project's own files and cached under $HOME, so a warm run only checks they are there:
#
#   apt:   etcd-server prometheus (promtool) podman buildah skopeo umoci debootstrap runc chromium (the console browser test)
#   go:    helm (go install), kube-apiserver / kube-controller-manager / kube-scheduler
#          (the wrapper module tools/kube), kwok (go install) + its stage file
#   image: localhost/debian-py:bookworm, an offline Debian base for podman (debootstrap,
#          the rootfs tarball cached)
#   podman: /etc/containers/containers.conf for rootful podman on this machine kind
#
# Binaries land in ~/.cache/harness/bin; tests/ops/tools.py finds them there. Any step
# that fails fails this script (set -e), and with it the CI run.
# Prints how long each step took.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${HARNESS_CACHE:-$HOME/.cache/harness}"
BIN="$CACHE/bin"
HELM_VERSION=v3.22.0
KWOK_VERSION=v0.8.0
KUBE_VERSION=v1.33.13
BASE_IMAGE=localhost/debian-py:bookworm
mkdir -p "$BIN" "$CACHE/images"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

step() {  # step NAME COMMAND...: run it, print its time
  local name=$1 started
  shift
  started=$(date +%s)
  "$@"
  echo "ops-tools: $name ok ($(($(date +%s) - started)) s)"
}

apt_packages() {
  local want=(etcd-server prometheus podman buildah skopeo umoci debootstrap runc chromium)
  local missing=()
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  # Debian starts these as services on install: the tests run their own instances.
  for svc in etcd prometheus; do
    if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
      systemctl stop "$svc" || true
    fi
  done
}

go_toolchain() {
  if ! command -v go >/dev/null; then
    echo "ops-tools: no Go toolchain (go >= 1.24 is needed to build helm, kube and kwok)" >&2
    return 1
  fi
}

helm_bin() {
  if [[ -x "$BIN/helm" ]] && "$BIN/helm" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; then
    return 0
  fi
  # `go install` builds without the release's link flags (helm's Makefile): name the version
  # and the Kubernetes version of the client-go it is built with, else helm takes the
  # cluster for a v1.20 one and refuses a chart that needs >= 1.25 without --kube-version.
  local dir minor flags
  dir=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  minor=$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9][0-9]*\)\..*/\1/p' "$dir/go.mod")
  [[ -n "$minor" ]] || { echo "ops-tools: no k8s.io/client-go version in $dir/go.mod" >&2; return 1; }
  flags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in pkg/chartutil pkg/lint/rules; do
    flags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor"
  done
  GOBIN="$BIN" go install -ldflags "$flags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

kube_bins() {
  local out="$CACHE/kube-$KUBE_VERSION" stamp
  stamp="$out/.built-from-$(sha256sum tools/kube/go.mod tools/kube/go.sum tools/kube/tools.go | sha256sum | cut -c1-16)"
  if [[ -f "$stamp" ]]; then
    return 0
  fi
  mkdir -p "$out"
  (cd tools/kube && go build -trimpath \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
      -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=33" \
    -o "$out/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler)
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    ln -sf "$out/$b" "$BIN/$b"
  done
  touch "$stamp"
}

kwok_bin() {
  local stage="$CACHE/kwok-$KWOK_VERSION-stages.yaml"
  if [[ ! -x "$BIN/kwok" ]] || ! "$BIN/kwok" --version 2>/dev/null | grep -q "${KWOK_VERSION#v}"; then
    GOBIN="$BIN" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  fi
  if [[ ! -s "$stage" ]]; then
    local src
    src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
    if [[ ! -d "$src" ]]; then
      go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" >/dev/null
    fi
    : >"$stage.tmp"
    for f in "$src"/node/fast/*.yaml "$src"/node/heartbeat/*.yaml "$src"/pod/fast/*.yaml; do
      [[ "$(basename "$f")" == kustomization.yaml ]] && continue
      { echo "---"; cat "$f"; } >>"$stage.tmp"
    done
    mv "$stage.tmp" "$stage"
  fi
}

podman_config() {
  local conf=/etc/containers/containers.conf
  if [[ ! -f "$conf" ]] || ! grep -q 'cgroup_manager = "cgroupfs"' "$conf"; then
    mkdir -p /etc/containers
    cat >"$conf" <<'CONF'
# Written by durable-harness .ci/ops-tools.sh: rootful podman without systemd.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
CONF
  fi
}

debian_mirror() {
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  if [[ -z "$uri" ]]; then
    uri=$(awk '/^deb / && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

base_image() {
  local tarball="$CACHE/images/debian-py-bookworm.tar" rootfs
  if podman image exists "$BASE_IMAGE"; then
    return 0
  fi
  if [[ ! -s "$tarball" ]]; then
    rootfs=$(mktemp -d "$CACHE/images/rootfs.XXXXXX")
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm "$rootfs" "$(debian_mirror)"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
  fi
  podman import --change 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
}

# Arguments: only these steps (e.g. `.ci/ops-tools.sh base_image`); none: all of them.
steps=("${@:-apt_packages go_toolchain podman_config helm_bin kwok_bin kube_bins base_image}")
for s in ${steps[*]}; do
  step "$s" "$s"
done
