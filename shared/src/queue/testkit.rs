//! The behaviour suite every [`Queue`] backend passes, unchanged.
//!
//! Each case is a `pub async fn case(queue: Arc<dyn Queue>)` that panics on
//! failure. [`queue_conformance_tests!`](crate::queue_conformance_tests)
//! expands to one `#[tokio::test]` per case; `$make` is an async fn (or a
//! closure returning a future) yielding `Option<Arc<dyn Queue>>` with fresh,
//! empty queues, `None` meaning "skip" (see [`aws_endpoint`]):
//!
//! ```ignore
//! async fn make() -> Option<Arc<dyn Queue>> { Some(Arc::new(InProcessQueue::new())) }
//! shared::queue_conformance_tests!(make);
//! ```
//!
//! Written for real SQS too, in real time:
//! - SQS takes whole seconds, so delays and visibility timeouts here are
//!   1–2 s and timing assertions leave a second of slack;
//! - a standard queue promises no order and may answer a receive with fewer
//!   messages than are visible, so cases collect with long polls
//!   ([`collect`]) and compare sets;
//! - delivery is at least once, so the concurrency case accepts a duplicate
//!   but never a lost or invented message;
//! - [`stale_receipt_keeps_the_message`] is the documented SQS behaviour
//!   for a stale receipt. An emulator that deletes instead (moto 5.2.5) runs
//!   the suite with `strict_stale_receipt = "why"`, which marks that one case
//!   `#[ignore]` with the reason, so it stays visible and runnable.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ulid::Ulid;

use super::memory::{MAX_BODY_BYTES, MAX_VISIBILITY};
use super::{MAX_DELAY, MAX_RECEIVE, Message, Queue, QueueError, QueueName};

/// Expands to one `#[tokio::test]` per case of [`crate::queue::testkit`].
/// `$make` yields `Option<Arc<dyn Queue>>` (`None` skips the case).
#[macro_export]
macro_rules! queue_conformance_tests {
    ($make:expr) => {
        $crate::queue_conformance_tests!(@common $make);
        $crate::queue_conformance_tests!(@cases $make; stale_receipt_keeps_the_message);
    };
    ($make:expr, strict_stale_receipt = $why:literal) => {
        $crate::queue_conformance_tests!(@common $make);
        $crate::queue_conformance_tests!(@cases $make; #[ignore = $why] stale_receipt_keeps_the_message);
    };
    (@common $make:expr) => {
        $crate::queue_conformance_tests!(@cases $make;
            send_receive_delete,
            delay_hides_until_due,
            invalid_requests,
            visibility_timeout_redelivers,
            long_poll_wakes_on_send,
            empty_receive_without_wait_answers_at_once,
            deleted_message_never_returns,
            stale_receipt_is_not_an_error,
            delete_rejects_a_foreign_receipt,
            batches_respect_max,
            queues_are_separate,
            concurrent_senders_and_receivers,
        );
    };
    (@cases $make:expr; $($(#[$attr:meta])* $case:ident),+ $(,)?) => {
        $(
            $(#[$attr])*
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let made: ::std::option::Option<::std::sync::Arc<dyn $crate::queue::Queue>> = ($make)().await;
                let ::std::option::Option::Some(queue) = made else { return };
                $crate::queue::testkit::$case(queue).await;
            }
        )+
    };
}

// ---------------------------------------------------------------- helpers

/// The endpoint of the AWS emulator (or AWS) for backend tests, from
/// `DHUKUTI_TEST_AWS_ENDPOINT`: one URL, or several separated by commas
/// (`infra/test.sh` starts one moto server per core: each serves requests
/// one at a time), handed out in turn so tests spread over them. A test
/// keeps the one it got for everything it creates. When it is unset:
/// panics if `DHUKUTI_REQUIRE_AWS=1`, otherwise says so on stderr and
/// answers `None` (the caller skips).
pub fn aws_endpoint() -> Option<String> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let listed = std::env::var("DHUKUTI_TEST_AWS_ENDPOINT").unwrap_or_default();
    let endpoints: Vec<&str> = listed
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if endpoints.is_empty() {
        if std::env::var("DHUKUTI_REQUIRE_AWS").as_deref() == Ok("1") {
            panic!("DHUKUTI_REQUIRE_AWS=1 but DHUKUTI_TEST_AWS_ENDPOINT is not set");
        }
        eprintln!(
            "skipped: DHUKUTI_TEST_AWS_ENDPOINT is not set (run `bash infra/test.sh` for moto)"
        );
        return None;
    }
    let turn = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    endpoints
        .get(turn % endpoints.len())
        .map(|e| (*e).to_owned())
}

/// A queue-name prefix no other test (or run) uses: `dhukuti-test-<ulid>`.
pub fn unique_prefix() -> String {
    format!("dhukuti-test-{}", Ulid::new().to_string().to_lowercase())
}

const SEC: Duration = Duration::from_secs(1);
/// The longest any case waits for a message it expects.
const PATIENCE: Duration = Duration::from_secs(10);

/// Long-polls `queue` until `n` messages arrived or `within` passed.
pub async fn collect(
    q: &dyn Queue,
    queue: QueueName,
    n: usize,
    visibility: Duration,
    within: Duration,
) -> Vec<Message> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let max = (n - got.len()).min(MAX_RECEIVE);
        let batch = q
            .receive(queue, max, left.clamp(SEC, 5 * SEC), visibility)
            .await
            .unwrap_or_else(|e| panic!("receive from {}: {e}", queue.as_str()));
        assert!(
            batch.len() <= max,
            "asked for at most {max}, got {}",
            batch.len()
        );
        got.extend(batch);
    }
    got
}

