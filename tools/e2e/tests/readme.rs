//! README.md stays true: every flag table under "Configuration reference" matches the flags
//! the binary's `--help` prints (nothing named that does not exist, nothing that exists left
//! out), and every `make` target the README names is a Makefile target.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use kjob_testkit::bin_path;

fn readme() -> String {
    std::fs::read_to_string(kjob_e2e::root().join("README.md")).unwrap()
}

/// `### \`kjob-x sub\`` heading → the flags named in the first column of its table.
fn flag_tables(readme: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        if let Some(h) = line.strip_prefix("### `") {
            current = h.strip_suffix('`').filter(|c| c.starts_with("kjob-")).map(String::from);
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
fn every_documented_flag_table_matches_the_binary() {
    let tables = flag_tables(&readme());
    for bin in ["kjob-queue", "kjob-watcher", "kjob-worker", "kjob-sim", "kjob-demo"] {
        assert!(tables.contains_key(bin), "README has no flag table for {bin}");
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
            problems.push(format!("{cmd}: README names {f}, which --help does not list"));
        }
        for f in actual.difference(documented) {
            problems.push(format!("{cmd}: {f} exists but the README table leaves it out"));
        }
    }
    assert!(problems.is_empty(), "README flag tables are out of date:\n{}", problems.join("\n"));
}

#[test]
fn every_make_target_the_readme_names_exists() {
    let makefile = std::fs::read_to_string(kjob_e2e::root().join("Makefile")).unwrap();
    let targets: BTreeSet<&str> = makefile
        .lines()
        .filter(|l| !l.starts_with(['\t', '#', ' ', '.']))
        .filter_map(|l| l.split_once(':').map(|(t, _)| t.trim()))
        .filter(|t| !t.contains(['=', '$', ' ']))
        .collect();
    let readme = readme();
    let mut named = BTreeSet::new();
    for part in readme.split("`make ").skip(1) {
        let target: String =
            part.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        if !target.is_empty() {
            named.insert(target);
        }
    }
    assert!(named.contains("test") && named.contains("demo"), "{named:?}");
    let missing: Vec<&String> = named.iter().filter(|t| !targets.contains(t.as_str())).collect();
    assert!(missing.is_empty(), "README names make targets the Makefile lacks: {missing:?}");
}
