//! README.md and docs/ stay true: every flag table in docs/configuration.md matches the flags
//! the binary's `--help` prints (nothing named that does not exist, nothing that exists left
//! out), every `make` target README.md or a page of docs/ names is a Makefile target, every
//! relative link in them points at a file that exists, and README.md stays a front page.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use kjob_testkit::bin_path;

/// The most lines README.md may have: a front page, not a manual (issue 43).
const README_MAX_LINES: usize = 250;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn readme() -> String {
    read(&kjob_e2e::root().join("README.md"))
}

/// Every Markdown file under `dir`, recursively, sorted.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// README.md and every page of docs/: what the doc tests read.
fn documents() -> Vec<PathBuf> {
    let root = kjob_e2e::root();
    let docs = markdown_under(&root.join("docs"));
    assert!(!docs.is_empty(), "docs/ holds no Markdown page");
    std::iter::once(root.join("README.md")).chain(docs).collect()
}

/// The make targets a Markdown text names: in inline code (`` `make x` ``, `` `make x y` ``) and
/// on the lines of a fenced code block that start with `make `. Words after the first that look
/// like a variable (`X=y`), a flag or a comment end the list.
fn make_targets_named(md: &str) -> BTreeSet<String> {
    let mut commands: Vec<&str> = Vec::new();
    for part in md.split("`make ").skip(1) {
        commands.push(part.split('`').next().unwrap_or_default());
    }
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if fenced && let Some(rest) = line.trim_start().strip_prefix("make ") {
            commands.push(rest);
        }
    }
    let mut out = BTreeSet::new();
    for cmd in commands {
        for word in cmd.split_whitespace() {
            if word.contains('=') || word.starts_with(['-', '#', '(']) {
                break;
            }
            let target: String =
                word.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            if target.is_empty() || target.len() != word.len() {
                if !target.is_empty() {
                    out.insert(target);
                }
                break;
            }
            out.insert(target);
        }
    }
    out
}

/// The relative link targets of a Markdown text (`[text](target)`), without their `#anchor`;
/// absolute URLs (`scheme:`) and pure anchors are left out.
fn relative_links(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for part in line.split("](").skip(1) {
            let Some(target) = part.split(')').next() else { continue };
            let target = target.split_whitespace().next().unwrap_or_default();
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || path.contains(':') {
                continue;
            }
            out.push(path.to_string());
        }
    }
    out
}

/// `### \`kjob-x sub\`` heading → the flags named in the first column of its table.
fn flag_tables(readme: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        if let Some(h) = line.strip_prefix("### `") {
            current = h
                .strip_suffix('`')
                .filter(|c| c.starts_with("kjob-") || c.starts_with("kubectl-kjob"))
                .map(String::from);
            continue;
        }
        if line.starts_with("## ") {
            current = None;
            continue;
        }
        let Some(cmd) = &current else { continue };
        let Some(first) = line.strip_prefix("| `--") else { continue };
        let flag = first.split('`').next().unwrap_or_default();
        out.entry(cmd.clone()).or_default().insert(format!("--{flag}"));
    }
    out
}

/// The long flags a `--help` text lists (option lines start with `-x, --flag` or `--flag`).
fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            let start = l.find("--")?;
            let flag: String =
                l[start..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            (flag.len() > 2).then_some(flag)
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

#[test]
fn help_parsing_finds_long_flags() {
    let help = "Options:\n  -q, --queue-url <URL>\n          Where\n      --plain\n  -h, --help\n  text --not-a-flag\n";
    assert_eq!(help_flags(help), BTreeSet::from(["--queue-url".into(), "--plain".into()]));
    let md = "### `kjob-x`\n| flag |\n|---|\n| `--a-b` | x |\n## Next\n| `--c` |\n### `kjob-y sub`\n| `--d` |\n";
    let t = flag_tables(md);
    assert_eq!(t["kjob-x"], BTreeSet::from(["--a-b".to_string()]));
    assert_eq!(t["kjob-y sub"], BTreeSet::from(["--d".to_string()]));
    assert_eq!(t.len(), 2);
}

#[test]
fn doc_parsing_finds_make_targets_and_links() {
    let md = "Run `make demo` or `make images kind-load`, `make test-rust FOO=1`.\n\
              To make kjob the only one, `make bench BENCH_ARGS=--quick`.\n\
              ```sh\nmake cluster-up KUBELET=off   # note\nkubectl apply -k x\n  make diff-upstream\n```\n\
              make prose-not-a-target\n\
              [a](docs/a.md#x) [b](https://x.y/z) [c](#local) [d](../CHANGELOG.md)\n\
              ```\n[e](not/a/link.md)\n```\n";
    let want: BTreeSet<String> =
        ["demo", "images", "kind-load", "test-rust", "bench", "cluster-up", "diff-upstream"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    assert_eq!(make_targets_named(md), want);
    assert_eq!(relative_links(md), ["docs/a.md", "../CHANGELOG.md"]);
}

#[test]
fn every_documented_flag_table_matches_the_binary() {
    let tables = flag_tables(&read(&kjob_e2e::root().join("docs/configuration.md")));
    for bin in [
        "kjob-queue",
        "kjob-watcher",
        "kjob-worker",
        "kjob-sim",
        "kjob-demo",
        "kubectl-kjob explain",
    ] {
        assert!(tables.contains_key(bin), "docs/configuration.md has no flag table for {bin}");
    }
    let mut problems = Vec::new();
    for (cmd, documented) in &tables {
        let mut words = cmd.split_whitespace();
        let bin = words.next().unwrap();
        let Ok(path) = bin_path(bin) else {
            problems.push(format!("{bin}: binary not built (cargo build --bins)"));
            continue;
        };
        let out = Command::new(path).args(words).arg("--help").output().unwrap();
        assert!(out.status.success(), "{cmd} --help failed: {out:?}");
        let actual = help_flags(&String::from_utf8_lossy(&out.stdout));
        for f in documented.difference(&actual) {
            problems.push(format!("{cmd}: the docs name {f}, which --help does not list"));
        }
        for f in actual.difference(documented) {
            problems.push(format!("{cmd}: {f} exists but the docs' table leaves it out"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md flag tables are out of date:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_make_target_the_docs_name_exists() {
    let root = kjob_e2e::root();
    let makefile = read(&root.join("Makefile"));
    let targets: BTreeSet<&str> = makefile
        .lines()
        .filter(|l| !l.starts_with(['\t', '#', ' ', '.']))
        .filter_map(|l| l.split_once(':').map(|(t, _)| t.trim()))
        .filter(|t| !t.contains(['=', '$', ' ']))
        .collect();
    let readme_named = make_targets_named(&readme());
    assert!(
        readme_named.contains("test") && readme_named.contains("demo"),
        "README names neither `make test` nor `make demo`: {readme_named:?}"
    );
    let mut missing = Vec::new();
    for doc in documents() {
        for target in make_targets_named(&read(&doc)) {
            if !targets.contains(target.as_str()) {
                missing
                    .push(format!("{}: make {target}", doc.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs name make targets the Makefile lacks:\n{}",
        missing.join("\n")
    );
}

#[test]
fn readme_is_a_front_page() {
    let lines = readme().lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into docs/"
    );
}

#[test]
fn every_relative_link_in_the_docs_points_at_a_file() {
    let root = kjob_e2e::root();
    let mut broken = Vec::new();
    for doc in documents() {
        let dir = doc.parent().unwrap();
        for link in relative_links(&read(&doc)) {
            if !dir.join(&link).exists() {
                broken.push(format!("{}: {link}", doc.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}
