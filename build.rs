//! Stamps the git commit into the binary for `cabine --version` and `cabine_build_info`.

use std::process::Command;

fn main() {
    // An image build has no .git in its context: the builder passes the commit instead.
    println!("cargo:rerun-if-env-changed=CABINE_GIT_COMMIT");
    let given = std::env::var("CABINE_GIT_COMMIT").ok().filter(|c| !c.trim().is_empty());
    let commit = given.map(|c| c.trim().to_owned()).unwrap_or_else(git_commit);
    println!("cargo:rustc-env=CABINE_GIT_COMMIT={commit}");
    // refinery embeds migrations/ at compile time: a new or edited migration must rebuild.
    println!("cargo:rerun-if-changed=migrations");
    // In a worktree `.git` is a file: ask git where HEAD really lives, so the
    // build reruns when (and only when) the commit changes.
    match git(&["rev-parse", "--git-dir"]) {
        Some(dir) => {
            println!("cargo:rerun-if-changed={dir}/HEAD");
            println!("cargo:rerun-if-changed={dir}/logs/HEAD");
        }
        None => println!("cargo:rerun-if-changed=build.rs"),
    }
}

/// `git rev-parse --short=12 HEAD`, or "unknown" outside a checkout.
fn git_commit() -> String {
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
}

/// A git command's trimmed, non-empty stdout.
fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}
