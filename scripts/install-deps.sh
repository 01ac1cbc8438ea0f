#!/usr/bin/env bash
# Installs the Debian packages ustrain needs to build and test, when any is missing.
# Used by `make deps` (and so by the README's two commands). Quiet when everything is present.
set -e
pkgs="gcc g++ make pkg-config iproute2 libgloo-dev libyaml-dev libopenblas-openmp-dev libcjson-dev libutf8proc-dev libssl-dev libpmix-dev libzstd-dev zlib1g-dev zstd gzip openmpi-bin libopenmpi-dev python3 ${UST_EXTRA_PKGS:-}"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
