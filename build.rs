//! Stamps the git commit into the binary for `cabine --version` and `cabine_build_info`.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=CABINE_GIT_COMMIT={commit}");
    // refinery embeds migrations/ at compile time: a new or edited migration must rebuild.
    println!("cargo:rerun-if-changed=migrations");
    // In a worktree `.git` is a file: ask git where HEAD really lives, so the
    // build reruns when (and only when) the commit changes.
    let git_dir = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned());
    match git_dir {
        Some(dir) => {
            println!("cargo:rerun-if-changed={dir}/HEAD");
            println!("cargo:rerun-if-changed={dir}/logs/HEAD");
        }
        None => println!("cargo:rerun-if-changed=build.rs"),
    }
}
