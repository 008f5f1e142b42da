//! The workspace's test switches hide no test. Crates and binaries without
//! tests of their own are built with `test = false` (and libraries without
//! runnable examples with `doctest = false`), so `cargo test` does not
//! link an empty harness for each: most of the suite's link time and
//! target size. This check keeps the switch honest: a test or a runnable
//! doc example added behind it fails here instead of never running.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// What `cargo <args>` prints on the workspace, offline; a failure fails
/// the test with cargo's own words.
pub(crate) fn cargo_stdout(args: &[&str]) -> Vec<u8> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(args)
        .args(["--offline", "--manifest-path"])
        .arg(&manifest)
        .output()
        .unwrap_or_else(|e| panic!("cargo {args:?}: {e}"));
    assert!(
        out.status.success(),
        "cargo {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn workspace_targets() -> Vec<(String, Value)> {
    let out = cargo_stdout(&["metadata", "--no-deps", "--format-version", "1"]);
    let meta: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
    let mut targets = Vec::new();
    for package in meta["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or("").to_owned();
        for target in package["targets"].as_array().into_iter().flatten() {
            targets.push((name.clone(), target.clone()));
        }
    }
    assert!(targets.len() > 20, "too few targets: {}", targets.len());
    targets
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `text` that declare a test, outside `macro_rules!` bodies
/// (a macro that writes tests for its caller is not a test of this crate).
fn test_markers(text: &str) -> Vec<String> {
    let mut in_macro = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("macro_rules!") {
            in_macro = true;
        }
        if in_macro {
            in_macro = line != "}";
            continue;
        }
        let t = line.trim_start();
        if t.starts_with("#[test]")
            || t.starts_with("#[cfg(test)]")
            || t.starts_with("#[tokio::test")
        {
            found.push(line.to_owned());
        }
    }
    found
}

/// The opening fences of doc-comment code blocks that rustdoc would
/// compile: no language, or only Rust's own attributes, and not `ignore`.
fn runnable_examples(text: &str) -> Vec<String> {
    let mut open = false;
    let mut found = Vec::new();
    for line in text.lines().map(str::trim_start) {
        let Some(doc) = line
            .strip_prefix("///")
            .or_else(|| line.strip_prefix("//!"))
        else {
            continue;
        };
        let Some(lang) = doc.trim().strip_prefix("```") else {
            continue;
        };
        open = !open;
        if !open {
            continue;
        }
        let rust = lang
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .all(|t| {
                matches!(t, "rust" | "should_panic" | "no_run" | "compile_fail")
                    || t.starts_with("edition")
            });
        if rust {
            found.push(line.to_owned());
        }
    }
    found
}

#[test]
fn targets_built_without_tests_have_none() {
    let targets = workspace_targets();
    let bins: Vec<PathBuf> = targets
        .iter()
        .filter(|(_, t)| t["kind"][0] == "bin")
        .filter_map(|(_, t)| t["src_path"].as_str().map(PathBuf::from))
        .collect();
    let mut checked = 0;
    for (package, target) in &targets {
        let kind = target["kind"][0].as_str().unwrap_or("");
        let src = PathBuf::from(target["src_path"].as_str().unwrap_or(""));
        // A library owns its folder's files but the binaries'; a binary
        // owns its own file.
        let files: Vec<PathBuf> = match kind {
            "lib" => {
                let mut all = Vec::new();
                rust_files(src.parent().unwrap_or(Path::new(".")), &mut all);
                all.retain(|f| !bins.contains(f) && !f.starts_with(src.with_file_name("bin")));
                all
            }
            "bin" => vec![src.clone()],
            _ => continue,
        };
        let texts: Vec<(PathBuf, String)> = files
            .into_iter()
            .map(|f| {
                let text = std::fs::read_to_string(&f).unwrap_or_default();
                (f, text)
            })
            .collect();
        if target["test"] == false {
            checked += 1;
            for (file, text) in &texts {
                let found = test_markers(text);
                assert!(
                    found.is_empty(),
                    "{package} {kind} is built with `test = false` but {} has tests: {found:?}",
                    file.display()
                );
            }
        }
        if kind == "lib" && target["doctest"] == false {
            checked += 1;
            for (file, text) in &texts {
                let found = runnable_examples(text);
                assert!(
                    found.is_empty(),
                    "{package} is built with `doctest = false` but {} has examples: {found:?}",
                    file.display()
                );
            }
        }
    }
    assert!(checked >= 20, "only {checked} switches checked");
}

