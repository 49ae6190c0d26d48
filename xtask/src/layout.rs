//! `cargo xtask layout`: checks that the code's layout is its data flow.
//!
//! - In the daemon, each top-level folder uses only the folders listed
//!   before it in [`DAEMON_LAYERS`] (`crate::...` paths, tests included).
//! - In every crate, no module uses another that uses it back, directly or
//!   through others (`crate::` paths between files).
//!
//! It reads `crate::` paths, not `use` trees: a path written as
//! `super::...` or re-exported from elsewhere is not seen, so modules
//! write `crate::` paths for what lies outside their own folder.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The daemon's folders in data-flow order.
pub const DAEMON_LAYERS: &[&str] = &[
    "model", "config", "bpf", "procs", "stacks", "profiles", "report", "output", "session",
];

/// The crates whose modules must not form cycles, by source folder.
const CRATES: &[&str] = &[
    "profiler-daemon/src",
    "profiler-ebpf/src",
    "profiler-common/src",
    "xtask/src",
];

/// A module, as the path of its file's module below the crate root
/// (`bpf::attach::placement`); the crate root is the empty path.
type Module = String;

/// Runs every check; fails with each violation listed.
pub fn check(root: &Path) -> Result<()> {
    let mut problems = Vec::new();
    for krate in CRATES {
        let modules = read_crate(&root.join(krate))?;
        problems.extend(cycles(krate, &modules));
        if *krate == "profiler-daemon/src" {
            problems.extend(layer_violations(&modules));
        }
    }
    if !problems.is_empty() {
        bail!("the layout check failed:\n  {}", problems.join("\n  "));
    }
    println!("layout: folders in data-flow order, no module cycles");
    Ok(())
}

/// Each module of the crate with the modules its `crate::` paths name.
fn read_crate(src: &Path) -> Result<BTreeMap<Module, BTreeSet<Module>>> {
    let mut files = Vec::new();
    collect_rs(src, &mut files)?;
    let mut texts = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let text =
            std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
        texts.insert(module_of(rel), strip_comments(&text));
    }
    let known: BTreeSet<Module> = texts.keys().cloned().collect();
    let mut uses = BTreeMap::new();
    for (module, text) in &texts {
        let mut used = BTreeSet::new();
        for path in crate_paths(text) {
            if let Some(target) = resolve(&path, &known)
                && target != *module
                && !target.is_empty()
                && !is_within(module, &target)
            {
                used.insert(target);
            }
        }
        uses.insert(module.clone(), used);
    }
    Ok(uses)
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// `bpf/attach/mod.rs` -> `bpf::attach`; `lib.rs`, `main.rs` -> "".
fn module_of(rel: &Path) -> Module {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// Whether `inner` is `outer` or one of its submodules (a module may use
/// its own children and they it: `mod.rs` re-exports are the norm).
fn is_within(outer: &str, inner: &str) -> bool {
    inner.starts_with(outer) && inner[outer.len()..].starts_with("::")
        || outer.starts_with(inner) && outer[inner.len()..].starts_with("::")
}

/// The text without `//` comments (doc comments name paths in prose) and
/// without string literals' contents.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut prev = ' ';
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !in_string && c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' && prev != '\'' {
                in_string = !in_string;
                kept.push(c);
            } else if !in_string {
                kept.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
            i += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// Every `crate::a::b::...` path in the text, as its segments.
fn crate_paths(text: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let mut segments = Vec::new();
        let mut tail = rest;
        loop {
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            if len == 0 {
                break;
            }
            segments.push(tail[..len].to_string());
            tail = &tail[len..];
            match tail.strip_prefix("::") {
                Some(t) => tail = t,
                None => break,
            }
        }
        if !segments.is_empty() {
            paths.push(segments);
        }
    }
    paths
}

/// The longest module that a path's leading segments name.
fn resolve(path: &[String], known: &BTreeSet<Module>) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| known.contains(m))
}

/// Every cycle among the crate's modules, each once.
fn cycles(krate: &str, uses: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    let mut found = BTreeSet::new();
    for start in uses.keys() {
        // Depth-first search for a path back to `start`.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in uses.get(&at).into_iter().flatten() {
                if next == start {
                    // Name a cycle by its members from the least, so each
                    // is reported once.
                    let least = path.iter().min().expect("non-empty");
                    let pos = path.iter().position(|m| m == least).expect("member");
                    let mut ring: Vec<&str> = path[pos..]
                        .iter()
                        .chain(&path[..pos])
                        .map(String::as_str)
                        .collect();
                    ring.push(least);
                    found.insert(format!(
                        "{krate}: modules use each other: {}",
                        ring.join(" -> ")
                    ));
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found.into_iter().collect()
}

/// Uses of a later folder from an earlier one in [`DAEMON_LAYERS`], and
/// modules outside every folder.
fn layer_violations(uses: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    let layer = |m: &str| {
        let top = m.split("::").next().unwrap_or("");
        DAEMON_LAYERS.iter().position(|l| *l == top)
    };
    let mut problems = Vec::new();
    for (module, used) in uses {
        if module.is_empty() {
            continue;
        }
        let Some(mine) = layer(module) else {
            problems.push(format!(
                "profiler-daemon: {module} is in no folder of the data flow ({})",
                DAEMON_LAYERS.join(", ")
            ));
            continue;
        };
        for target in used {
            if let Some(theirs) = layer(target)
                && theirs > mine
            {
                problems.push(format!(
                    "profiler-daemon: {module} uses {target}, a later stage ({} comes after {})",
                    DAEMON_LAYERS[theirs], DAEMON_LAYERS[mine]
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> BTreeMap<Module, BTreeSet<Module>> {
        let mut g: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    }

    #[test]
    fn finds_paths_outside_comments_and_strings() {
        let text = strip_comments(
            "use crate::bpf::probes::Probes; // crate::report\nlet s = \"crate::output\";\nx = crate::model::text::hex(1);\n$crate::klog::x",
        );
        let paths: Vec<String> = crate_paths(&text).iter().map(|p| p.join("::")).collect();
        assert_eq!(
            paths,
            ["bpf::probes::Probes", "model::text::hex"].map(String::from)
        );
    }

    #[test]
    fn resolves_to_the_longest_module() {
        let known: BTreeSet<Module> = ["bpf", "bpf::attach", "bpf::attach::placement"]
            .map(String::from)
            .into();
        let path: Vec<String> = ["bpf", "attach", "placement", "choose"]
            .map(String::from)
            .into();
        assert_eq!(
            resolve(&path, &known).as_deref(),
            Some("bpf::attach::placement")
        );
        assert_eq!(module_of(Path::new("bpf/attach/mod.rs")), "bpf::attach");
        assert_eq!(module_of(Path::new("lib.rs")), "");
    }

    #[test]
    fn reports_cycles_once_and_layers_out_of_order() {
        let g = graph(&[
            ("procs::process", "stacks::unwind"),
            ("stacks::unwind", "procs::process"),
        ]);
        assert_eq!(
            cycles("c", &g),
            ["c: modules use each other: procs::process -> stacks::unwind -> procs::process"]
        );
        let problems = layer_violations(&g);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("procs::process uses stacks::unwind"));
        let g = graph(&[("a", "b"), ("b", "c")]);
        assert!(cycles("c", &g).is_empty());
        assert_eq!(layer_violations(&g).len(), 3, "a, b, c are in no folder");
    }
}
