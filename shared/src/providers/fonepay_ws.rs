//! Fonepay's dynamic-QR websocket (providers.md 3.4): the hints Fonepay
//! pushes while a customer scans and pays. A hint is never proof: a scan
//! only tells the customer's screen (`qr.scanned`); a payment result is
//! read but not acted on (the stream asks the status API every second).
//!
//! Frames are JSON whose `transactionStatus` is itself a JSON string: a
//! scan carries `qrVerified` (the 2024 doc spells it `QRVerified`), a
//! result `paymentSuccess` (not `success`, which is true either way).

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::money::Paisa;

/// What one frame says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// The customer's app read the QR.
    Scanned,
    /// Fonepay says the payment went through (`paid`) or not: ask the
    /// status API, which alone decides. `commission`: the fee Fonepay
    /// states with it (`commissionAmount`, rupees, read exactly into
    /// paisa); `None` when absent or unreadable (logged).
    Result {
        paid: bool,
        commission: Option<Paisa>,
    },
}

/// The hint in one text frame, if it holds one.
pub fn parse_frame(text: &str) -> Option<Hint> {
    let outer: Value = serde_json::from_str(text).ok()?;
    // The inner object's text too: `commissionAmount` is read from its
    // JSON text, never through a float.
    let (inner, inner_text) = match outer.get("transactionStatus")? {
        Value::String(s) => (serde_json::from_str::<Value>(s).ok()?, s.clone()),
        // Some senders skip the double encoding.
        v @ Value::Object(_) => (
            v.clone(),
            crate::providers::amount::raw_field(text, "transactionStatus")?.to_owned(),
        ),
        _ => return None,
    };
    let inner = inner.as_object()?;
    let field = |name: &str| {
        inner
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    };
    if let Some(paid) = field("paymentSuccess").and_then(Value::as_bool) {
        return Some(Hint::Result {
            paid,
            commission: commission(&inner_text),
        });
    }
    match field("qrVerified").and_then(Value::as_bool) {
        Some(true) => Some(Hint::Scanned),
        _ => None,
    }
}

/// `commissionAmount` of a result's JSON text, exactly in paisa. A value
/// Fonepay cannot mean (negative, a third decimal, not a number) is a
/// provider error: logged, and no fee is taken from it.
fn commission(inner: &str) -> Option<Paisa> {
    let raw = crate::providers::amount::raw_field(inner, "commissionAmount")?;
    match crate::providers::amount::parse_commission(raw) {
        Ok(fee) => Some(fee),
        Err(crate::providers::amount::AmountError::Empty) => None,
        Err(e) => {
            let shown: String = raw.chars().take(40).collect();
            tracing::warn!(commission = %shown, error = %e, "fonepay websocket: unreadable commissionAmount ignored");
            None
        }
    }
}

/// Whether we may connect to `url` (see [`allowed_with`]): loopback only
/// off Lambda, where the runtime API listens on loopback.
pub fn allowed(url: &str) -> bool {
    allowed_with(url, std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_none())
}

/// Whether we may connect to `url`: Fonepay's answer names it, but it is
/// still a URL from outside, so only Fonepay's own hosts (`ws://` too:
/// the 2024 doc gives `ws://acquirer-websocket.fonepay.com/…`), and a
/// loopback host (the simulator) only when `loopback`.
pub fn allowed_with(url: &str, loopback: bool) -> bool {
    let Ok(u) = url.parse::<http::Uri>() else {
        return false;
    };
    if !matches!(u.scheme_str(), Some("ws" | "wss")) {
        return false;
    }
    let host = u.host().unwrap_or("").to_ascii_lowercase();
    host == "fonepay.com"
        || host.ends_with(".fonepay.com")
        || (loopback && matches!(host.as_str(), "127.0.0.1" | "localhost" | "[::1]"))
}

/// An open Fonepay websocket, read hint by hint.
pub struct Hints {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl Hints {
    /// Connects to `url` within `connect_within`; `None` on any failure
    /// (the websocket is only a hint: the status API is polled anyway).
    pub async fn connect(url: &str, connect_within: Duration) -> Option<Hints> {
        if !allowed(url) {
            tracing::warn!("fonepay websocket: refused an unexpected URL");
            return None;
        }
        let connector = match crate::tls::outbound() {
            Ok(c) => tokio_tungstenite::Connector::Rustls(c),
            Err(e) => {
                tracing::warn!(error = %e, "fonepay websocket: no TLS configuration");
                return None;
            }
        };
        let mut config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
        // Fonepay's frames are a few hundred bytes.
        config.max_message_size = Some(64 * 1024);
        config.max_frame_size = Some(64 * 1024);
        let connect = tokio_tungstenite::connect_async_tls_with_config(
            url,
            Some(config),
            false,
            Some(connector),
        );
        match tokio::time::timeout(connect_within, connect).await {
            Ok(Ok((socket, _))) => Some(Hints { socket }),
            Ok(Err(e)) => {
                tracing::info!(error = %e, "fonepay websocket: not connected");
                None
            }
            Err(_) => {
                tracing::info!("fonepay websocket: connect timed out");
                None
            }
        }
    }