/// Binaries of the workspace's packages with the same name.
fn shared_bin_names(targets: &[(String, Value)]) -> Vec<String> {
    let mut owners: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (package, target) in targets {
        if target["kind"][0] == "bin" {
            let name = target["name"].as_str().unwrap_or("");
            owners.entry(name).or_default().push(package);
        }
    }
    owners
        .into_iter()
        .filter(|(_, packages)| packages.len() > 1)
        .map(|(name, packages)| format!("{name}: {}", packages.join(", ")))
        .collect()
}

/// Every binary lands in the one shared target directory under its own
/// name (`target/debug/<bin>`, and `target/lambda/<bin>/bootstrap` where
/// `sam build` looks for a function): two packages' binaries of one name
/// overwrite each other, so a deploy could ship the wrong one.
#[test]
fn no_two_packages_build_a_binary_of_the_same_name() {
    let shared = shared_bin_names(&workspace_targets());
    assert!(shared.is_empty(), "binaries of the same name: {shared:?}");
}

#[test]
fn the_bin_name_scan_finds_a_shared_name() {
    let bin = |package: &str, name: &str| {
        (
            package.to_owned(),
            serde_json::json!({"kind": ["bin"], "name": name}),
        )
    };
    let lib = (
        "c".to_owned(),
        serde_json::json!({"kind": ["lib"], "name": "billing"}),
    );
    let targets = [
        bin("a", "billing"),
        bin("b", "billing"),
        bin("a", "usage"),
        lib,
    ];
    assert_eq!(shared_bin_names(&targets), ["billing: a, b"]);
}

#[test]
fn the_marker_scans_find_what_they_look_for() {
    let unit = "fn a() {}\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn b() {}\n}\n";
    assert_eq!(test_markers(unit).len(), 2);
    let macro_only = "macro_rules! both {\n    () => {\n        #[tokio::test]\n        async fn x() {}\n    };\n}\n";
    assert!(test_markers(macro_only).is_empty());
    assert_eq!(
        test_markers("#[tokio::test(flavor = \"multi_thread\")]\n").len(),
        1
    );
    assert_eq!(
        runnable_examples("/// ```\n/// let x = 1;\n/// ```\n").len(),
        1
    );
    assert_eq!(runnable_examples("/// ```rust,no_run\n/// ```\n").len(), 1);
    for quiet in ["text", "ignore", "json", "rust,ignore"] {
        let doc = format!("//! ```{quiet}\n//! x\n//! ```\n");
        assert!(runnable_examples(&doc).is_empty(), "{quiet}");
    }
}

/// The modules directly in `dir` (files and folders) and, for each, the
/// modules of `dir` it imports: `crate::<prefix><name>` anywhere in its
/// code, and `super::<name>` in a top-level file or a folder's `mod.rs`.
/// Comments, `#[cfg(test)] mod tests` blocks and `tests.rs`/`testkit.rs`
/// files are left out: tests may reach anywhere.
fn module_imports(dir: &Path, prefix: &str) -> Vec<(String, Vec<String>)> {
    let mut modules: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let file = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            modules.push((file, files));
        } else if let Some(name) = file.strip_suffix(".rs") {
            if !matches!(name, "lib" | "main" | "mod") {
                modules.push((name.to_owned(), vec![path]));
            }
        }
    }
    let names: Vec<String> = modules.iter().map(|(n, _)| n.clone()).collect();
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut graph = Vec::new();
    for (name, files) in &modules {
        let mut deps = Vec::new();
        for file in files {
            let base = file.file_name().map(|f| f.to_string_lossy().into_owned());
            if matches!(base.as_deref(), Some("tests.rs" | "testkit.rs")) {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap_or_default();
            let code = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or("");
            let top = file.parent() == Some(dir) || base.as_deref() == Some("mod.rs");
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                let mut found: Vec<String> = line
                    .split(&format!("crate::{prefix}"))
                    .skip(1)
                    .map(word)
                    .collect();
                if top {
                    found.extend(line.split("super::").skip(1).map(word));
                    if let Some(group) = line.split("use super::{").nth(1) {
                        found.extend(group.split([',', ' ', '}']).map(word));
                    }
                }
                for dep in found {
                    if dep != *name && names.contains(&dep) && !deps.contains(&dep) {
                        deps.push(dep);
                    }
                }
            }
        }
        graph.push((name.clone(), deps));
    }
    graph
}