/// Exactly one message, waiting up to [`PATIENCE`] for it.
async fn one(q: &dyn Queue, queue: QueueName, visibility: Duration) -> Message {
    let mut got = collect(q, queue, 1, visibility, PATIENCE).await;
    assert_eq!(got.len(), 1, "expected one message on {}", queue.as_str());
    got.remove(0)
}

/// Asserts `queue` hands out nothing (receives without waiting).
async fn assert_nothing_visible(q: &dyn Queue, queue: QueueName, what: &str) {
    let got = q
        .receive(queue, MAX_RECEIVE, Duration::ZERO, SEC)
        .await
        .unwrap_or_else(|e| panic!("{what}: receive: {e}"));
    assert!(got.is_empty(), "{what}: expected nothing, got {got:?}");
}

/// Asserts nothing arrives on `queue` during a long poll of `wait`.
async fn assert_nothing_arrives(q: &dyn Queue, queue: QueueName, wait: Duration, what: &str) {
    let got = q
        .receive(queue, MAX_RECEIVE, wait, SEC)
        .await
        .unwrap_or_else(|e| panic!("{what}: receive: {e}"));
    assert!(got.is_empty(), "{what}: expected nothing, got {got:?}");
}

fn assert_invalid<T: std::fmt::Debug>(result: Result<T, QueueError>, what: &str) {
    match result {
        Err(QueueError::Invalid(_)) => {}
        other => panic!("{what}: expected QueueError::Invalid, got {other:?}"),
    }
}

// ---------------------------------------------------------------- cases

/// A message goes round trip (body byte for byte, the id `send` answered,
/// a first receive count of 1), and `delete` removes it.
pub async fn send_receive_delete(q: Arc<dyn Queue>) {
    let body =
        r#"{"event":"payment.succeeded","amount":10000,"note":"नमस्ते 🙏 \"quoted\"\n\ttabbed <&>"}"#;
    let id = q
        .send(QueueName::Webhooks, body, Duration::ZERO)
        .await
        .unwrap();
    assert!(!id.is_empty());
    let m = one(q.as_ref(), QueueName::Webhooks, 30 * SEC).await;
    assert_eq!(m.id, id);
    assert_eq!(m.body, body);
    assert_eq!(m.receive_count, 1);
    assert!(!m.receipt.is_empty());
    q.delete(QueueName::Webhooks, &m.receipt).await.unwrap();
    assert_nothing_visible(q.as_ref(), QueueName::Webhooks, "after delete").await;
}

