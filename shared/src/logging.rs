//! A deployed function's log output, as Lambda's advanced logging controls
//! ask for it: the level from `AWS_LAMBDA_LOG_LEVEL` (else `RUST_LOG`,
//! else `INFO`), JSON lines when `AWS_LAMBDA_LOG_FORMAT` is `JSON`, plain
//! lines otherwise; no timestamps (CloudWatch stamps each line) and no
//! colours.
//!
//! This is what `lambda_runtime`'s default subscriber does, with a
//! [`Targets`] filter (`info`, `warn,shared=debug`) instead of its
//! `EnvFilter`: that one compiles directives with the `regex` crates,
//! about half a megabyte of every function and a part of its cold start
//! for span and field filters no one sets on Lambda (issue 21).

use tracing_subscriber::filter::{LevelFilter, Targets};

/// Sets this process's subscriber from the environment. Call once, first
/// thing in `main`.
pub fn init_lambda() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let lookup = |name: &str| std::env::var(name).ok();
    let lines = tracing_subscriber::fmt::layer()
        .with_target(false)
        .without_time()
        .with_ansi(false);
    let registry = tracing_subscriber::registry().with(filter_from(lookup));
    // A second call keeps the first subscriber.
    let _ = if json_from(lookup) {
        registry.with(lines.json()).try_init()
    } else {
        registry.with(lines).try_init()
    };
}

/// Whether lines are JSON: `AWS_LAMBDA_LOG_FORMAT=JSON`, in any case.
pub fn json_from(lookup: impl Fn(&str) -> Option<String>) -> bool {
    lookup("AWS_LAMBDA_LOG_FORMAT").is_some_and(|f| f.trim().eq_ignore_ascii_case("json"))
}

/// The filter: `AWS_LAMBDA_LOG_LEVEL` when set (one of Lambda's levels,
/// `FATAL` being `error` here), else `RUST_LOG`'s directives
/// (`level` or `target=level`, comma-separated), else `info`. A value
/// that does not parse is `info`, not silence.
pub fn filter_from(lookup: impl Fn(&str) -> Option<String>) -> Targets {
    let set = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
    let info = Targets::new().with_default(LevelFilter::INFO);
    if let Some(level) = set("AWS_LAMBDA_LOG_LEVEL") {
        let level = level.trim();
        let level = if level.eq_ignore_ascii_case("fatal") {
            LevelFilter::ERROR
        } else {
            level.parse().unwrap_or(LevelFilter::INFO)
        };
        return Targets::new().with_default(level);
    }
    match set("RUST_LOG") {
        Some(directives) => directives.trim().parse().unwrap_or(info),
        None => info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    fn logs(filter: &Targets, target: &str, level: Level) -> bool {
        filter.would_enable(target, &level)
    }

    #[test]
    fn info_when_nothing_is_set() {
        let f = filter_from(env(&[]));
        assert!(logs(&f, "shared::store", Level::INFO));
        assert!(!logs(&f, "shared::store", Level::DEBUG));
    }

    #[test]
    fn lambda_level_wins_over_rust_log() {
        let f = filter_from(env(&[
            ("AWS_LAMBDA_LOG_LEVEL", "DEBUG"),
            ("RUST_LOG", "error"),
        ]));
        assert!(logs(&f, "edge", Level::DEBUG));
        assert!(!logs(&f, "edge", Level::TRACE));
    }

    #[test]
    fn every_lambda_level_parses() {
        for (name, on, off) in [
            ("TRACE", Level::TRACE, None),
            ("DEBUG", Level::DEBUG, Some(Level::TRACE)),
            ("INFO", Level::INFO, Some(Level::DEBUG)),
            ("WARN", Level::WARN, Some(Level::INFO)),
            ("ERROR", Level::ERROR, Some(Level::WARN)),
            ("FATAL", Level::ERROR, Some(Level::WARN)),
        ] {
            let f = filter_from(env(&[("AWS_LAMBDA_LOG_LEVEL", name)]));
            assert!(logs(&f, "x", on), "{name} should log {on}");
            if let Some(off) = off {
                assert!(!logs(&f, "x", off), "{name} should not log {off}");
            }
        }
    }

    #[test]
    fn rust_log_directives_name_targets() {
        let f = filter_from(env(&[("RUST_LOG", "warn,shared::store=debug")]));
        assert!(logs(&f, "shared::store::dynamo", Level::DEBUG));
        assert!(!logs(&f, "edge", Level::INFO));
        assert!(logs(&f, "edge", Level::WARN));
    }

    #[test]
    fn what_does_not_parse_is_info_not_silence() {
        for pairs in [
            [("AWS_LAMBDA_LOG_LEVEL", "loud")],
            [("RUST_LOG", "shared=[{x}]=")],
        ] {
            let f = filter_from(env(&pairs));
            assert!(logs(&f, "x", Level::INFO), "{pairs:?}");
            assert!(!logs(&f, "x", Level::DEBUG), "{pairs:?}");
        }
    }

    #[test]
    fn json_only_when_asked() {
        assert!(json_from(env(&[("AWS_LAMBDA_LOG_FORMAT", "JSON")])));
        assert!(json_from(env(&[("AWS_LAMBDA_LOG_FORMAT", "json")])));
        assert!(!json_from(env(&[("AWS_LAMBDA_LOG_FORMAT", "Text")])));
        assert!(!json_from(env(&[])));
    }
}
