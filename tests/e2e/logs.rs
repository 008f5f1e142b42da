//! The request log: one line per request with method, path, status,
//! latency and request id, and never an API key. The capture is the
//! process's global subscriber (a thread's own default misses callsites
//! first seen on other threads), so it also sees the gateways of every test
//! running beside this one: lines are picked by this test's request ids,
//! and no key may appear anywhere.

use std::io::Write;
use std::sync::{Arc, Mutex};

use dhukuti_tests::{Which, send, spawn_app};
use shared::domain::Mode;
use shared::domain::account::Scope;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn request_logs_have_one_line_per_request_and_never_a_key() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    assert!(
        tracing::subscriber::set_global_default(subscriber).is_ok(),
        "nothing else in the suite sets the global subscriber"
    );

    let mut seen = Vec::new();
    for which in [Which::Embedded, Which::Aws] {
        let Some(app) = spawn_app(which).await else {
            continue;
        };
        let t = app.tenant("Log Shop", "log@shop.example").await;
        let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
        let ok = app.get("/v1/account", Some(&key)).await;
        assert_eq!(ok.status, 200);
        // A key in the query string (a client mistake) must not reach the logs either.
        let url = app.url(&format!("/v1/payments?api_key={key}"));
        let bad = send(
            app.client
                .get(url)
                .bearer_auth("sk_test_wrongwrongwrongwrongwrongwrongwrong"),
        )
        .await;
        assert_eq!(bad.status, 401);
        let demo = app
            .running
            .as_ref()
            .map(|r| r.keys.clone())
            .unwrap_or_default();
        seen.push((
            ok.header("x-request-id").to_owned(),
            bad.header("x-request-id").to_owned(),
            key,
            demo,
        ));
        app.stop().await;
    }

    let text = String::from_utf8(captured.0.lock().map(|b| b.clone()).unwrap_or_default())
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(" request ")).collect();
    // Other tests' gateways log beside this one: this test's lines are
    // those carrying its request ids.
    let with_id = |id: &str| -> Vec<&str> {
        let tag = format!("request_id={id}");
        lines.iter().copied().filter(|l| l.contains(&tag)).collect()
    };
    assert!(!seen.is_empty());
    for (ok_id, bad_id, key, demo) in &seen {
        let ok = with_id(ok_id);
        assert_eq!(ok.len(), 1, "one line per request: {ok:?}");
        for part in [
            "method=GET",
            "path=/v1/account",
            "status=200",
            "latency_ms=",
        ] {
            assert!(ok[0].contains(part), "{part:?} missing from {:?}", ok[0]);
        }
        let bad = with_id(bad_id);
        assert_eq!(bad.len(), 1, "one line per request: {bad:?}");
        assert!(
            bad[0].contains("path=/v1/payments") && bad[0].contains("status=401"),
            "{:?}",
            bad[0]
        );
        assert!(
            !text.contains(key.as_str()),
            "an API key reached the logs: {:?}",
            text.lines().find(|l| l.contains(key.as_str()))
        );
        assert!(
            !text.contains(&demo.sandbox) && !text.contains(&demo.live),
            "demo keys reached the logs"
        );
    }
    assert!(
        !text.contains("sk_test_wrong"),
        "a presented key reached the logs: {:?}",
        text.lines().find(|l| l.contains("sk_test_wrong"))
    );
}
