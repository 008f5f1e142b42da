//! The providers' message signatures, in one place for the clients and the
//! simulators alike, pinned by the published test vectors
//! (`../shared/research/providers.md`).
//!
//! - eSewa ePay v2: HMAC-SHA256 over `name=value` pairs joined by `,`, in
//!   the order of `signed_field_names`, Base64 (standard, padded).
//! - Fonepay: HMAC-SHA512 over the *values* joined by `,`, lowercase hex
//!   (compared case-insensitively).
//!
//! Khalti signs nothing: its API authenticates with `Authorization: Key`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha512};
use subtle::ConstantTimeEq;

/// `name=value,name=value`: the eSewa signing message.
pub fn esewa_message(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Base64 HMAC-SHA256 of `message` under the eSewa secret key.
pub fn esewa_signature(secret: &str, message: &str) -> String {
    // HMAC accepts keys of any length; the error branch cannot happen.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else {
        return String::new();
    };
    mac.update(message.as_bytes());
    STANDARD.encode(mac.finalize().into_bytes())
}

/// Whether `signature` is the eSewa signature of `message` (constant time).
pub fn esewa_verify(secret: &str, message: &str, signature: &str) -> bool {
    let expected = esewa_signature(secret, message);
    !signature.is_empty() && bool::from(expected.as_bytes().ct_eq(signature.as_bytes()))
}

/// Lowercase hex HMAC-SHA512 of the values joined by `,` (Fonepay's DV).
pub fn fonepay_data_validation(secret: &str, values: &[&str]) -> String {
    let Ok(mut mac) = Hmac::<Sha512>::new_from_slice(secret.as_bytes()) else {
        return String::new();
    };
    mac.update(values.join(",").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Whether `dv` is the Fonepay DV of `values` (hex, any case; constant time).
pub fn fonepay_verify(secret: &str, values: &[&str], dv: &str) -> bool {
    let expected = fonepay_data_validation(secret, values);
    let given = dv.to_ascii_lowercase();
    !given.is_empty() && bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ESEWA_TEST_SECRET: &str = "8gBm/:&EnhH.1/q";

    #[test]
    fn esewa_request_vector() {
        let msg = esewa_message(&[
            ("total_amount", "110"),
            ("transaction_uuid", "241028"),
            ("product_code", "EPAYTEST"),
        ]);
        assert_eq!(
            msg,
            "total_amount=110,transaction_uuid=241028,product_code=EPAYTEST"
        );
        assert_eq!(
            esewa_signature(ESEWA_TEST_SECRET, &msg),
            "i94zsd3oXF6ZsSr/kGqT4sSzYQzjj1W/waxjWyRwaME="
        );
    }

    #[test]
    fn esewa_callback_vector_signs_its_own_field_list() {
        let names =
            "transaction_code,status,total_amount,transaction_uuid,product_code,signed_field_names";
        let msg = esewa_message(&[
            ("transaction_code", "000AWEO"),
            ("status", "COMPLETE"),
            ("total_amount", "1000.0"),
            ("transaction_uuid", "250610-162413"),
            ("product_code", "EPAYTEST"),
            ("signed_field_names", names),
        ]);
        let sig = "62GcfZTmVkzhtUeh+QJ1AqiJrjoWWGof3U+eTPTZ7fA=";
        assert!(esewa_verify(ESEWA_TEST_SECRET, &msg, sig));
        // The amount as sent: "1000" is another message.
        let reformatted = msg.replace("total_amount=1000.0", "total_amount=1000");
        assert!(!esewa_verify(ESEWA_TEST_SECRET, &reformatted, sig));
        assert!(!esewa_verify("wrong", &msg, sig));
        assert!(!esewa_verify(ESEWA_TEST_SECRET, &msg, ""));
    }

    #[test]
    fn fonepay_vectors() {
        let key = "a7e3512f5032480a83137793cb2021dc";
        let cases: [(&str, &[&str], &str, &str); 5] = [
            (
                key,
                &[
                    "14",
                    "5d76d323-d1f6-4a38-8231-0063f9581c98",
                    "NBQM",
                    "test1",
                    "test2",
                ],
                "43d2f0939e58e038",
                "0eaca7d7",
            ),
            (
                key,
                &["5d76d323-d1f6-4a38-8231-0063f9581c98", "NBQM"],
                "de5fd3bbbd7d36c7",
                "a9b032b7",
            ),
            (
                key,
                &["14", "5d76d323-d1f6", "NBQM", "test1", "test2"],
                "5ae718032328ae56",
                "a8bbdbaf",
            ),
            (
                key,
                &[
                    "35132",
                    "e85d2ae7-e342-4a1c-81d7-536867a6720e",
                    "IN2_e85d2ae7-e342-4a1c-81d7-536867a6720e",
                    "2076.09.29",
                    "14",
                    "NBQM",
                ],
                "4b3fbd3dbfdf2e6d",
                "7b4eb8a4",
            ),
            (
                "fonepay",
                &["50", "check", "fonepay123", "test1", "test2"],
                "f036eb09c5402a91",
                "c8ac4204",
            ),
        ];
        for (secret, values, head, tail) in cases {
            let dv = fonepay_data_validation(secret, values);
            assert_eq!(dv.len(), 128);
            assert!(
                dv.starts_with(head) && dv.ends_with(tail),
                "{values:?}: {dv}"
            );
            assert!(
                fonepay_verify(secret, values, &dv.to_ascii_uppercase()),
                "hex case is ignored"
            );
            assert!(!fonepay_verify(secret, &values[1..], &dv));
        }
    }
}