/// A cycle in `graph`, as the modules along it, if there is one.
fn a_cycle(graph: &[(String, Vec<String>)]) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        graph: &[(String, Vec<String>)],
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            let mut cycle = path[i..].to_vec();
            cycle.push(at.to_owned());
            return Some(cycle);
        }
        if done.iter().any(|d| d == at) {
            return None;
        }
        path.push(at.to_owned());
        let deps = graph.iter().find(|(n, _)| n == at).map(|(_, d)| d.clone());
        for dep in deps.unwrap_or_default() {
            if let Some(cycle) = visit(&dep, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.push(at.to_owned());
        None
    }
    let mut done = Vec::new();
    graph
        .iter()
        .find_map(|(name, _)| visit(name, graph, &mut Vec::new(), &mut done))
}

#[test]
fn modules_import_each_other_without_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (dir, prefix) in [
        ("shared/src", ""),
        ("shared/src/domain", "domain::"),
        ("edge/src", ""),
    ] {
        let graph = module_imports(&root.join(dir), prefix);
        assert!(graph.len() > 5, "{dir}: too few modules: {graph:?}");
        assert!(
            graph.iter().any(|(_, deps)| !deps.is_empty()),
            "{dir}: no imports found"
        );
        if let Some(cycle) = a_cycle(&graph) {
            panic!(
                "{dir}: modules import each other in a cycle: {}",
                cycle.join(" -> ")
            );
        }
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let g = |edges: &[(&str, &[&str])]| -> Vec<(String, Vec<String>)> {
        edges
            .iter()
            .map(|(n, d)| ((*n).to_owned(), d.iter().map(|s| (*s).to_owned()).collect()))
            .collect()
    };
    assert_eq!(
        a_cycle(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &[])])),
        None
    );
    assert_eq!(
        a_cycle(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

/// The `use` declarations in `text` that import a glob (`use a::*;`,
/// `use a::{b, *};`), as their first line's number and their text, left
/// out those inside a `#[cfg(test)]` module (tests may `use super::*;`).
/// When line `i` opens a `#[cfg(test)]` module: the index of the line
/// after it closes.
fn test_module_end(lines: &[&str], i: usize) -> Option<usize> {
    if lines[i].trim_start() != "#[cfg(test)]" {
        return None;
    }
    let mut j = i + 1;
    while lines
        .get(j)
        .is_some_and(|l| l.trim_start().starts_with("#["))
    {
        j += 1;
    }
    let item = lines.get(j).copied().unwrap_or("");
    let head = item.trim_start();
    if !(head.split_whitespace().any(|w| w == "mod") && head.ends_with('{')) {
        return None;
    }
    // rustfmt closes the module at the indent it opened it.
    let close = format!("{}}}", &item[..item.len() - head.len()]);
    while j < lines.len() && lines[j] != close {
        j += 1;
    }
    Some(j + 1)
}

fn glob_imports(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        if let Some(after) = test_module_end(&lines, i) {
            i = after;
            continue;
        }
        let is_use = line.starts_with("use ")
            || (line.starts_with("pub") && line.split_whitespace().nth(1) == Some("use"));
        if !is_use {
            i += 1;
            continue;
        }
        let first = i;
        let mut decl = String::new();
        while let Some(l) = lines.get(i) {
            if !decl.is_empty() {
                decl.push(' ');
            }
            decl.push_str(l.trim());
            i += 1;
            if l.trim_end().ends_with(';') {
                break;
            }
        }
        let compact: String = decl.chars().filter(|c| !c.is_whitespace()).collect();
        if compact.contains("::*") || compact.contains("{*") || compact.contains(",*") {
            found.push((first + 1, decl));
        }
    }
    found
}

#[test]
fn the_domain_has_no_glob_imports_outside_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/src/domain");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 20, "too few files under {}", root.display());
    let mut found = Vec::new();
    for file in &files {
        if file.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let name = file.strip_prefix(&root).unwrap_or(file).display();
        for (line, decl) in glob_imports(&text) {
            found.push(format!("shared/src/domain/{name}:{line}: {decl}"));
        }
    }
    assert!(
        found.is_empty(),
        "glob imports in the domain outside its tests; import the names used \
         (and re-export from a mod.rs only what callers use):\n{}",
        found.join("\n")
    );
}

