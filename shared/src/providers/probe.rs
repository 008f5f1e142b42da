//! Asking a provider whether a project's credentials work, without a
//! payment: a read-only status check of a payment that does not exist,
//! whose answer says whether the credentials got past the provider's
//! checks (the dashboard's "Ask the provider").
//!
//! - Khalti authenticates every call first (`401 "Invalid token."`), then
//!   answers a lookup of an unknown `pidx` with `404 "Not found."`: that
//!   answer proves the key.
//! - Fonepay's QR status checks the merchant code, user, password and the
//!   HMAC (`dataValidation`, made with the secret key) before the PRN
//!   ("Invalid Merchant Code", "Invalid username", "Data Validation
//!   Failed"); an answer about the PRN proves all four. Its exact words for
//!   an unknown PRN are unconfirmed (research notes, 3.2), so an answer
//!   that names neither is reported as it came, not as a verdict.
//! - eSewa's status check takes no secret and answers `NOT_FOUND` for any
//!   unknown product code or id alike: no call proves eSewa credentials,
//!   and none is made. The first signed return that verifies proves them.

use super::{ProviderClient, ProviderCredentials, ProviderError, StatusQuery, new_reference};
use crate::kinds::Provider;
use crate::money::Paisa;

/// What the provider's answer says of the credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// They got past the provider's checks.
    Accepted(String),
    /// The provider refused them.
    Refused(String),
    /// No verdict this time (the provider unreachable, or its answer does
    /// not say): try again later.
    Unknown(String),
    /// The provider has no call that proves them (eSewa).
    Unprovable(String),
}

impl Verdict {
    /// One word for logs and the audit log.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Accepted(_) => "accepted",
            Verdict::Refused(_) => "refused",
            Verdict::Unknown(_) => "unknown",
            Verdict::Unprovable(_) => "unprovable",
        }
    }

    /// What to tell the person who asked.
    pub fn message(&self) -> &str {
        match self {
            Verdict::Accepted(m)
            | Verdict::Refused(m)
            | Verdict::Unknown(m)
            | Verdict::Unprovable(m) => m,
        }
    }
}

/// Asks `client`'s provider about `creds` (at most one read-only call,
/// bounded by the client's timeout).
pub async fn ask(client: &dyn ProviderClient, creds: &ProviderCredentials) -> Verdict {
    let provider = client.provider();
    if creds.provider() != provider {
        return Verdict::Refused(format!(
            "these are {} credentials, not {}",
            creds.provider().display_name(),
            provider.display_name()
        ));
    }
    if provider == Provider::Esewa {
        return Verdict::Unprovable(
            "eSewa has no call that proves credentials: its status check takes no secret key. \
             The first signed payment return that verifies proves them."
                .into(),
        );
    }
    // A payment nobody made: a fresh reference (and, for Khalti, pidx).
    let reference = new_reference();
    let query = StatusQuery {
        reference: reference.clone(),
        amount: Paisa::new(1000).unwrap_or_default(),
        provider_ref: (provider == Provider::Khalti).then(|| reference.clone()),
    };
    let name = provider.display_name();
    match client.status(creds, &query).await {
        Ok(s) => Verdict::Accepted(format!(
            "{name} accepted the credentials (a check of a payment that does not exist answered {:?}).",
            s.raw_status
        )),
        Err(ProviderError::Rejected { code, message }) => judge(provider, &code, &message),
        Err(e @ (ProviderError::Timeout | ProviderError::Unavailable(_))) => {
            Verdict::Unknown(format!("{name} could not be asked ({e}); try again later."))
        }
        Err(ProviderError::Invalid(why)) => Verdict::Refused(format!(
            "{name} cannot be asked with these credentials: {why}"
        )),
        Err(e) => Verdict::Unknown(format!("{name}'s answer does not say: {e}")),
    }
}

