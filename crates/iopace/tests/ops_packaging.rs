//! Packaging: --version names the commit, the man page and completions render.

mod common;

use std::process::Command;

use common::BIN;

fn stdout(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().expect("run iopace");
    assert!(out.status.success(), "{args:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn version_man_page_and_completions() {
    let version = stdout(&["--version"]);
    assert!(version.contains("(commit "), "{version}");
    assert!(!version.contains("unknown"), "built from git: {version}");
    let man = stdout(&["manpage"]);
    assert!(man.contains(".TH iopace 1"), "{man}");
    assert!(man.contains("serve"), "{man}");
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout(&["completions", shell]);
        assert!(
            script.contains("serve") && script.contains("stats"),
            "{shell}"
        );
    }
}
