//! The documentation's pointers stay true: every relative link of README.md and docs/**/*.md names a file or
//! directory that exists (and, into a Markdown page, one of its headings), and every path the codemap of
//! docs/architecture.md names exists in the repository.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// How a repository path starts, as the codemap writes it.
const REPO_ROOTS: [&str; 10] =
    ["src/", "actors/", "tests/", "ops/", "migrations/", "config/", "docs/", "model/", "fuzz/", "examples/"];

/// File names the codemap gives relative to the entry they describe (`access.rs`, `scripts/bucket.lua`).
const FILE_ENDINGS: [&str; 7] = [".rs", ".lua", ".sql", ".toml", ".json", ".yml", ".md"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and every Markdown file under docs/, sorted.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    collect_markdown(&root().join("docs"), &mut files);
    files.sort();
    files
}

fn collect_markdown(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("docs/").flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_markdown(&path, into);
        } else if path.extension().is_some_and(|e| e == "md") {
            into.push(path);
        }
    }
}

/// The lines outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push(line);
        }
    }
    lines
}

/// Every `](target)` of the page's prose, without `<…>` or a title.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.trim_start_matches('<').trim_end_matches('>').to_string());
            rest = &rest[end..];
        }
    }
    targets
}

/// A link into the repository rather than to the web, a mail address or the same page.
fn is_relative(target: &str) -> bool {
    !(target.is_empty() || target.starts_with('#') || target.contains("://") || target.starts_with("mailto:"))
}

/// GitHub's anchor of a heading: lower case, spaces to hyphens, punctuation other than `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings; a repeated one gets `-1`, `-2`… as on GitHub.
fn anchors(page: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in prose_lines(page) {
        let Some(heading) = line.strip_prefix('#').map(|h| h.trim_start_matches('#')) else { continue };
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let mut anchor = base.clone();
        for n in 1.. {
            if !found.contains(&anchor) {
                break;
            }
            anchor = format!("{base}-{n}");
        }
        found.insert(anchor);
    }
    found
}

/// What is wrong with one link of `page` (None when it holds).
fn broken(page: &Path, target: &str) -> Option<String> {
    let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
    let resolved = if file.is_empty() { page.to_path_buf() } else { page.parent().expect("a dir").join(file) };
    if !resolved.exists() {
        return Some(format!("{} → {target}: no such file or directory", page.display()));
    }
    let is_markdown = resolved.extension().is_some_and(|e| e == "md");
    if anchor.is_empty() || !is_markdown || anchors(&read(&resolved)).contains(anchor) {
        return None;
    }
    Some(format!("{} → {target}: no heading with that anchor in {}", page.display(), resolved.display()))
}

#[test]
fn every_relative_link_of_the_docs_names_a_file_or_directory_that_exists() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in markdown_files() {
        for target in link_targets(&read(&page)).into_iter().filter(|t| is_relative(t)) {
            checked += 1;
            failures.extend(broken(&page, &target).filter(|f| f.contains("no such file")));
        }
    }
    assert!(checked > 20, "only {checked} relative links found: is the link scan still right?");
    assert!(failures.is_empty(), "broken links:\n{}", failures.join("\n"));
}

#[test]
fn every_anchor_of_the_docs_names_a_heading_of_its_page() {
    let mut failures = Vec::new();
    for page in markdown_files() {
        let targets = link_targets(&read(&page));
        for target in targets.iter().filter(|t| t.contains('#') && (is_relative(t) || t.starts_with('#'))) {
            failures.extend(broken(&page, target));
        }
    }
    assert!(failures.is_empty(), "broken anchors:\n{}", failures.join("\n"));
}

#[test]
fn headings_become_the_anchors_github_gives_them() {
    assert_eq!(slug("Security: tokens, listeners and credentials"), "security-tokens-listeners-and-credentials");
    assert_eq!(slug("Benchmark report: `ops/bench`"), "benchmark-report-opsbench");
    assert_eq!(slug("The durable request gate (DESIGN §2.5)"), "the-durable-request-gate-design-25");
    let expected = BTreeSet::from(["a", "b", "b-1"].map(String::from));
    assert_eq!(anchors("# A\n## B\n```\n# not a heading\n```\n## B\n#tag"), expected);
}

/// The "## Codemap" section of docs/architecture.md: its code block and the invariant lists after it.
fn codemap_section() -> String {
    let page = read(&root().join("docs/architecture.md"));
    let start = page.find("\n## Codemap\n").expect("a \"## Codemap\" section in docs/architecture.md");
    let section = &page[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |at| at + 3);
    section[..end].to_string()
}