/// A provider's refusal of the check, read for what it says of the
/// credentials.
fn judge(provider: Provider, code: &str, message: &str) -> Verdict {
    let name = provider.display_name();
    let said = format!("{name} said: {code}: {message}");
    if matches!(code, "http_401" | "http_403" | "401" | "403") {
        return Verdict::Refused(format!("{name} refused the credentials. {said}"));
    }
    if provider == Provider::Fonepay {
        let m = message.to_ascii_lowercase();
        let about_credentials = [
            "merchant code",
            "username",
            "password",
            "data validation",
            "unauthori",
        ];
        if about_credentials.iter().any(|w| m.contains(w)) {
            return Verdict::Refused(format!("{name} refused the credentials. {said}"));
        }
        if m.contains("prn") {
            return Verdict::Accepted(format!(
                "{name} accepted the credentials: it checked them, then answered about the made-up payment. {said}"
            ));
        }
    }
    Verdict::Unknown(format!(
        "The answer does not say whether the credentials work. {said}"
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::providers::mock::Mock;
    use crate::providers::{ProviderClients, ProviderConfig};

    fn clients(mock: &Mock) -> ProviderClients {
        let cfg = ProviderConfig::for_base(&mock.base).with_timeout(Duration::from_millis(300));
        ProviderClients::new(&cfg).expect("clients")
    }

    fn khalti() -> ProviderCredentials {
        ProviderCredentials::Khalti {
            secret_key: "live_secret_key_68791341fdd94846a146f0457ff7b455".into(),
        }
    }

    fn fonepay() -> ProviderCredentials {
        ProviderCredentials::Fonepay {
            merchant_code: "NBQM".into(),
            secret_key: "a7e3512f5032480a83137793cb2021dc".into(),
            username: "9861101076".into(),
            password: "admin123456".into(),
        }
    }

    #[tokio::test]
    async fn khalti_is_judged_by_its_lookup_of_a_made_up_pidx() {
        let mock = Mock::start().await;
        let c = clients(&mock);
        mock.reply(
            404,
            r#"{"detail": "Not found.", "error_key": "validation_error"}"#,
        );
        let v = ask(&c.khalti, &khalti()).await;
        assert_eq!(v.word(), "accepted", "{v:?}");
        let sent = mock.requests();
        assert_eq!(sent.len(), 1);
        assert!(
            sent[0].path.ends_with("/epayment/lookup/"),
            "{}",
            sent[0].path
        );
        let pidx = sent[0].json()["pidx"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(pidx.len(), 20, "a fresh made-up pidx");
        mock.reply(401, r#"{"detail": "Invalid token.", "status_code": 401}"#);
        let v = ask(&c.khalti, &khalti()).await;
        assert_eq!(v.word(), "refused", "{v:?}");
        assert!(v.message().contains("Invalid token."), "{v:?}");
        // A page that is not Khalti's answer proves nothing either way.
        mock.reply(404, "<html>Not Found</html>");
        assert_eq!(ask(&c.khalti, &khalti()).await.word(), "unknown");
        mock.reply(503, "down");
        let v = ask(&c.khalti, &khalti()).await;
        assert_eq!(v.word(), "unknown", "{v:?}");
        assert!(v.message().contains("try again later"), "{v:?}");
        // Never the key itself in what is shown.
        assert!(!v.message().contains("live_secret_key"));
    }

    #[tokio::test]
    async fn fonepay_is_judged_by_what_its_status_check_refuses() {
        let mock = Mock::start().await;
        let c = clients(&mock);
        let error = |m: &str| {
            format!(
                r#"{{"documentation":"Merchant request Exception","errorCode":406,"message":"{m}"}}"#
            )
        };
        for (message, word) in [
            ("Invalid PRN", "accepted"),
            ("Data Validation Failed", "refused"),
            ("Invalid Merchant Code", "refused"),
            ("Invalid username", "refused"),
            ("Invalid password", "refused"),
            ("Something else", "unknown"),
        ] {
            mock.reply(200, error(message));
            let v = ask(&c.fonepay, &fonepay()).await;
            assert_eq!(v.word(), word, "{message}: {v:?}");
            assert!(v.message().contains(message), "{v:?}");
        }
        mock.reply(
            200,
            r#"{"fonepayTraceId":0,"merchantCode":"NBQM","paymentStatus":"failed"}"#,
        );
        assert_eq!(ask(&c.fonepay, &fonepay()).await.word(), "accepted");
        let sent = mock.requests();
        let body = sent.last().map(|r| r.json()).unwrap_or_default();
        assert_eq!(body["merchantCode"], "NBQM");
        assert!(
            !body.to_string().contains("a7e3512f"),
            "the secret signs, never travels"
        );
    }

    #[tokio::test]
    async fn esewa_is_not_asked_and_credentials_must_match_the_provider() {
        let mock = Mock::start().await;
        let c = clients(&mock);
        let esewa = ProviderCredentials::Esewa {
            product_code: "EPAYTEST".into(),
            secret_key: "8gBm/:&EnhH.1/q".into(),
        };
        assert_eq!(ask(&c.esewa, &esewa).await.word(), "unprovable");
        assert_eq!(ask(&c.khalti, &esewa).await.word(), "refused");
        assert!(mock.requests().is_empty(), "no call made");
    }
}
