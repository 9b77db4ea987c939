#!/usr/bin/env bash
# CPython 3.14 and 3.15 for a machine that has neither: Debian unstable ("sid") packages both
# (python3.14, python3.15), built against a newer glibc than the host's, so they run in a
# chroot of sid. Made once with debootstrap (about 1-2 minutes and 700 MB) and cached outside
# the repository; later calls reuse it.
#
#   bash scripts/release/sid_chroot.sh ensure            create the chroot when it is missing, print its path
#   bash scripts/release/sid_chroot.sh run DIR CMD...    run CMD as root in the chroot, in DIR (a host
#                                                directory, bind-mounted at the same path)
#
# CYCTX_SID_CHROOT picks the directory (default /work/cache/sid-chroot, else ~/.cache/...).
# `run` uses a private mount namespace (unshare), so /proc, /dev/shm, /tmp and the bind mounts
# it makes (DIR, and the host's /etc/ssl/certs, which pip there then trusts) vanish with the
# command: nothing is left mounted on the host, even after a kill.
# Needs root, debootstrap (installed with apt-get when missing) and Debian's package mirror.
set -euo pipefail
if [ -n "${CYCTX_SID_CHROOT:-}" ]; then CH=$CYCTX_SID_CHROOT
elif [ -d /work ] && [ -w /work ]; then CH=/work/cache/sid-chroot
else CH=${XDG_CACHE_HOME:-$HOME/.cache}/cyctx/sid-chroot
fi
MIRROR=${CYCTX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The interpreters, their headers (the build and the suite compile extensions), a compiler and
# pip's certificates.
# A machine whose clock is ahead of the mirror's signing date would see sid's Release file
# as expired; its signature is still checked.
APT_OPTS="-o Acquire::Check-Valid-Until=false"
PACKAGES="python3.14 python3.14-venv python3.14-dev python3.15 python3.15-venv python3.15-dev g++ ca-certificates"

ensure() {
    [ -f "$CH/.cyctx-ready" ] && return 0
    [ "$(id -u)" = 0 ] || { echo "sid_chroot: making the chroot needs root" >&2; exit 1; }
    command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; } >&2
    echo "sid_chroot: creating $CH (debootstrap --variant=minbase sid)" >&2
    rm -rf "$CH.tmp"
    mkdir -p "$(dirname "$CH")"
    debootstrap --variant=minbase sid "$CH.tmp" "$MIRROR" >"$CH.log" 2>&1 || { tail -20 "$CH.log" >&2; exit 1; }
    cp /etc/resolv.conf "$CH.tmp/etc/resolv.conf"
    unshare --mount --propagation private sh -c "
        mount -t proc proc '$CH.tmp/proc' &&
        chroot '$CH.tmp' sh -c 'apt-get \$0 update -q && DEBIAN_FRONTEND=noninteractive apt-get \$0 install -y -q --no-install-recommends $PACKAGES && apt-get clean' '$APT_OPTS'
    " >>"$CH.log" 2>&1 || { tail -20 "$CH.log" >&2; exit 1; }
    touch "$CH.tmp/.cyctx-ready"
    rm -rf "$CH"
    mv "$CH.tmp" "$CH"  # only a complete chroot gets the final name
    echo "sid_chroot: ready: $(chroot "$CH" python3.15 --version), $(chroot "$CH" python3.14 --version), $(chroot "$CH" ldd --version | head -1)" >&2
}

case "${1:-}" in
    ensure)
        ensure
        echo "$CH"
        ;;
    run)
        ensure
        dir=$(realpath "${2:?usage: sid_chroot.sh run DIR CMD...}")
        shift 2
        cp /etc/resolv.conf "$CH/etc/resolv.conf"
        # The host's pip settings name host paths (find-links, constraints): not inside.
        exec env -u PIP_FIND_LINKS -u PIP_CONSTRAINT -u PYTHONPATH -u VIRTUAL_ENV \
            unshare --mount --propagation private bash -c '
            set -e
            ch=$1 dir=$2; shift 2
            mount -t proc proc "$ch/proc"
            mount -t tmpfs tmpfs "$ch/dev/shm" 2>/dev/null || { mkdir -p "$ch/dev/shm" && mount -t tmpfs tmpfs "$ch/dev/shm"; }
            mount -t tmpfs tmpfs "$ch/tmp"
            mkdir -p "$ch$dir"
            mount --bind "$dir" "$ch$dir"
            # Trust what the host trusts (a proxy of the network may re-sign what pip fetches).
            mount --bind -o ro /etc/ssl/certs "$ch/etc/ssl/certs"
            cd /
            exec chroot "$ch" env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
                HOME=/root TMPDIR=/tmp bash -c "cd \"\$0\" && exec \"\$@\"" "$dir" "$@"
        ' _ "$CH" "$dir" "$@"
        ;;
    *)
        echo "usage: sid_chroot.sh ensure | run DIR CMD..." >&2
        exit 2
        ;;
esac
