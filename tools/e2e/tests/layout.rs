//! The repository's layout stays as docs/architecture.md draws it: crates/ holds what ships and
//! nothing else, no shipping crate depends on a tool crate (dev-dependencies and examples
//! included), the images hold the three services' binaries, and the worker's and reconcile's
//! modules import one another in one direction only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The crates that ship, each a folder of crates/ (the services' and the kubectl plugin's).
const SHIPPING: [&str; 10] = [
    "core",
    "proto",
    "svc",
    "queue-client",
    "workqueue",
    "queue",
    "reconcile",
    "watcher",
    "worker",
    "kubectl-kjob",
];

/// The binaries the images hold.
const SERVICES: [&str; 3] = ["kjob-queue", "kjob-watcher", "kjob-worker"];

fn dirs(path: &Path) -> BTreeSet<String> {
    std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn crates_holds_only_what_ships() {
    let root = kjob_e2e::root();
    let want: BTreeSet<String> = SHIPPING.iter().map(|s| s.to_string()).collect();
    assert_eq!(dirs(&root.join("crates")), want, "crates/ must hold exactly the shipping crates");
    let tools = dirs(&root.join("tools"));
    assert!(tools.is_disjoint(&want), "a shipping crate also in tools/: {tools:?}");
}

#[test]
fn no_shipping_crate_depends_on_a_tool_crate() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--locked"])
        .current_dir(kjob_e2e::root())
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut tool_crates = BTreeSet::new();
    let mut shipping = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        let manifest = p["manifest_path"].as_str().unwrap();
        let name = p["name"].as_str().unwrap().to_string();
        if manifest.contains("/tools/") {
            tool_crates.insert(name);
        } else {
            shipping.push(p);
        }
    }
    assert!(tool_crates.contains("kjob-testkit") && tool_crates.contains("kjob-sim"));
    assert_eq!(shipping.len(), SHIPPING.len());
    let mut problems = Vec::new();
    for p in shipping {
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["name"].as_str().unwrap();
            if tool_crates.contains(dep) {
                let kind = d["kind"].as_str().unwrap_or("normal");
                problems.push(format!("{} depends on {dep} ({kind})", p["name"]));
            }
        }
    }
    assert!(problems.is_empty(), "shipping crates depend on tool crates: {problems:?}");
}

#[test]
fn the_images_hold_the_three_services_only() {
    let dockerfile = std::fs::read_to_string(kjob_e2e::root().join("Dockerfile")).unwrap();
    let copied: BTreeSet<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("COPY --from=builder /out/"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(copied, BTreeSet::from(SERVICES), "binaries the images copy");
    let built = dockerfile.lines().find(|l| l.contains("cargo build")).expect("a cargo build line");
    for tool in ["kjob-sim", "kjob-testkit", "kjob-bench", "kjob-demo"] {
        assert!(!built.contains(tool), "the image build compiles {tool}: {built}");
    }
}

/// The top-level module a source file belongs to (`sync/plan.rs` → `sync`), or None for the
/// crate root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_string_lossy().into_owned();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib" && name != "main").then_some(name)
}

/// A file's production code: everything before its `#[cfg(test)]` module.
fn production_code(text: &str) -> &str {
    match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// The modules named after `crate::` in `code`, including `use crate::{a, b::c}` groups.
fn crate_refs(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                group.split(',').map(|p| p.trim()).collect()
            }
            None => vec![rest],
        };
        for n in names {
            let m: String =
                n.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if modules.contains(&m) {
                out.insert(m);
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// module → the modules its production code imports. Test support (`testutil`) and `#[cfg(test)]`
/// modules are left out: tests may import from anywhere.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> =
        files.iter().filter_map(|f| module_of(src, f)).filter(|m| m != "testutil").collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> =
        modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for f in &files {
        let Some(m) = module_of(src, f).filter(|m| m != "testutil") else { continue };
        let text = std::fs::read_to_string(f).unwrap();
        let refs = crate_refs(production_code(&text), &modules);
        graph.get_mut(&m).unwrap().extend(refs.into_iter().filter(|r| *r != m));
    }
    graph
}

/// Every cycle's members, found as the modules that reach themselves.
fn modules_on_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let reaches = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&String> = graph[from].iter().collect();
        while let Some(m) = stack.pop() {
            if seen.insert(m.clone()) {
                stack.extend(graph.get(m).into_iter().flatten());
            }
        }
        seen
    };
    graph
        .keys()
        .filter(|m| reaches(m).contains(*m))
        .map(|m| format!("{m} -> {:?}", graph[m]))
        .collect()
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let g: BTreeMap<String, BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec!["a"])]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
            .collect();
    let on = modules_on_cycles(&g);
    assert_eq!(on.len(), 3, "{on:?}");
    let mods: BTreeSet<String> = ["sync", "lease"].into_iter().map(String::from).collect();
    let refs = crate_refs("use crate::{sync::run, lease};\nfn f() { crate::other::x() }", &mods);
    assert_eq!(refs, mods);
}

#[test]
fn worker_and_reconcile_modules_import_in_one_direction() {
    let root = kjob_e2e::root();
    for krate in ["worker", "reconcile"] {
        let graph = module_graph(&root.join("crates").join(krate).join("src"));
        assert!(graph.len() > 3, "{krate}: {graph:?}");
        let cycles = modules_on_cycles(&graph);
        assert!(cycles.is_empty(), "crates/{krate}: modules on an import circle: {cycles:#?}");
    }
}