    /// The next hint before `deadline`; `None` once the socket closed,
    /// failed or the deadline passed.
    pub async fn next(&mut self, deadline: tokio::time::Instant) -> Option<Hint> {
        loop {
            match tokio::time::timeout_at(deadline, self.socket.next()).await {
                Ok(Some(Ok(Message::Text(text)))) => {
                    if let Some(hint) = parse_frame(text.as_str()) {
                        return Some(hint);
                    }
                }
                Ok(Some(Ok(_))) => {}
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_as_the_docs_write_them() {
        let scan = r#"{"merchantId":70,"deviceId":"Td35","transactionStatus":"{\"success\":true,\"message\":\"VERIFIED\",\"qrVerified\":true}"}"#;
        assert_eq!(parse_frame(scan), Some(Hint::Scanned));
        let scan_2024 = r#"{"transactionStatus":"{\"success\":true,\"QRVerified\":true}"}"#;
        assert_eq!(parse_frame(scan_2024), Some(Hint::Scanned));
        let paid = r#"{"transactionStatus":"{\"traceId\":17015,\"productNumber\":\"P1\",\"amount\":\"14\",\"message\":\"Request Complete\",\"success\":true,\"paymentSuccess\":true}"}"#;
        assert_eq!(
            parse_frame(paid),
            Some(Hint::Result {
                paid: true,
                commission: None
            })
        );
        // `success` is true on a failure too: `paymentSuccess` decides.
        let failed = r#"{"transactionStatus":"{\"message\":\"Request Failed\",\"success\":true,\"paymentSuccess\":false}"}"#;
        assert_eq!(
            parse_frame(failed),
            Some(Hint::Result {
                paid: false,
                commission: None
            })
        );
        for junk in [
            "",
            "not json",
            "{}",
            r#"{"transactionStatus":"not json"}"#,
            r#"{"transactionStatus":"{\"qrVerified\":false}"}"#,
            r#"{"transactionStatus":7}"#,
        ] {
            assert_eq!(parse_frame(junk), None, "{junk}");
        }
    }

    /// The docs' result frame carries `commissionAmount` as a JSON number
    /// in rupees: read exactly into paisa; a negative one or one with a
    /// third decimal is refused (no fee), never rounded, never a panic.
    #[test]
    fn a_results_commission_is_read_exactly() {
        let frame = |c: &str| {
            format!(
                r#"{{"merchantId":70,"transactionStatus":"{{\"traceId\":17015,\"amount\":\"14\",\"success\":true,\"commissionType\":\"CHARGE\",\"commissionAmount\":{c},\"totalCalculatedAmount\":14.0,\"paymentSuccess\":true}}"}}"#
            )
        };
        let fee = |c: &str| match parse_frame(&frame(c)) {
            Some(Hint::Result {
                paid: true,
                commission,
            }) => commission,
            other => panic!("{c}: {other:?}"),
        };
        assert_eq!(fee("0.0"), Paisa::new(0).ok());
        assert_eq!(fee("0.29"), Paisa::new(29).ok());
        assert_eq!(fee("12.3"), Paisa::new(1230).ok());
        assert_eq!(fee("\\\"4.05\\\""), Paisa::new(405).ok());
        for bad in ["-0.5", "0.001", "1e1", "null", "true"] {
            assert_eq!(fee(bad), None, "{bad}");
        }
        // Not double-encoded: the object's own text.
        let plain = r#"{"transactionStatus":{"commissionAmount":1.25,"paymentSuccess":true}}"#;
        assert_eq!(
            parse_frame(plain),
            Some(Hint::Result {
                paid: true,
                commission: Paisa::new(125).ok()
            })
        );
    }

    #[test]
    fn only_fonepays_secure_socket_or_a_local_simulator_is_dialled() {
        assert!(allowed(
            "wss://ws.fonepay.com/convergent-webSocket-web/merchantEndPoint/Td3/NBQM/Y"
        ));
        assert!(allowed(
            "ws://acquirer-websocket.fonepay.com/merchantEndPoint/Td3/NBQM/Y"
        ));
        assert!(allowed_with(
            "ws://127.0.0.1:8080/sim/fonepay/ws/Td3/NBQM/Y",
            true
        ));
        // On Lambda the runtime API is on loopback: never dialled there.
        assert!(!allowed_with(
            "ws://127.0.0.1:9001/2018-06-01/runtime",
            false
        ));
        for no in [
            "wss://fonepay.com.evil.example/x",
            "wss://evilfonepay.com/x",
            "ws://169.254.169.254/latest",
            "https://ws.fonepay.com/x",
            "file:///etc/passwd",
            "",
        ] {
            assert!(!allowed_with(no, true), "{no}");
        }
    }
}
