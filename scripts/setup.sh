#!/usr/bin/env bash
# Installs what `make test` and `make demo` need on a fresh Debian/Ubuntu machine:
# the NBD clients, peers, fio, iproute2 and a font from apt, and checks for
# the Rust toolchain.
set -euo pipefail

need_pkgs=()
have() { command -v "$1" >/dev/null 2>&1; }
have fio || need_pkgs+=(fio)
have nbdinfo || need_pkgs+=(libnbd-bin)
have qemu-img || need_pkgs+=(qemu-utils)
have nbdkit || need_pkgs+=(nbdkit)
have python3 || need_pkgs+=(python3)
have ip || need_pkgs+=(iproute2)
have openssl || need_pkgs+=(openssl)
have tc || need_pkgs+=(iproute2)
# tests/block_device.rs attaches a loop device.
have losetup || need_pkgs+=(mount)
# tests/file_images.rs makes an image immutable.
have chattr || need_pkgs+=(e2fsprogs)
# The bench's PNG plots draw text with this font.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_pkgs+=(fonts-dejavu-core)

if ((${#need_pkgs[@]})); then
    echo "setup: installing ${need_pkgs[*]}"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        if have sudo; then SUDO=sudo; else
            echo "setup: need root to install: apt-get install ${need_pkgs[*]}" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! have cargo; then
    [ -x "$HOME/.cargo/bin/cargo" ] && exit 0
    echo "setup: no Rust toolchain. Install it with rustup (https://rustup.rs):" >&2
    echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
    echo "or from Debian: apt-get install cargo rustc (needs Rust >= 1.80)" >&2
    exit 1
fi
