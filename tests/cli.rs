//! The binary itself, as built by cargo. Having an integration test here also
//! makes `cargo test --workspace` build `target/<profile>/seqline`, which the
//! black-box tests in `complement-tests/` start.

use std::process::Command;

#[test]
fn version_prints_the_crate_version() {
    let out = Command::new(env!("CARGO_BIN_EXE_seqline")).arg("version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("seqline {}", env!("CARGO_PKG_VERSION")));
}
