#!/usr/bin/env bash
# Debian unstable's CPython 3.14 and 3.15 for x86-64, in a chroot (scripts/release/debian_chroot.sh):
#
#   bash scripts/release/sid_chroot.sh ensure | run DIR CMD...
exec bash "$(dirname "$0")/debian_chroot.sh" amd64:3.15 "$@"
