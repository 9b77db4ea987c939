#!/usr/bin/env bash
# CPythons that this machine lacks, from Debian's packages, in a chroot of the Debian release
# that packages them: x86-64 (amd64) 3.14 and 3.15 from Debian unstable ("sid"), built against
# a newer glibc than the host's; and aarch64 (arm64), run under emulation by qemu-user, 3.11
# from Debian 12 (bookworm) and 3.13 to 3.15 from sid. No Debian release packages an arm64
# CPython 3.12 any more, so that one is refused. Each chroot is made once with debootstrap
# (amd64: about 1-2 minutes and 700 MB; arm64, emulated: about 10 minutes) and cached outside
# the repository; later calls reuse it.
#
#   bash scripts/release/debian_chroot.sh ARCH:VERSION ensure           make the chroot when missing, print its path
#   bash scripts/release/debian_chroot.sh ARCH:VERSION run DIR CMD...   run CMD as root in it, in DIR (a host
#                                                                   directory, bind-mounted at the same path)
#   bash scripts/release/debian_chroot.sh ARCH:VERSION packaged         exit 0 when a Debian release packages it
# e.g. amd64:3.15, arm64:3.11. The chroots live in CYCTX_CHROOT_CACHE (default /work/cache, else
# ~/.cache/cyctx); CYCTX_SID_CHROOT names amd64's sid one. `run` uses a private mount namespace
# (unshare), so /proc, /dev/shm, /tmp and the bind mounts it makes (DIR, and the host's
# /etc/ssl/certs, which pip there then trusts) vanish with the command: nothing is left mounted
# on the host, even after a kill.
# Needs root, debootstrap (installed with apt-get when missing) and Debian's package mirror;
# for arm64 also qemu-user-static registered with binfmt_misc (installed, mounted and enabled
# here when missing), whose fix-binary flag lets the emulator run inside the chroot.
set -euo pipefail
spec=${1:?usage: debian_chroot.sh ARCH:VERSION ensure | run DIR CMD... | packaged}
ARCH=${spec%%:*} VERSION=${spec#*:}
shift
case "$ARCH:$VERSION" in
    amd64:3.14 | amd64:3.15) SUITE=sid VERSIONS="3.14 3.15" ;;
    arm64:3.11) SUITE=bookworm VERSIONS="3.11" ;;
    arm64:3.13 | arm64:3.14 | arm64:3.15) SUITE=sid VERSIONS="3.13 3.14 3.15" ;;
    *) SUITE= ;;
esac
if [ "${1:-}" = packaged ]; then [ -n "$SUITE" ]; exit; fi
[ -n "$SUITE" ] || { echo "debian_chroot: no Debian release packages CPython $VERSION for $ARCH" >&2; exit 2; }
if [ -n "${CYCTX_CHROOT_CACHE:-}" ]; then CACHE=$CYCTX_CHROOT_CACHE
elif [ -d /work ] && [ -w /work ]; then CACHE=/work/cache
else CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/cyctx
fi
if [ "$ARCH" = amd64 ]; then CH=${CYCTX_SID_CHROOT:-$CACHE/$SUITE-chroot}; else CH=$CACHE/$SUITE-$ARCH-chroot; fi
MIRROR=${CYCTX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The interpreters, their headers (the build and the suite compile extensions), a compiler and
# pip's certificates.
# A machine whose clock is ahead of the mirror's signing date would see sid's Release file
# as expired; its signature is still checked.
APT_OPTS="-o Acquire::Check-Valid-Until=false"
PACKAGES="g++ ca-certificates"
for v in $VERSIONS; do PACKAGES="$PACKAGES python$v python$v-venv python$v-dev"; done

emulation() {  # a foreign ARCH runs under qemu-user through binfmt_misc
    [ "$ARCH" != "$(dpkg --print-architecture)" ] || return 0
    local q=aarch64  # the only foreign ARCH above
    if ! grep -qx enabled "/proc/sys/fs/binfmt_misc/qemu-$q" 2>/dev/null; then
        echo "debian_chroot: registering qemu-$q with binfmt_misc" >&2
        mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        command -v "qemu-$q-static" >/dev/null || [ -e /usr/share/binfmts/qemu-"$q" ] \
            || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static binfmt-support; } >&2
        update-binfmts --enable "qemu-$q" >&2
    fi
    grep -q '^flags:.*F' "/proc/sys/fs/binfmt_misc/qemu-$q" \
        || { echo "debian_chroot: qemu-$q is registered without the fix-binary flag (F): it cannot run in a chroot" >&2; exit 1; }
}

ensure() {
    emulation
    [ -f "$CH/.cyctx-ready" ] && return 0
    [ "$(id -u)" = 0 ] || { echo "debian_chroot: making the chroot needs root" >&2; exit 1; }
    command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; } >&2
    echo "debian_chroot: creating $CH (debootstrap --arch=$ARCH --variant=minbase $SUITE)" >&2
    rm -rf "$CH.tmp"
    mkdir -p "$(dirname "$CH")"
    debootstrap --arch="$ARCH" --variant=minbase "$SUITE" "$CH.tmp" "$MIRROR" >"$CH.log" 2>&1 || { tail -20 "$CH.log" >&2; exit 1; }
    cp /etc/resolv.conf "$CH.tmp/etc/resolv.conf"
    unshare --mount --propagation private sh -c "
        mount -t proc proc '$CH.tmp/proc' &&
        chroot '$CH.tmp' sh -c 'apt-get \$0 update -q && DEBIAN_FRONTEND=noninteractive apt-get \$0 install -y -q --no-install-recommends $PACKAGES && apt-get clean' '$APT_OPTS'
    " >>"$CH.log" 2>&1 || { tail -20 "$CH.log" >&2; exit 1; }
    touch "$CH.tmp/.cyctx-ready"
    rm -rf "$CH"
    mv "$CH.tmp" "$CH"  # only a complete chroot gets the final name
    echo "debian_chroot: ready: $CH, $(for v in $VERSIONS; do chroot "$CH" "python$v" --version; done | paste -sd, -), $(chroot "$CH" ldd --version | head -1)" >&2
}

case "${1:-}" in
    ensure)
        ensure
        echo "$CH"
        ;;
    run)
        ensure
        dir=$(realpath "${2:?usage: debian_chroot.sh ARCH:VERSION run DIR CMD...}")
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
        echo "usage: debian_chroot.sh ARCH:VERSION ensure | run DIR CMD... | packaged" >&2
        exit 2
        ;;
esac
