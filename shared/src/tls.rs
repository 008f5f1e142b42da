//! The one TLS client configuration of the process's outbound HTTPS: the
//! providers' APIs, Fonepay's websocket, merchants' webhook endpoints and
//! the SMS provider. (The AWS SDK's clients have their own, pinned to
//! Amazon's roots: [`crate::aws`].)
//!
//! It trusts Mozilla's root program as the `webpki-roots` crate compiles
//! it in, not the platform's store. Reading and parsing the platform's
//! PEM bundle took 3.6 ms of every cold start that built a client (the
//! webhook and SMS dispatchers build theirs at start), against 2 ms for
//! the whole start of a hello-world function (issue 21, BENCHMARKS.md
//! §3); the compiled-in roots are already trust anchors, so nothing is
//! read or parsed. Every endpoint we call is public (a provider, a
//! merchant's server, an SMS gateway), and Amazon Linux's bundle is itself
//! derived from Mozilla's list; the roots move with
//! `cargo update -p webpki-roots`.

use std::sync::{Arc, OnceLock};

/// rustls on the aws-lc-rs provider (the one the AWS SDK already uses)
/// with Mozilla's roots, built once per process on first use and shared by
/// every outbound client. A failure (a provider without TLS 1.2 and 1.3)
/// is not remembered: the next call tries again.
pub fn outbound() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    if let Some(config) = CONFIG.get() {
        return Ok(config.clone());
    }
    let built = build()?;
    Ok(CONFIG.get_or_init(|| Arc::new(built)).clone())
}

fn build() -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_is_built_once_and_shared() {
        match (outbound(), outbound()) {
            (Ok(a), Ok(b)) => assert!(Arc::ptr_eq(&a, &b)),
            (a, b) => panic!("{:?} {:?}", a.err(), b.err()),
        }
    }

    /// Mozilla's program, as the platform has it (Debian's bundle here):
    /// the compiled-in list is not a foreign one. Every compiled-in root
    /// whose subject the platform knows has a key the platform has under
    /// that subject, and most are known to it (here 95 of 120; Debian's
    /// bundle, cut at another date, has 50 the compiled-in list lacks).
    #[test]
    fn the_roots_are_mozillas_as_the_platform_has_them() {
        let platform = rustls_native_certs::load_native_certs().certs;
        assert!(!platform.is_empty(), "no platform roots to compare with");
        let mut known = rustls::RootCertStore::empty();
        let (added, _) = known.add_parsable_certificates(platform);
        let compiled = webpki_roots::TLS_SERVER_ROOTS;
        assert!(compiled.len() >= 100, "{} roots", compiled.len());
        let mut shared = 0;
        for root in compiled {
            let same_subject: Vec<_> = known
                .roots
                .iter()
                .filter(|p| p.subject == root.subject)
                .collect();
            if !same_subject.is_empty() {
                assert!(
                    same_subject
                        .iter()
                        .any(|p| p.subject_public_key_info == root.subject_public_key_info),
                    "a root with another key under {:?}",
                    root.subject
                );
                shared += 1;
            }
        }
        assert!(
            shared * 3 >= compiled.len() * 2,
            "only {shared} of {} compiled-in roots are among the platform's {added}",
            compiled.len()
        );
    }
}
