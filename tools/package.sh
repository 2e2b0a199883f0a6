#!/usr/bin/env bash
# Builds the Debian package: the release binary, its man pages and shell completions (both
# generated from the CLI definition: `rmemfs manpages`, `rmemfs completions`), then `cargo deb`
# with the layout in Cargo.toml's [package.metadata.deb]. Prints the .deb's path last.
#
#   tools/package.sh            # target/debian/rmemfs_VERSION-1_ARCH.deb
#   dpkg -i target/debian/rmemfs_*.deb
#
# Installs cargo-deb (cargo install --locked) when missing. Needs only Rust and dpkg.
# `lintian target/debian/rmemfs_*.deb` finds nothing to report (checked with Debian 12's).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo deb --version >/dev/null 2>&1; then
  echo "== installing cargo-deb" >&2
  cargo install cargo-deb --locked >&2
fi
echo "== building the release binary" >&2
cargo build --release >&2
dist=target/dist
rm -rf "$dist"
mkdir -p "$dist/man" "$dist/completions"
target/release/rmemfs manpages "$dist/man"
gzip -9n "$dist"/man/*.1
target/release/rmemfs completions bash >"$dist/completions/rmemfs"
target/release/rmemfs completions zsh >"$dist/completions/_rmemfs"
target/release/rmemfs completions fish >"$dist/completions/rmemfs.fish"
echo "== cargo deb" >&2
# Stripped: the package carries no debug information (the release profile keeps some for
# profiling builds from source).
cargo deb --no-build --strip -q >&2
ls -t target/debian/rmemfs_*.deb | head -n 1