/// A delayed message stays hidden until its delay has passed.
pub async fn delay_hides_until_due(q: Arc<dyn Queue>) {
    let sent = Instant::now();
    let id = q.send(QueueName::Sms, "delayed", 2 * SEC).await.unwrap();
    assert_nothing_visible(q.as_ref(), QueueName::Sms, "right after a delayed send").await;
    let m = one(q.as_ref(), QueueName::Sms, 30 * SEC).await;
    let waited = sent.elapsed();
    assert_eq!(m.id, id);
    assert_eq!(m.receive_count, 1);
    assert!(
        waited >= Duration::from_millis(1500),
        "delivered after {waited:?}, delay was 2 s"
    );
    // The longest delay is accepted.
    q.send(QueueName::Sms, "much later", MAX_DELAY)
        .await
        .unwrap();
}

/// Requests outside SQS's limits are [`QueueError::Invalid`] and change
/// nothing.
pub async fn invalid_requests(q: Arc<dyn Queue>) {
    let too_late = MAX_DELAY + SEC;
    assert_invalid(
        q.send(QueueName::Sms, "x", too_late).await,
        "delay over MAX_DELAY",
    );
    assert_invalid(
        q.send(QueueName::Sms, "", Duration::ZERO).await,
        "empty body",
    );
    assert_invalid(
        q.send(QueueName::Sms, "nul\u{0}byte", Duration::ZERO).await,
        "body with U+0000",
    );
    assert_invalid(
        q.send(QueueName::Sms, "\u{FFFF}", Duration::ZERO).await,
        "body with U+FFFF",
    );
    let big = "x".repeat(MAX_BODY_BYTES + 1);
    assert_invalid(
        q.send(QueueName::Sms, &big, Duration::ZERO).await,
        "body over the size limit",
    );
    for max in [0, MAX_RECEIVE + 1, 1000] {
        assert_invalid(
            q.receive(QueueName::Sms, max, Duration::ZERO, SEC).await,
            &format!("max {max}"),
        );
    }
    assert_invalid(
        q.receive(QueueName::Sms, 1, Duration::ZERO, MAX_VISIBILITY + SEC)
            .await,
        "visibility over 12 h",
    );
    assert_nothing_visible(q.as_ref(), QueueName::Sms, "after invalid sends").await;
    // The limits themselves are fine.
    let biggest = "y".repeat(MAX_BODY_BYTES);
    q.send(QueueName::Sms, &biggest, Duration::ZERO)
        .await
        .unwrap();
    let m = one(q.as_ref(), QueueName::Sms, MAX_VISIBILITY).await;
    assert_eq!(m.body.len(), MAX_BODY_BYTES);
    q.delete(QueueName::Sms, &m.receipt).await.unwrap();
}

/// A received message that is not deleted is hidden for its visibility
/// timeout, then comes back with a new receipt and a receive count of 2.
pub async fn visibility_timeout_redelivers(q: Arc<dyn Queue>) {
    let id = q
        .send(QueueName::Webhooks, "retry me", Duration::ZERO)
        .await
        .unwrap();
    let first = one(q.as_ref(), QueueName::Webhooks, SEC).await;
    let received = Instant::now();
    assert_eq!((first.id.as_str(), first.receive_count), (id.as_str(), 1));
    assert_nothing_visible(q.as_ref(), QueueName::Webhooks, "while in flight").await;
    let second = one(q.as_ref(), QueueName::Webhooks, 30 * SEC).await;
    let hidden = received.elapsed();
    assert_eq!(second.id, id);
    assert_eq!(second.body, "retry me");
    assert_eq!(second.receive_count, 2);
    assert_ne!(
        second.receipt, first.receipt,
        "each receive has its own receipt"
    );
    assert!(
        hidden >= Duration::from_millis(900),
        "back after {hidden:?}, visibility was 1 s"
    );
    q.delete(QueueName::Webhooks, &second.receipt)
        .await
        .unwrap();
    assert_nothing_arrives(
        q.as_ref(),
        QueueName::Webhooks,
        2 * SEC,
        "after deleting the redelivery",
    )
    .await;
}