/// What names a stored attribute or index attribute by string, or reads
/// a stored item by attribute name: the domain writes these through its
/// records' `Attr` constants and `Changes`, and decodes items into
/// records (issue 38). (JSON that is not a stored item, such as an event's
/// payload, is not matched.)
const UNTYPED_STORAGE: [&str; 20] = [
    "Cond::eq(",
    "Cond::ne(",
    "Cond::lt(",
    "Cond::le(",
    "Cond::gt(",
    "Cond::ge(",
    "Cond::Cmp(",
    "Cond::AttrExists(",
    "Cond::AttrNotExists(",
    "Update::new(",
    "Update::default(",
    ".set(\"",
    ".add(\"",
    ".remove(\"",
    "item.get(\"",
    "|i| i.get(\"",
    ".pk_attr()",
    ".sk_attr()",
    "(Index, String, String)",
    "record::to_item(",
];

/// The lines of `text` outside `#[cfg(test)]` modules (comments left out)
/// that hold one of [`UNTYPED_STORAGE`].
fn untyped_storage(text: &str) -> Vec<(usize, String)> {
    lines_outside_tests(text, |_, _, code| {
        UNTYPED_STORAGE.iter().any(|p| code.contains(p))
    })
}

/// The lines of `text` outside `#[cfg(test)]` modules for which `hit`
/// holds, given all lines, the line's index and its code (comments left
/// out), as their numbers and trimmed text.
fn lines_outside_tests(
    text: &str,
    hit: impl Fn(&[&str], usize, &str) -> bool,
) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(after) = test_module_end(&lines, i) {
            i = after;
            continue;
        }
        let code = lines[i].split("//").next().unwrap_or("");
        if hit(&lines, i, code) {
            found.push((i + 1, lines[i].trim().to_owned()));
        }
        i += 1;
    }
    found
}

/// What `scan` finds in the domain's files outside its tests and `skip`,
/// as `shared/src/domain/<file>:<line>: <code>`.
fn domain_findings(skip: &[&str], scan: fn(&str) -> Vec<(usize, String)>) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/src/domain");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 20, "too few files under {}", root.display());
    let mut found = Vec::new();
    for file in &files {
        let name = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        if skip.contains(&name.as_str()) || name.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (line, code) in scan(&text) {
            found.push(format!("shared/src/domain/{name}:{line}: {code}"));
        }
    }
    found
}

