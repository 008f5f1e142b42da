//! What the test command (`infra/test.sh`) provides to the tests.

/// The test venv's python (`DHUKUTI_TEST_PYTHON`, set by infra/test.sh).
/// When it is unset: panics under infra/test.sh (`DHUKUTI_REQUIRE_AWS`
/// set), otherwise says so on stderr and answers `None` (the caller
/// skips).
pub fn python() -> Option<std::path::PathBuf> {
    match std::env::var("DHUKUTI_TEST_PYTHON") {
        Ok(p) if !p.is_empty() => Some(std::path::PathBuf::from(p)),
        _ => {
            assert!(
                std::env::var("DHUKUTI_REQUIRE_AWS").is_err(),
                "DHUKUTI_TEST_PYTHON is not set (infra/test.sh sets it to the test venv's python)"
            );
            eprintln!("skipped: DHUKUTI_TEST_PYTHON is not set");
            None
        }
    }
}

/// A time written in a test (RFC 3339); a typo fails the test.
pub fn at(s: &str) -> crate::time::Timestamp {
    crate::time::Timestamp::parse(s).unwrap_or_else(|| panic!("bad time {s}"))
}

/// A fresh, empty in-memory embedded store.
pub fn memory_store() -> std::sync::Arc<dyn crate::store::Store> {
    match crate::store::embedded::EmbeddedStore::in_memory() {
        Ok(s) => std::sync::Arc::new(s),
        Err(e) => panic!("in-memory store: {e}"),
    }
}

/// The workspace's Rust sources under `dirs` (paths from the workspace
/// root; `target` dirs and files named `tests.rs` left out), each as its
/// path from the root and its code before any inline test module
/// (`#[cfg(test)] mod x {`), whitespace removed: what the guard tests
/// scan for writes that must go through one function.
#[cfg(test)]
pub fn flat_sources(dirs: &[&str]) -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs: Vec<std::path::PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    let mut out = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if !path.ends_with("target") {
                    dirs.push(path);
                }
                continue;
            }
            let name = path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string();
            if path.extension().is_none_or(|e| e != "rs") || name.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let flat = before_test_module(&text).split_whitespace().collect();
            out.push((name, flat));
        }
    }
    assert!(out.len() > 50, "too few sources under the workspace");
    out
}

/// `text` up to its inline test module (`#[cfg(test)] mod x {`), if any:
/// a test-only item elsewhere stays in (it may not break the rule either).
#[cfg(test)]
fn before_test_module(text: &str) -> &str {
    let mut at = 0;
    while let Some(i) = text[at..].find("#[cfg(test)]\nmod ") {
        let start = at + i;
        let line_end = text[start + 13..]
            .find('\n')
            .map_or(text.len(), |e| start + 13 + e);
        if text[start..line_end].trim_end().ends_with('{') {
            return &text[..start];
        }
        at = line_end;
    }
    text
}
