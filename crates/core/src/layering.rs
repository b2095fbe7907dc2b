//! Keeps core's modules layered: no import circle among its top-level
//! modules (a folder counts as one), nor among the files of one folder.
//! Read from the sources, so a new `use crate::...` that closes a circle
//! fails here with the files and lines that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Sibling files allowed to import each other, and why. Building an op
/// infers its meta; a composite's meta is that of its decomposition, which
/// is built with the builder: the recursion is the IR's own.
const ALLOWED: &[(&str, &[&str])] = &[("ir", &["builder", "decompose", "einsum", "infer"])];

/// A `crate::...` import: the importing file's module path, the imported
/// module path, and the line.
struct Import {
    file: String,
    from: Vec<String>,
    to: Vec<String>,
    line: usize,
}

/// Module paths of the files under `src` (`a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`; `lib.rs` is left out), with their sources.
fn modules(src: &Path) -> Vec<(Vec<String>, String, String)> {
    fn walk(dir: &Path, prefix: &[String], out: &mut Vec<(Vec<String>, String, String)>) {
        for entry in std::fs::read_dir(dir).expect("core's sources are readable") {
            let path = entry.expect("a directory entry").path();
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            let mut module = prefix.to_vec();
            if path.is_dir() {
                module.push(name);
                walk(&path, &module, out);
            } else if path.extension().is_some_and(|e| e == "rs") && !(prefix.is_empty() && name == "lib") {
                if name != "mod" {
                    module.push(name.clone());
                }
                let text = std::fs::read_to_string(&path).expect("a source file is readable");
                let mut file: Vec<String> = prefix.to_vec();
                file.push(format!("{name}.rs"));
                out.push((module, file.join("/"), text));
            }
        }
    }
    let mut out = Vec::new();
    walk(src, &[], &mut out);
    out
}

/// Every `crate::` import outside tests and comments, resolved to the
/// longest module path that is a file.
fn imports(mods: &[(Vec<String>, String, String)]) -> Vec<Import> {
    let known: BTreeSet<&[String]> = mods.iter().map(|(m, _, _)| m.as_slice()).collect();
    let mut out = Vec::new();
    for (from, file, text) in mods {
        for (i, line) in text.lines().enumerate() {
            if line.starts_with("#[cfg(test)]") {
                break;
            }
            if line.trim_start().starts_with("//") {
                continue;
            }
            // `crate::a::b` from the root; `super::b` from the parent module.
            let roots = [
                ("crate::", &[][..]),
                ("super::", &from[..from.len().saturating_sub(1)]),
            ];
            for (root, base) in roots {
                for (at, _) in line.match_indices(root) {
                    let mut path = base.to_vec();
                    for seg in line[at + root.len()..].split("::") {
                        let id: String = seg
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        let whole = !id.is_empty() && id.len() == seg.len();
                        if !id.is_empty() {
                            path.push(id);
                        }
                        if !whole {
                            break;
                        }
                    }
                    let to = (1..=path.len())
                        .rev()
                        .map(|n| &path[..n])
                        .find(|p| known.contains(p))
                        .map(<[String]>::to_vec);
                    if let Some(to) = to {
                        out.push(Import {
                            file: file.clone(),
                            from: from.clone(),
                            to,
                            line: i + 1,
                        });
                    }
                }
            }
        }
    }
    out
}

/// A circle in `edges`, if there is one, as the nodes around it.
fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // 0: unseen, 1: on the current path, 2: done.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let start = path.iter().position(|p| p == m).expect("on the path");
                    return Some(path[start..].to_vec());
                }
                0 => {
                    if let Some(c) = visit(m, edges, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0
            && let Some(c) = visit(n, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

/// The imports behind each edge of a circle, for the message.
fn explain(circle: &[String], why: &BTreeMap<(String, String), Vec<String>>) -> String {
    let mut lines = vec![format!("import circle: {} -> {}", circle.join(" -> "), circle[0])];
    for (i, a) in circle.iter().enumerate() {
        let b = &circle[(i + 1) % circle.len()];
        for w in why.get(&(a.clone(), b.clone())).into_iter().flatten() {
            lines.push(format!("  {a} -> {b}: {w}"));
        }
    }
    lines.join("\n")
}

/// The circles among `group` (top-level modules when `folder` is empty,
/// else the files directly in `folder`).
fn check(imports: &[Import], folder: &[String]) -> Result<(), String> {
    let depth = folder.len();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut why: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let allowed: BTreeSet<&str> = ALLOWED
        .iter()
        .filter(|(f, _)| folder == [f.to_string()])
        .flat_map(|(_, files)| files.iter().copied())
        .collect();
    for i in imports {
        let inside = |p: &[String]| p.len() > depth && p[..depth] == *folder;
        if !inside(&i.from) || !inside(&i.to) {
            continue;
        }
        let (a, b) = (&i.from[depth], &i.to[depth]);
        if a == b || (allowed.contains(a.as_str()) && allowed.contains(b.as_str())) {
            continue;
        }
        edges.entry(a.clone()).or_default().insert(b.clone());
        why.entry((a.clone(), b.clone()))
            .or_default()
            .push(format!("{}:{}", i.file, i.line));
    }
    match circle(&edges) {
        Some(c) => Err(explain(&c, &why)),
        None => Ok(()),
    }
}

#[test]
fn core_has_no_import_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let imports = imports(&mods);
    assert!(
        imports.len() > 100,
        "the imports were not found: {}",
        imports.len()
    );
    let folders: BTreeSet<Vec<String>> = mods
        .iter()
        .filter(|(m, _, _)| m.len() > 1)
        .map(|(m, _, _)| m[..m.len() - 1].to_vec())
        .collect();
    let mut errors = Vec::new();
    for folder in std::iter::once(Vec::new()).chain(folders) {
        if let Err(e) = check(&imports, &folder) {
            errors.push(e);
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn a_circle_is_found_and_named() {
    let imp = |from: &[&str], to: &[&str], line| Import {
        file: format!("{}.rs", from.join("/")),
        from: from.iter().map(|s| s.to_string()).collect(),
        to: to.iter().map(|s| s.to_string()).collect(),
        line,
    };
    let imports = [
        imp(&["plan"], &["partition"], 3),
        imp(&["partition"], &["config"], 7),
        imp(&["config"], &["plan"], 9),
        imp(&["ir", "builder"], &["ir", "infer"], 1),
    ];
    let e = check(&imports, &[]).unwrap_err();
    assert!(e.contains("config -> plan -> partition -> config"), "{e}");
    assert!(e.contains("partition -> config: partition.rs:7"), "{e}");
    assert!(check(&imports[1..], &[]).is_ok());
    // Sibling files are checked within their folder; the IR's own recursion
    // is allowed.
    let ir = [
        imp(&["ir", "builder"], &["ir", "infer"], 1),
        imp(&["ir", "infer"], &["ir", "builder"], 2),
    ];
    assert!(check(&ir, &["ir".to_string()]).is_ok());
    let text = [
        imp(&["text", "a"], &["text", "b"], 1),
        imp(&["text", "b"], &["text", "a"], 2),
    ];
    assert!(check(&text, &["text".to_string()]).is_err());
}