#[test]
fn the_domain_names_stored_attributes_only_through_its_records() {
    // The typed layer itself, and the tests (which write raw items on
    // purpose, and the fixture test that reads them).
    let found = domain_findings(&["record.rs", "stored_shapes.rs"], untyped_storage);
    assert!(
        found.is_empty(),
        "attribute names as strings in the domain; declare the attribute on \
         its record (attrs!) and write conditions and updates with it:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_storage_scan_finds_what_it_looks_for() {
    let text = "let c = Cond::eq(\"status\", \"pending\");\n\
                let ok = Payment::STATUS.eq(&s);\n\
                // Cond::eq(\"in a comment\")\n\
                let u = Update::new()\n    .set(\"a\", 1);\n\
                let v = item.get(\"amount\");\n\
                #[cfg(test)]\nmod tests {\n    fn t() { Cond::eq(\"x\", 1); }\n}\n\
                let k = Index::Gsi2.sk_attr();\n";
    let lines: Vec<usize> = untyped_storage(text).into_iter().map(|(l, _)| l).collect();
    assert_eq!(lines, vec![1, 4, 5, 6, 11]);
}

#[test]
fn the_glob_scan_finds_what_it_looks_for() {
    let text = "use super::*;\n\
                use a::{b, c};\n\
                pub use x::{\n    y,\n    *,\n};\n\
                fn f() {\n    use std::io::*;\n}\n\
                #[cfg(test)]\nconst X: u8 = 1;\n\
                pub(crate) use z::*;\n\
                #[cfg(test)]\nmod tests {\n    use super::*;\n    fn g() {\n        use q::*;\n    }\n}\n\
                use after::*;\n";
    let lines: Vec<usize> = glob_imports(text).into_iter().map(|(l, _)| l).collect();
    assert_eq!(lines, vec![1, 3, 8, 12, 20]);
}

/// The lint names that, allowed, would let a long function or a long
/// argument list into the shared crate: the two lints and the groups that
/// hold them.
const LENGTH_LINTS: [&str; 5] = [
    "too_many_lines",
    "too_many_arguments",
    "clippy::pedantic",
    "clippy::complexity",
    "clippy::all",
];

/// The `allow(...)` and `expect(...)` lists in `text` (comments left out)
/// that name one of [`LENGTH_LINTS`], with the line they start on.
fn length_allows(text: &str) -> Vec<(usize, String)> {
    let code: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("//") {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    for opener in ["allow(", "expect("] {
        for (at, _) in code.match_indices(opener) {
            let rest = &code[at..];
            let list = &rest[..rest.find(')').unwrap_or(rest.len())];
            if LENGTH_LINTS.iter().any(|lint| list.contains(lint)) {
                let line = code[..at].matches('\n').count() + 1;
                found.push((line, list.split_whitespace().collect::<Vec<_>>().join(" ")));
            }
        }
    }
    found.sort();
    found
}

/// Issue 38: no function of the shared crate's non-test code is over 100
/// lines (clippy's `too_many_lines`, on in its lib.rs at the threshold of
/// shared/clippy.toml), and none takes more arguments than clippy allows;
/// neither lint is allowed anywhere in it.
#[test]
fn the_shared_crate_allows_no_long_function_or_argument_list() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared");
    let lib = std::fs::read_to_string(shared.join("src/lib.rs")).unwrap_or_default();
    assert!(
        lib.contains("#![cfg_attr(not(test), warn(clippy::too_many_lines))]"),
        "shared/src/lib.rs no longer turns on clippy::too_many_lines"
    );
    let config = std::fs::read_to_string(shared.join("clippy.toml")).unwrap_or_default();
    assert!(
        config
            .lines()
            .any(|l| l.replace(' ', "") == "too-many-lines-threshold=100"),
        "shared/clippy.toml no longer holds functions to 100 lines:\n{config}"
    );
    let mut files = Vec::new();
    rust_files(&shared.join("src"), &mut files);
    assert!(files.len() > 50, "too few files: {}", files.len());
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (line, list) in length_allows(&text) {
            found.push(format!("{}:{line}: {list}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "split the function or take a parameter struct instead of allowing the lint:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_allow_scan_finds_what_it_looks_for() {
    let text = "#[allow(clippy::too_many_arguments)]\nfn a() {}\n\
                #[cfg_attr(feature = \"x\", expect(\n    clippy::too_many_lines,\n))]\nfn b() {}\n\
                #![allow(clippy::pedantic)]\n\
                // #[allow(clippy::too_many_lines)] in a comment\n\
                #[allow(clippy::type_complexity)]\nfn c() { x.expect(\"too long\"); }\n\
                #![cfg_attr(not(test), warn(clippy::too_many_lines))]\n";
    let found: Vec<usize> = length_allows(text).into_iter().map(|(l, _)| l).collect();
    assert_eq!(found, vec![1, 3, 7], "{:?}", length_allows(text));
}

/// Names of fields and parameters that hold someone else's id: a
/// provider's reference, the merchant's own reference for a customer or an
/// order, a request's or an idempotency key's. Only our ids are typed.
const EXTERNAL_IDS: [&str; 10] = [
    "provider_refund_id",
    // The mail service's id of a sent message (SES's MessageId).
    "provider_message_id",
    "customer_id",
    "reference_id",
    "transaction_id",
    "purchase_order_id",
    "trace_id",
    "request_id",
    "external_customer_id",
    "idempotency_key_id",
];

/// The types an id of ours must not travel as.
const UNTYPED_ID_TYPES: [&str; 9] = [
    "String",
    "&str",
    "&'a str",
    "&String",
    "Option<String>",
    "Option<&str>",
    "Vec<String>",
    "&[String]",
    "impl Into<String>",
];

/// Whether line `i` sits in a struct that is an API shape (derives
/// `ToSchema`): views keep string ids so the OpenAPI document stays as it
/// is; they are filled from the typed records.
fn in_api_shape(lines: &[&str], i: usize) -> bool {
    let item_starts = [
        "struct ", "enum ", "fn ", "impl ", "impl<", "mod ", "trait ",
    ];
    let Some(head) = (0..=i).rev().find(|&j| {
        let l = lines[j]
            .trim_start()
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ")
            .trim_start_matches("async ");
        item_starts.iter().any(|s| l.starts_with(s))
    }) else {
        return false;
    };
    let l = lines[head].trim_start();
    if !l.contains("struct ") {
        return false;
    }
    (0..head)
        .rev()
        .take_while(|&j| {
            let a = lines[j].trim_start();
            a.starts_with("#[") || a.starts_with("///") || a.starts_with(')') || a.ends_with(',')
        })
        .any(|j| lines[j].contains("ToSchema"))
}

/// The lines of `text` outside `#[cfg(test)]` modules (comments left out)
/// where a field or parameter named as one of our ids (`id`, `…_id`,
/// `ids`, `…_ids`) has a string type.
fn untyped_ids(text: &str) -> Vec<(usize, String)> {
    lines_outside_tests(text, |lines, i, code| {
        let bad = code.match_indices(": ").any(|(at, _)| {
            let name: String = code[..at]
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let ours =
                name == "id" || name == "ids" || name.ends_with("_id") || name.ends_with("_ids");
            let ty = code[at + 2..].trim_start();
            let untyped = UNTYPED_ID_TYPES.iter().any(|t| {
                ty.strip_prefix(t)
                    .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric()))
            });
            ours && untyped && !EXTERNAL_IDS.contains(&name.as_str())
        });
        bad && !in_api_shape(lines, i)
    })
}

#[test]
fn the_domain_holds_and_takes_our_ids_typed() {
    let found = domain_findings(&[], untyped_ids);
    assert!(
        found.is_empty(),
        "ids of ours as strings in a stored record or a domain signature; use \
         the kind's type from shared::ids (parsed at the edge):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_id_scan_finds_what_it_looks_for() {
    let text = "pub struct Payment {\n    pub id: String,\n    pub project_id: ProjectId,\n\
                    pub provider_refund_id: Option<String>,\n    pub link_ids: Vec<String>,\n}\n\
                pub async fn find(store: &dyn Store, id: &str) {}\n\
                #[derive(Serialize, utoipa::ToSchema)]\npub struct PaymentView {\n    pub id: String,\n}\n\
                fn f(payment_id: Option<&str>, idx: &str, id: PaymentId, ident: String) {}\n\
                // fn g(id: &str)\n\
                #[cfg(test)]\nmod tests {\n    fn t(id: &str) {}\n}\n\
                fn h(session_id: &String) {}\n";
    let lines: Vec<usize> = untyped_ids(text).into_iter().map(|(l, _)| l).collect();
    assert_eq!(lines, vec![2, 5, 7, 12, 18]);
}

/// What reaches around the domain to the store from a handler.
const STORE_REACHES: [&str; 4] = [
    "&*state.store",
    "state.store.as_ref()",
    "&state.store",
    "state.store.clone()",
];

#[test]
fn handlers_reach_the_store_only_through_the_domain() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&root.join("functions"), &mut files);
    rust_files(&root.join("edge/src"), &mut files);
    assert!(files.len() > 20, "too few handler files");
    let mut found = Vec::new();
    for file in files.iter().filter(|f| !f.ends_with("tests.rs")) {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let name = file.strip_prefix(&root).unwrap_or(file).display();
        let reaches = lines_outside_tests(&text, |_, _, code| {
            STORE_REACHES.iter().any(|p| code.contains(p))
        });
        for (line, code) in reaches {
            found.push(format!("{name}:{line}: {code}"));
        }
    }
    assert!(
        found.is_empty(),
        "handlers hand the store to the domain; give the domain the deps \
         (`&state`) and let it take the store and the clock itself:\n{}",
        found.join("\n")
    );
}
