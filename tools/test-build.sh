# shellcheck shell=bash
# The one build every tier of the test command runs from (sourced by tools/test.sh and
# tools/test-rxe.sh): the whole workspace, every target, in cargo's `test` profile (opt-level
# 2 with debug assertions and overflow checks, line tables), with the `testing` hooks and the
# verbs fabric. One cargo invocation with one feature set builds the library once for
# everything: the unit and integration tests, the `rmemfs` binary the real mounts run
# (target/debug/rmemfs), the C library (target/debug/librmemfs_c.so) and the test binaries the
# rxe VM runs. Separate builds (a release binary for the mounts, a verbs build for the VM)
# compiled the library three times over, about 1,000 CPU-seconds of the command's budget.
# Same flags for `cargo build` and `cargo test`: with fewer targets or packages, cargo
# resolves other features (the dev-dependencies' `std` of num-traits and bitflags, the
# lab's) and compiles everything above them again.

TEST_BUILD_FLAGS=(--profile test --workspace --all-targets --features rmemfs/testing,rmemfs/verbs)
# The binary and the C library the real mounts (mount-tests/, here and in the VM) run.
TEST_BIN=target/debug/rmemfs

# test_build: installs what the verbs fabric's binding needs to build (Debian), then builds.
test_build() {
  tools/build-verbs.sh --install-only
  cargo build "${TEST_BUILD_FLAGS[@]}"
}

# test_binary NAME: the path of the integration test binary tests/NAME.rs of that build
# (fresh after test_build: this only names it).
test_binary() {
  cargo test "${TEST_BUILD_FLAGS[@]}" --no-run 2>&1 |
    sed -n "s/.*Executable tests\/$1\.rs (\(.*\))$/\1/p" | tail -n 1
}
