#!/usr/bin/env bash
# Builds the Debian package: the release binary, its man pages and shell completions (both
# generated from the CLI definition: `rmemfs manpages`, `rmemfs completions`), then `cargo deb`
# with the layout in Cargo.toml's [package.metadata.deb]. Prints the .deb's path last.
#
#   tools/package.sh            # target/debian/rmemfs_VERSION-1_ARCH.deb
#   dpkg -i target/debian/rmemfs_*.deb
#
# Installs cargo-deb (cargo install --locked) when missing. Needs only Rust, dpkg and strip
# (binutils, which Rust's linker needs anyway).
# `lintian target/debian/rmemfs_*.deb` finds nothing to report (checked with Debian 12's).
# RMEMFS_PACKAGE_BIN=PATH packages that binary, built already, instead of building the release
# one (the package's test in mount-tests/ops.sh packages the test command's build: the same
# layout, without a second build of the whole crate).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo deb --version >/dev/null 2>&1; then
  echo "== installing cargo-deb" >&2
  cargo install cargo-deb --locked >&2
fi
bin=${RMEMFS_PACKAGE_BIN:-}
if [ -z "$bin" ]; then
  echo "== building the release binary" >&2
  cargo build --release >&2
  bin=target/release/rmemfs
fi
dist=target/dist
rm -rf "$dist"
mkdir -p "$dist/man" "$dist/completions"
# The binary the package holds (Cargo.toml's assets name this path), stripped as Debian's
# dh_strip does: the package carries no debug information (the release profile keeps some
# for profiling builds from source). cargo deb's --strip only strips what it built.
strip --strip-unneeded --remove-section=.comment --remove-section=.note -o "$dist/rmemfs" "$bin"
"$dist/rmemfs" manpages "$dist/man"
gzip -9n "$dist"/man/*.1
"$dist/rmemfs" completions bash >"$dist/completions/rmemfs"
"$dist/rmemfs" completions zsh >"$dist/completions/_rmemfs"
"$dist/rmemfs" completions fish >"$dist/completions/rmemfs.fish"
echo "== cargo deb" >&2
cargo deb --no-build -q >&2
ls -t target/debian/rmemfs_*.deb | head -n 1
