#!/usr/bin/env bash
# Builds Ringmaster's container image (deploy/container/Containerfile) with podman, from Debian's
# packages only: no registry is reached. The base image is a minimal Debian 12 root made by
# debootstrap from the mirror apt already uses, `podman import`ed once and kept.
#
#   build-image.sh [--deb FILE] [--tag NAME] [--save FILE] [--rebuild-base]
#       --deb FILE       install this .deb (from `cpack` in a build tree) instead of compiling the
#                        source tree in the image's build stage (about 20 min on 2 cores)
#       --tag NAME       the image's name (default: localhost/ringmaster:VERSION and :latest)
#       --save FILE      also write the image as an OCI archive (to load or push elsewhere)
#       --rebuild-base   debootstrap the base again even if it is there
#   build-image.sh --env
#       print the environment that points podman at this script's storage, e.g.
#       eval "$(scripts/build-image.sh --env)"; podman run --rm localhost/ringmaster ringmaster --help
#
# podman runs rootful with its own configuration and storage under RINGMASTER_PODMAN_DIR (default
# build/podman), so it changes nothing of the machine's podman: runc as the runtime, cgroupfs as the
# cgroup manager (crun refuses a hybrid cgroup layout), file limits at or below the machine's hard
# limits (podman's default of 1048576 open files is refused where the hard limit is lower), and an
# init process in every container so servers stop on SIGTERM.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
store=${RINGMASTER_PODMAN_DIR:-$root/build/podman}
base=localhost/ringmaster-base:bookworm

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# Writes the configuration (once per store) and exports the variables that select it.
podman_env() {
  mkdir -p "$store"
  store=$(cd "$store" && pwd)
  local nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [[ $nofile == unlimited || $nofile -gt 65536 ]] && nofile=65536
  # runc refuses nproc limits near the hard one on some kernels: keep well under it.
  [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
  cat > "$store/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
init = true
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$store/events.log"
tmp_dir = "$store/tmp"
static_dir = "$store/static"
volume_path = "$store/volumes"
[network]
network_config_dir = "$store/networks"
CONF
  cat > "$store/storage.conf" <<CONF
[storage]
driver = "overlay"
runroot = "$store/run"
graphroot = "$store/graph"
CONF
  export CONTAINERS_CONF=$store/containers.conf CONTAINERS_STORAGE_CONF=$store/storage.conf
}

# The bookworm mirror apt uses here (the first one serving bookworm's main), e.g.
# http://deb.debian.org/debian; RINGMASTER_DEBIAN_MIRROR overrides it.
debian_mirror() {
  if [[ -n ${RINGMASTER_DEBIAN_MIRROR:-} ]]; then echo "$RINGMASTER_DEBIAN_MIRROR"; return; fi
  apt-cache policy | awk '$3 == "bookworm/main" && $2 ~ /^https?:/ { print $2; exit }'
}

make_base() {
  local mirror tree
  mirror=$(debian_mirror)
  [[ -n $mirror ]] || { echo "build-image: no bookworm mirror in apt's sources; set RINGMASTER_DEBIAN_MIRROR" >&2; exit 1; }
  tree=$(mktemp -d "$store/rootfs.XXXXXX")
  cleanup+=("$tree")
  echo "build-image: debootstrap bookworm from $mirror" >&2
  debootstrap --variant=minbase bookworm "$tree" "$mirror" > "$store/debootstrap.log" 2>&1 ||
    { tail -20 "$store/debootstrap.log" >&2; exit 1; }
  # Security updates from the mirror apt uses for them here, if any.
  local security
  security=$(apt-cache policy | awk '$3 == "bookworm-security/main" && $2 ~ /^https?:/ { print $2; exit }')
  if [[ -n $security ]]; then
    echo "deb $security bookworm-security main" >> "$tree/etc/apt/sources.list"
  fi
  rm -rf "$tree"/var/cache/apt/archives/*.deb "$tree"/var/lib/apt/lists/*
  tar -C "$tree" -c . | podman import --message "debootstrap bookworm minbase from $mirror" - "$base" >/dev/null
  rm -rf "$tree"
}

cleanup=()
trap 'rm -rf "${cleanup[@]}"' EXIT
deb="" tag="" save="" rebuild_base=0
while (($#)); do
  case $1 in
    --deb) deb=$(realpath "$2"); shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --save) save=$(realpath -m "$2"); shift 2 ;;
    --rebuild-base) rebuild_base=1; shift ;;
    --env) podman_env; echo "export CONTAINERS_CONF=$CONTAINERS_CONF CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF"; exit 0 ;;
    *) usage ;;
  esac
done
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { echo "build-image: run as root (podman runs rootful here)" >&2; exit 1; }

podman_env
if ((rebuild_base)) || ! podman image exists "$base"; then make_base; fi

version=$(sed -n 's/^project(ringmaster VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
tags=(-t "${tag:-localhost/ringmaster:$version}")
[[ -n $tag ]] || tags+=(-t localhost/ringmaster:latest)
if [[ -n $deb ]]; then
  context=$(mktemp -d "$store/context.XXXXXX")
  cleanup+=("$context")
  cp "$deb" "$context/"
  podman build --network host --build-arg PACKAGES=prebuilt "${tags[@]}" \
    -f "$root/deploy/container/Containerfile" "$context"
else
  podman build --network host --build-arg PACKAGES=build "${tags[@]}" \
    -f "$root/deploy/container/Containerfile" "$root"
fi
if [[ -n $save ]]; then
  podman save --format oci-archive -o "$save" "${tag:-localhost/ringmaster:$version}"
fi
echo "build-image: built ${tag:-localhost/ringmaster:$version}" >&2
