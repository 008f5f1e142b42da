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