/// A long poll returns as soon as a message is sent, well before its wait.
pub async fn long_poll_wakes_on_send(q: Arc<dyn Queue>) {
    let receiver = {
        let q = Arc::clone(&q);
        tokio::spawn(async move {
            let start = Instant::now();
            let got = q
                .receive(QueueName::Sms, MAX_RECEIVE, 15 * SEC, 30 * SEC)
                .await;
            (got, start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let id = q
        .send(QueueName::Sms, "wake up", Duration::ZERO)
        .await
        .unwrap();
    let (got, waited) = receiver.await.unwrap();
    let got = got.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].id, id);
    assert!(
        waited >= Duration::from_millis(400),
        "returned after {waited:?}, before the send"
    );
    assert!(
        waited < 5 * SEC,
        "woke {waited:?} after the poll began (wait was 15 s)"
    );
}

/// A receive without `wait` on an empty queue answers at once.
pub async fn empty_receive_without_wait_answers_at_once(q: Arc<dyn Queue>) {
    let start = Instant::now();
    let got = q
        .receive(QueueName::Webhooks, MAX_RECEIVE, Duration::ZERO, SEC)
        .await
        .unwrap();
    assert!(got.is_empty());
    assert!(start.elapsed() < 2 * SEC, "took {:?}", start.elapsed());
}

/// A deleted message does not come back after its visibility timeout, and
/// deleting it again is not an error.
pub async fn deleted_message_never_returns(q: Arc<dyn Queue>) {
    q.send(QueueName::Webhooks, "done", Duration::ZERO)
        .await
        .unwrap();
    let m = one(q.as_ref(), QueueName::Webhooks, SEC).await;
    q.delete(QueueName::Webhooks, &m.receipt).await.unwrap();
    assert_nothing_arrives(
        q.as_ref(),
        QueueName::Webhooks,
        3 * SEC,
        "after delete and 1 s visibility",
    )
    .await;
    q.delete(QueueName::Webhooks, &m.receipt)
        .await
        .unwrap_or_else(|e| panic!("deleting an already deleted message: {e}"));
}

/// Deleting with the receipt of an earlier receive is not an error, and
/// the latest receipt still deletes the message for good.
pub async fn stale_receipt_is_not_an_error(q: Arc<dyn Queue>) {
    q.send(QueueName::Sms, "twice", Duration::ZERO)
        .await
        .unwrap();
    let first = one(q.as_ref(), QueueName::Sms, SEC).await;
    let second = one(q.as_ref(), QueueName::Sms, 30 * SEC).await;
    assert_eq!(second.receive_count, 2);
    q.delete(QueueName::Sms, &first.receipt)
        .await
        .unwrap_or_else(|e| panic!("deleting with a stale receipt: {e}"));
    q.delete(QueueName::Sms, &second.receipt).await.unwrap();
    assert_nothing_arrives(
        q.as_ref(),
        QueueName::Sms,
        2 * SEC,
        "after deleting with the latest receipt",
    )
    .await;
}

/// SQS: "you must provide the most recently received ReceiptHandle for the
/// message (otherwise, the request succeeds, but the message will not be
/// deleted)". The message comes back after the latest visibility timeout.
pub async fn stale_receipt_keeps_the_message(q: Arc<dyn Queue>) {
    let id = q
        .send(QueueName::Sms, "keep me", Duration::ZERO)
        .await
        .unwrap();
    let first = one(q.as_ref(), QueueName::Sms, SEC).await;
    let second = one(q.as_ref(), QueueName::Sms, SEC).await;
    assert_eq!(second.receive_count, 2);
    q.delete(QueueName::Sms, &first.receipt).await.unwrap();
    let third = one(q.as_ref(), QueueName::Sms, 30 * SEC).await;
    assert_eq!((third.id.as_str(), third.receive_count), (id.as_str(), 3));
    q.delete(QueueName::Sms, &third.receipt).await.unwrap();
}

/// A receipt handle the queue never issued is [`QueueError::Invalid`].
pub async fn delete_rejects_a_foreign_receipt(q: Arc<dyn Queue>) {
    assert_invalid(
        q.delete(QueueName::Webhooks, "not-a-receipt-handle").await,
        "foreign receipt",
    );
}

/// A receive answers at most `max` messages; all of them arrive, each once.
pub async fn batches_respect_max(q: Arc<dyn Queue>) {
    let mut sent = BTreeMap::new();
    for i in 0..7 {
        let body = format!("message {i}");
        let id = q
            .send(QueueName::Webhooks, &body, Duration::ZERO)
            .await
            .unwrap();
        sent.insert(id, body);
    }
    let first = q
        .receive(QueueName::Webhooks, 2, 5 * SEC, 30 * SEC)
        .await
        .unwrap();
    assert!((1..=2).contains(&first.len()), "max 2 gave {}", first.len());
    let rest = collect(
        q.as_ref(),
        QueueName::Webhooks,
        7 - first.len(),
        30 * SEC,
        PATIENCE,
    )
    .await;
    let got: BTreeMap<String, String> = first
        .iter()
        .chain(&rest)
        .map(|m| (m.id.clone(), m.body.clone()))
        .collect();
    assert_eq!(
        first.len() + rest.len(),
        7,
        "a message came twice or not at all"
    );
    assert_eq!(got, sent);
    assert!(first.iter().chain(&rest).all(|m| m.receive_count == 1));
}

/// A message sent to one queue is not seen on another.
pub async fn queues_are_separate(q: Arc<dyn Queue>) {
    let id = q
        .send(QueueName::Webhooks, "for webhooks", Duration::ZERO)
        .await
        .unwrap();
    assert_nothing_arrives(q.as_ref(), QueueName::Sms, SEC, "sms after a webhooks send").await;
    let m = one(q.as_ref(), QueueName::Webhooks, 30 * SEC).await;
    assert_eq!(m.id, id);
}

/// Senders and long-polling receivers at once: every message arrives (at
/// least once, as SQS promises) and nothing else does.
pub async fn concurrent_senders_and_receivers(q: Arc<dyn Queue>) {
    const SENDERS: usize = 4;
    const EACH: usize = 10;
    const TOTAL: usize = SENDERS * EACH;
    let received = Arc::new(AtomicUsize::new(0));
    let receivers: Vec<_> = (0..4)
        .map(|_| {
            let q = Arc::clone(&q);
            let received = Arc::clone(&received);
            tokio::spawn(async move {
                let deadline = Instant::now() + 20 * SEC;
                let mut got = Vec::new();
                while received.load(Ordering::SeqCst) < TOTAL && Instant::now() < deadline {
                    let batch = q
                        .receive(QueueName::Sms, MAX_RECEIVE, SEC, 60 * SEC)
                        .await
                        .unwrap();
                    for m in batch {
                        q.delete(QueueName::Sms, &m.receipt).await.unwrap();
                        received.fetch_add(1, Ordering::SeqCst);
                        got.push(m.body);
                    }
                }
                got
            })
        })
        .collect();
    let senders: Vec<_> = (0..SENDERS)
        .map(|s| {
            let q = Arc::clone(&q);
            tokio::spawn(async move {
                for i in 0..EACH {
                    q.send(QueueName::Sms, &format!("{s}/{i}"), Duration::ZERO)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for s in senders {
        s.await.unwrap();
    }
    let mut all = Vec::new();
    for r in receivers {
        all.extend(r.await.unwrap());
    }
    let distinct: BTreeSet<_> = all.iter().cloned().collect();
    let expected: BTreeSet<_> = (0..SENDERS)
        .flat_map(|s| (0..EACH).map(move |i| format!("{s}/{i}")))
        .collect();
    assert_eq!(distinct, expected);
    if all.len() > distinct.len() {
        eprintln!(
            "note: {} duplicate deliveries (allowed: at least once)",
            all.len() - distinct.len()
        );
    }
}