/// The lines of the section's first code block: the codemap proper.
fn codemap_block(section: &str) -> Vec<&str> {
    let mut parts = section.split("```");
    parts.next();
    let block = parts.next().expect("the codemap's code block");
    block.lines().skip(1).collect()
}

/// A directory the codemap's entry names: the entry itself when it is one, else the directory it is in.
fn entry_dir(entry: &str) -> String {
    if entry.ends_with('/') {
        entry.to_string()
    } else {
        entry.rfind('/').map_or(String::new(), |at| entry[..=at].to_string())
    }
}

fn looks_like_repo_path(word: &str) -> bool {
    REPO_ROOTS.iter().any(|r| word.starts_with(r))
}

fn looks_like_file(word: &str) -> bool {
    word.contains('/') || FILE_ENDINGS.iter().any(|e| word.ends_with(e))
}

/// The backticked words of a line.
fn backticked(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// Every path one codemap line names, given the directory of the entry it belongs to.
fn paths_of_line(line: &str, dir: &str) -> Vec<String> {
    let mut paths = Vec::new();
    if line.starts_with("  ") && !line.starts_with("   ") {
        // A file list under the entry above it: `  lane.rs streams.rs  per (ispb, channel)…`.
        let files = line.split_whitespace().take_while(|w| w.ends_with(".rs") || w.ends_with('/'));
        paths.extend(files.map(|f| format!("{dir}{f}")));
    }
    for word in backticked(line) {
        if word.contains(' ') || word.starts_with('/') {
            continue;
        }
        if looks_like_repo_path(word) {
            paths.push(word.to_string());
        } else if looks_like_file(word) {
            paths.push(format!("{dir}{word}"));
        }
    }
    let bare = line.split(|c: char| c.is_whitespace() || "(),;:`".contains(c));
    paths.extend(bare.filter(|w| looks_like_repo_path(w)).map(|w| w.trim_end_matches('.').to_string()));
    paths
}

/// Every path the codemap names: each entry, the files and directories given relative to it, and every
/// repository path written out in full (in the block or in the invariant lists after it).
fn codemap_paths() -> Vec<String> {
    let section = codemap_section();
    let mut paths = Vec::new();
    let mut dir = String::new();
    for line in codemap_block(&section) {
        if let Some(entry) = line.split_whitespace().next().filter(|_| !line.starts_with(' ')) {
            paths.push(entry.to_string());
            dir = entry_dir(entry);
        }
        paths.extend(paths_of_line(line, &dir));
    }
    for line in section.split("```").skip(2).flat_map(str::lines) {
        paths.extend(backticked(line).into_iter().filter(|w| looks_like_repo_path(w)).map(String::from));
    }
    paths
}

/// Whether a repository path exists; one `*` in its file name matches any run of characters.
fn exists(path: &str) -> bool {
    let Some((prefix, suffix)) = path.split_once('*') else { return root().join(path).exists() };
    let (dir, start) = prefix.rsplit_once('/').unwrap_or(("", prefix));
    let Ok(entries) = std::fs::read_dir(root().join(dir)) else { return false };
    entries.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with(start) && name.ends_with(suffix) && name.len() >= start.len() + suffix.len()
    })
}

#[test]
fn every_path_the_codemap_names_exists() {
    let paths = codemap_paths();
    assert!(paths.len() > 150, "only {} codemap paths found: is the codemap scan still right?", paths.len());
    let missing: BTreeSet<&String> = paths.iter().filter(|p| !exists(p)).collect();
    assert!(missing.is_empty(), "the codemap of docs/architecture.md names paths that do not exist: {missing:?}");
}

#[test]
fn the_codemap_scan_reads_entries_relative_names_and_globs() {
    let dir = entry_dir("src/redis/bucket.rs");
    assert_eq!(dir, "src/redis/");
    assert_eq!(
        paths_of_line("src/redis/bucket.rs   shared bucket, Lua `scripts/bucket.lua`", &dir),
        ["src/redis/scripts/bucket.lua", "src/redis/bucket.rs"]
    );
    assert_eq!(
        paths_of_line("  lane.rs streams.rs  per (ispb, channel): `Stamped`", "src/sim/"),
        ["src/sim/lane.rs", "src/sim/streams.rs"]
    );
    assert_eq!(
        paths_of_line("          rig in tests/cluster_support/; `/actors`", "tests/"),
        ["tests/cluster_support/"]
    );
    assert!(exists("tests/conformance_*.rs") && !exists("tests/no_such_*.rs"));
}
