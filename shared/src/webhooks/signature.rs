//! Webhook signatures (spec "Events", decisions "Webhooks"):
//! `X-Service-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
//!
//! [`sign`] makes the header for a delivery; [`verify`] is what a receiver
//! runs (and what our own tests run): parse `t` and every `v1`, compare in
//! constant time against each of the receiver's secrets (several during a
//! rotation), and refuse a timestamp more than [`TOLERANCE_SECONDS`] away.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The signature header's name.
pub const SIGNATURE_HEADER: &str = "X-Service-Signature";
/// The timestamp header's name.
pub const TIMESTAMP_HEADER: &str = "X-Service-Timestamp";
/// How far a delivery's timestamp may be from the receiver's clock.
pub const TOLERANCE_SECONDS: i64 = 300;

/// Why a delivery does not verify.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the signature header is malformed: {0}")]
    Malformed(&'static str),
    #[error("the delivery is {0} s away from now (more than {TOLERANCE_SECONDS} s)")]
    Stale(i64),
    #[error("no signature matches")]
    NoMatch,
}

fn mac_hex(secret: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length: `new_from_slice` cannot fail here.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// The signature header of `body` sent at `timestamp` (unix seconds).
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    format!("t={timestamp},v1={}", mac_hex(secret, timestamp, body))
}

/// The header's timestamp and its `v1` signatures.
pub fn parse(header: &str) -> Result<(i64, Vec<String>), VerifyError> {
    let mut t = None;
    let mut v1 = Vec::new();
    for part in header.split(',') {
        let Some((k, v)) = part.trim().split_once('=') else {
            return Err(VerifyError::Malformed("parts are key=value"));
        };
        match k {
            "t" => {
                if t.is_some() {
                    return Err(VerifyError::Malformed("t appears twice"));
                }
                t = Some(
                    v.parse::<i64>()
                        .map_err(|_| VerifyError::Malformed("t is not unix seconds"))?,
                );
            }
            "v1" => v1.push(v.to_ascii_lowercase()),
            // Other schemes (a future v2) are ignored, as receivers should.
            _ => {}
        }
    }
    let t = t.ok_or(VerifyError::Malformed("no t"))?;
    if v1.is_empty() {
        return Err(VerifyError::Malformed("no v1"));
    }
    Ok((t, v1))
}

/// Verifies a delivery: `header` as received, the raw `body`, the
/// receiver's `secrets` (any may match), its clock `now` (unix seconds).
pub fn verify(header: &str, body: &[u8], secrets: &[&str], now: i64) -> Result<(), VerifyError> {
    let (t, signatures) = parse(header)?;
    let skew = (now - t).abs();
    if skew > TOLERANCE_SECONDS {
        return Err(VerifyError::Stale(skew));
    }
    for secret in secrets {
        let expected = mac_hex(secret, t, body);
        for given in &signatures {
            if given.len() == expected.len()
                && bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
            {
                return Ok(());
            }
        }
    }
    Err(VerifyError::NoMatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_5f0c6d1e2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d";
    const BODY: &[u8] = br#"{"id":"evt_1","type":"payment.succeeded"}"#;

    #[test]
    fn the_signature_is_hmac_sha256_of_t_dot_body_in_hex() {
        // Independent reference: HMAC-SHA256("key", "1700000000.{}").
        let header = sign("key", 1_700_000_000, b"{}");
        let expected = {
            let mut mac = Hmac::<Sha256>::new_from_slice(b"key").unwrap();
            mac.update(b"1700000000.{}");
            hex::encode(mac.finalize().into_bytes())
        };
        assert_eq!(header, format!("t=1700000000,v1={expected}"));
        assert_eq!(expected.len(), 64);
    }

    #[test]
    fn a_signed_delivery_verifies_within_five_minutes() {
        let now = 1_795_400_000;
        let header = sign(SECRET, now, BODY);
        assert_eq!(verify(&header, BODY, &[SECRET], now), Ok(()));
        assert_eq!(verify(&header, BODY, &[SECRET], now + 300), Ok(()));
        assert_eq!(verify(&header, BODY, &[SECRET], now - 300), Ok(()));
        assert_eq!(
            verify(&header, BODY, &[SECRET], now + 301),
            Err(VerifyError::Stale(301))
        );
    }

    #[test]
    fn tampering_another_secret_or_a_bad_header_never_verifies() {
        let now = 1_795_400_000;
        let header = sign(SECRET, now, BODY);
        assert_eq!(
            verify(&header, b"{\"id\":\"evt_2\"}", &[SECRET], now),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            verify(&header, BODY, &["whsec_other"], now),
            Err(VerifyError::NoMatch)
        );
        // A replayed signature under a new timestamp.
        let moved = header.replace(&format!("t={now}"), &format!("t={}", now + 10));
        assert_eq!(
            verify(&moved, BODY, &[SECRET], now),
            Err(VerifyError::NoMatch)
        );
        for bad in ["", "t=1", "v1=ab", "t=x,v1=ab", "t=1,t=2,v1=ab", "garbage"] {
            assert!(
                matches!(
                    verify(bad, BODY, &[SECRET], now),
                    Err(VerifyError::Malformed(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn several_signatures_and_several_secrets_support_rotation() {
        let now = 1_795_400_000;
        let old = sign("whsec_old", now, BODY);
        let new = sign("whsec_new", now, BODY);
        let v1_new = new.split("v1=").nth(1).unwrap();
        let both = format!("{old},v1={v1_new}");
        assert_eq!(verify(&both, BODY, &["whsec_new"], now), Ok(()));
        assert_eq!(verify(&both, BODY, &["whsec_old"], now), Ok(()));
        assert_eq!(verify(&old, BODY, &["whsec_new", "whsec_old"], now), Ok(()));
        // Upper-case hex and unknown schemes are tolerated.
        let upper = format!(
            "{},v0=zz",
            old.to_uppercase().replace("T=", "t=").replace("V1=", "v1=")
        );
        assert_eq!(verify(&upper, BODY, &["whsec_old"], now), Ok(()));
    }
}
