//! [`InProcessQueue`]: the in-process twin of SQS used by the local gateway
//! and by tests.
//!
//! It keeps SQS's contract where callers can observe it:
//! - a message becomes visible after its delay and is hidden for the
//!   `visibility` of each receive; one that is not deleted comes back with a
//!   new receipt and a higher `receive_count`;
//! - `delete` takes the receipt of the latest receive; a stale receipt (the
//!   message was received again since) is a no-op, and so is the receipt of
//!   a message that is already gone; a handle it never issued is
//!   [`QueueError::Invalid`];
//! - `receive` long-polls: it returns as soon as a message is visible (sent,
//!   or its delay or visibility timeout ran out) or when `wait` (at most
//!   [`MAX_WAIT`]) has passed;
//! - the request limits ([`MAX_DELAY`], 1..=[`MAX_RECEIVE`], [`MAX_VISIBILITY`],
//!   [`MAX_BODY_BYTES`] and SQS's body characters) are checked the same way
//!   as the SQS backend checks them, through the functions of this module.
//!
//! Messages are handed out oldest first ("FIFO-ish"); SQS standard queues do
//! not promise an order, so callers must not rely on it.
//!
//! Time is [`tokio::time::Instant`] (so a runtime with `tokio::time::pause()`
//! drives it) plus a skip-ahead offset: [`InProcessQueue::skip_ahead`] makes
//! delays and visibility timeouts run out sooner, for tests and for the
//! dev server (no waiting 15 minutes for a delayed retry). Long polls wait
//! in real time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use ulid::Ulid;

use super::{MAX_DELAY, MAX_RECEIVE, Message, Queue, QueueError, QueueName};

/// SQS's longest long poll; a longer `wait` is shortened to it.
pub const MAX_WAIT: Duration = Duration::from_secs(20);
/// SQS's longest visibility timeout (12 hours).
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);
/// The largest body accepted: SQS's classic limit (256 KiB), which every
/// queue accepts whatever its `MaximumMessageSize`.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Checks a send the way SQS does: a delay of at most [`MAX_DELAY`] and a
/// body of 1..=[`MAX_BODY_BYTES`] bytes made of the characters SQS allows
/// (`#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF`).
pub(crate) fn validate_send(body: &str, delay: Duration) -> Result<(), QueueError> {
    if delay > MAX_DELAY {
        return Err(QueueError::Invalid(format!(
            "delay must be at most {} seconds, got {:?}",
            MAX_DELAY.as_secs(),
            delay
        )));
    }
    if body.is_empty() {
        return Err(QueueError::Invalid("message body must not be empty".into()));
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(QueueError::Invalid(format!(
            "message body must be at most {MAX_BODY_BYTES} bytes, got {}",
            body.len()
        )));
    }
    let allowed = |c: char| {
        matches!(c, '\u{9}' | '\u{A}' | '\u{D}')
            || ('\u{20}'..='\u{D7FF}').contains(&c)
            || ('\u{E000}'..='\u{FFFD}').contains(&c)
            || c >= '\u{10000}'
    };
    if let Some(bad) = body.chars().find(|&c| !allowed(c)) {
        return Err(QueueError::Invalid(format!(
            "message body contains a character SQS does not allow: U+{:04X}",
            u32::from(bad)
        )));
    }
    Ok(())
}

/// Checks a receive the way SQS does: `max` in 1..=[`MAX_RECEIVE`] and a
/// visibility timeout of at most [`MAX_VISIBILITY`].
pub(crate) fn validate_receive(max: usize, visibility: Duration) -> Result<(), QueueError> {
    if !(1..=MAX_RECEIVE).contains(&max) {
        return Err(QueueError::Invalid(format!(
            "max must be from 1 to {MAX_RECEIVE}, got {max}"
        )));
    }
    if visibility > MAX_VISIBILITY {
        return Err(QueueError::Invalid(format!(
            "visibility must be at most {} seconds, got {:?}",
            MAX_VISIBILITY.as_secs(),
            visibility
        )));
    }
    Ok(())
}

/// The in-process queue. Cheap to clone; clones share the same queues.
#[derive(Clone, Default)]
pub struct InProcessQueue {
    lanes: Arc<Lanes>,
}

#[derive(Default)]
struct Lanes {
    webhooks: Lane,
    sms: Lane,
    mail: Lane,
    /// How far [`InProcessQueue::skip_ahead`] moved the queue's clock.
    skipped: Mutex<Duration>,
}

/// One named queue.
#[derive(Default)]
struct Lane {
    state: Mutex<LaneState>,
    /// Woken on every send (and skip ahead), so long polls look again.
    wake: Notify,
}

#[derive(Default)]
struct LaneState {
    next_seq: u64,
    /// By send order.
    messages: BTreeMap<u64, Stored>,
    /// Message id to its key in `messages`.
    by_id: HashMap<String, u64>,
}

struct Stored {
    id: String,
    body: String,
    visible_at: Instant,
    /// The receipt of the latest receive, if any.
    receipt: Option<String>,
    receive_count: u32,
}

/// How far [`InProcessQueue::skip_ahead`] can move the clock in total (ten
/// years), so instants never overflow.
const MAX_SKIP: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// Separates the message id from the nonce in a receipt handle.
const RECEIPT_SEP: char = '~';

impl InProcessQueue {
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the queue's clock forward by `by` (at most ten years in all):
    /// delays and visibility timeouts run out that much sooner, and waiting
    /// receives look again.
    pub fn skip_ahead(&self, by: Duration) {
        {
            let mut skipped = self
                .lanes
                .skipped
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *skipped = skipped.saturating_add(by).min(MAX_SKIP);
        }
        self.lanes.webhooks.wake.notify_waiters();
        self.lanes.sms.wake.notify_waiters();
        self.lanes.mail.wake.notify_waiters();
    }

    fn skipped(&self) -> Duration {
        *self
            .lanes
            .skipped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The queue's clock: tokio's plus what was skipped.
    fn now(&self) -> Instant {
        Instant::now() + self.skipped()
    }

    fn lane(&self, queue: QueueName) -> &Lane {
        match queue {
            QueueName::Webhooks => &self.lanes.webhooks,
            QueueName::Sms => &self.lanes.sms,
            QueueName::Mail => &self.lanes.mail,
        }
    }

    /// How many messages `queue` holds, visible or not (for tests and the
    /// dev server's diagnostics).
    pub fn len(&self, queue: QueueName) -> usize {
        self.lane(queue).lock().messages.len()
    }

    /// Whether `queue` holds no message at all.
    pub fn is_empty(&self, queue: QueueName) -> bool {
        self.len(queue) == 0
    }
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, LaneState> {
        // The state is consistent after every statement, so a panic in
        // another task while holding the lock leaves nothing half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes up to `max` visible messages, hiding each for `visibility`.
    /// When none is visible, also answers when the next one will be.
    /// `now` is the queue's clock.
    fn take(
        &self,
        now: Instant,
        max: usize,
        visibility: Duration,
    ) -> (Vec<Message>, Option<Instant>) {
        let mut state = self.lock();
        let mut batch = Vec::new();
        let mut next_visible: Option<Instant> = None;
        for stored in state.messages.values_mut() {
            if stored.visible_at > now {
                next_visible =
                    Some(next_visible.map_or(stored.visible_at, |t| t.min(stored.visible_at)));
                continue;
            }
            if batch.len() == max {
                break;
            }
            let receipt = format!("{}{RECEIPT_SEP}{}", stored.id, Ulid::new());
            stored.receipt = Some(receipt.clone());
            stored.receive_count = stored.receive_count.saturating_add(1);
            stored.visible_at = now + visibility;
            batch.push(Message {
                id: stored.id.clone(),
                body: stored.body.clone(),
                receipt,
                receive_count: stored.receive_count,
            });
        }
        (batch, next_visible)
    }
}

#[async_trait]
impl Queue for InProcessQueue {
    async fn send(
        &self,
        queue: QueueName,
        body: &str,
        delay: Duration,
    ) -> Result<String, QueueError> {
        validate_send(body, delay)?;
        let lane = self.lane(queue);
        let id = Ulid::new().to_string();
        {
            let mut state = lane.lock();
            let seq = state.next_seq;
            state.next_seq += 1;
            state.messages.insert(
                seq,
                Stored {
                    id: id.clone(),
                    body: body.to_owned(),
                    visible_at: self.now() + delay,
                    receipt: None,
                    receive_count: 0,
                },
            );
            state.by_id.insert(id.clone(), seq);
        }
        // Delayed or not: a waiting receive recomputes when to wake up.
        lane.wake.notify_waiters();
        Ok(id)
    }

    async fn receive(
        &self,
        queue: QueueName,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        validate_receive(max, visibility)?;
        let lane = self.lane(queue);
        // The wait is real time; visibility is on the queue's clock.
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        loop {
            // Registered before looking, so a send between the look and the
            // sleep still wakes us.
            let woken = lane.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();

            let skipped = self.skipped();
            let (batch, next_visible) = lane.take(Instant::now() + skipped, max, visibility);
            if !batch.is_empty() || Instant::now() >= deadline {
                return Ok(batch);
            }
            let wake = next_visible
                .and_then(|t| t.checked_sub(skipped))
                .map_or(deadline, |t| t.min(deadline));
            // Either outcome means "look again".
            let _ = tokio::time::timeout_at(wake, woken).await;
        }
    }

    async fn delete(&self, queue: QueueName, receipt: &str) -> Result<(), QueueError> {
        let id = match receipt.split_once(RECEIPT_SEP) {
            Some((id, nonce)) if !id.is_empty() && !nonce.is_empty() => id,
            _ => {
                return Err(QueueError::Invalid(format!(
                    "not a receipt handle of this queue: {:?}",
                    receipt.chars().take(80).collect::<String>()
                )));
            }
        };
        let mut state = self.lane(queue).lock();
        let Some(&seq) = state.by_id.get(id) else {
            // Already deleted (or never here): SQS answers success too.
            return Ok(());
        };
        let current = state
            .messages
            .get(&seq)
            .is_some_and(|stored| stored.receipt.as_deref() == Some(receipt));
        if current {
            state.messages.remove(&seq);
            state.by_id.remove(id);
        }
        // A stale receipt (the message was received again since) is a no-op.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn queue() -> InProcessQueue {
        InProcessQueue::new()
    }

    async fn receive_one(q: &InProcessQueue, visibility: Duration) -> Option<Message> {
        let mut batch = q
            .receive(QueueName::Webhooks, 1, Duration::ZERO, visibility)
            .await
            .unwrap();
        assert!(batch.len() <= 1);
        batch.pop()
    }

    #[tokio::test]
    async fn delay_hides_until_due() {
        let q = queue();
        let id = q
            .send(QueueName::Webhooks, "later", 300 * SEC)
            .await
            .unwrap();
        assert!(receive_one(&q, 30 * SEC).await.is_none());
        q.skip_ahead(298 * SEC);
        assert!(receive_one(&q, 30 * SEC).await.is_none());
        q.skip_ahead(2 * SEC);
        let m = receive_one(&q, 30 * SEC).await.unwrap();
        assert_eq!(
            (m.id.as_str(), m.body.as_str(), m.receive_count),
            (id.as_str(), "later", 1)
        );
    }

    #[tokio::test]
    async fn max_delay_is_accepted_and_longer_is_invalid() {
        let q = queue();
        q.send(QueueName::Webhooks, "x", MAX_DELAY).await.unwrap();
        let err = q
            .send(
                QueueName::Webhooks,
                "x",
                MAX_DELAY + Duration::from_millis(1),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, QueueError::Invalid(_)), "{err:?}");
        assert_eq!(q.len(QueueName::Webhooks), 1);
    }

    #[tokio::test]
    async fn visibility_timeout_redelivers_with_new_receipt_and_count() {
        let q = queue();
        let id = q
            .send(QueueName::Webhooks, "again", Duration::ZERO)
            .await
            .unwrap();
        let first = receive_one(&q, 30 * SEC).await.unwrap();
        assert_eq!(first.receive_count, 1);
        q.skip_ahead(29 * SEC);
        assert!(receive_one(&q, 30 * SEC).await.is_none());
        q.skip_ahead(SEC);
        let second = receive_one(&q, 30 * SEC).await.unwrap();
        assert_eq!(second.id, id);
        assert_eq!(second.body, "again");
        assert_eq!(second.receive_count, 2);
        assert_ne!(second.receipt, first.receipt);
    }

    #[tokio::test]
    async fn zero_visibility_is_visible_again_at_once() {
        let q = queue();
        q.send(QueueName::Webhooks, "peek", Duration::ZERO)
            .await
            .unwrap();
        let first = receive_one(&q, Duration::ZERO).await.unwrap();
        let second = receive_one(&q, Duration::ZERO).await.unwrap();
        assert_eq!((first.receive_count, second.receive_count), (1, 2));
    }

    #[tokio::test]
    async fn long_poll_wakes_on_send() {
        let q = queue();
        let receiver = {
            let q = q.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let batch = q
                    .receive(QueueName::Sms, 10, 20 * SEC, 30 * SEC)
                    .await
                    .unwrap();
                (batch, start.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        q.send(QueueName::Sms, "wake", Duration::ZERO)
            .await
            .unwrap();
        let (batch, waited) = receiver.await.unwrap();
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].body, "wake");
        assert!(
            waited >= Duration::from_millis(150) && waited < 5 * SEC,
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn long_poll_wakes_when_a_delay_runs_out() {
        let q = queue();
        q.send(QueueName::Sms, "soon", Duration::from_millis(300))
            .await
            .unwrap();
        let start = Instant::now();
        let batch = q
            .receive(QueueName::Sms, 10, 20 * SEC, 60 * SEC)
            .await
            .unwrap();
        let waited = start.elapsed();
        assert_eq!(batch.len(), 1);
        assert!(
            waited >= Duration::from_millis(250) && waited < 5 * SEC,
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn long_poll_wakes_when_a_visibility_timeout_runs_out() {
        let q = queue();
        q.send(QueueName::Sms, "again", Duration::ZERO)
            .await
            .unwrap();
        let first = q
            .receive(
                QueueName::Sms,
                1,
                Duration::ZERO,
                Duration::from_millis(300),
            )
            .await
            .unwrap();
        assert_eq!(first.len(), 1);
        let start = Instant::now();
        let batch = q
            .receive(QueueName::Sms, 10, 20 * SEC, 60 * SEC)
            .await
            .unwrap();
        let waited = start.elapsed();
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].receive_count, 2);
        assert!(
            waited >= Duration::from_millis(250) && waited < 5 * SEC,
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn skip_ahead_wakes_a_long_poll() {
        let q = queue();
        q.send(QueueName::Sms, "in ten minutes", 600 * SEC)
            .await
            .unwrap();
        let receiver = {
            let q = q.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let batch = q
                    .receive(QueueName::Sms, 10, 20 * SEC, 30 * SEC)
                    .await
                    .unwrap();
                (batch, start.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        q.skip_ahead(600 * SEC);
        let (batch, waited) = receiver.await.unwrap();
        assert_eq!(batch.len(), 1);
        assert!(waited < 5 * SEC, "{waited:?}");
    }

    #[tokio::test]
    async fn absurd_skip_ahead_does_not_overflow() {
        let q = queue();
        q.send(QueueName::Sms, "delayed", MAX_DELAY).await.unwrap();
        q.skip_ahead(Duration::MAX);
        q.skip_ahead(Duration::MAX);
        let batch = q
            .receive(QueueName::Sms, 10, Duration::ZERO, MAX_VISIBILITY)
            .await
            .unwrap();
        assert_eq!(batch.len(), 1);
    }

    #[tokio::test]
    async fn long_poll_gives_up_after_wait() {
        let q = queue();
        let start = Instant::now();
        let batch = q
            .receive(QueueName::Sms, 1, Duration::from_millis(300), SEC)
            .await
            .unwrap();
        let waited = start.elapsed();
        assert!(batch.is_empty());
        assert!(
            waited >= Duration::from_millis(300) && waited < 5 * SEC,
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn delete_removes_for_good() {
        let q = queue();
        q.send(QueueName::Webhooks, "once", Duration::ZERO)
            .await
            .unwrap();
        let m = receive_one(&q, SEC).await.unwrap();
        q.delete(QueueName::Webhooks, &m.receipt).await.unwrap();
        assert!(q.is_empty(QueueName::Webhooks));
        q.skip_ahead(10 * SEC);
        assert!(receive_one(&q, SEC).await.is_none());
        // Deleting again: SQS answers success for an already deleted message.
        q.delete(QueueName::Webhooks, &m.receipt).await.unwrap();
    }

    #[tokio::test]
    async fn latest_receipt_still_deletes_after_visibility_ran_out() {
        let q = queue();
        q.send(QueueName::Webhooks, "late", Duration::ZERO)
            .await
            .unwrap();
        let m = receive_one(&q, SEC).await.unwrap();
        q.skip_ahead(5 * SEC);
        q.delete(QueueName::Webhooks, &m.receipt).await.unwrap();
        assert!(q.is_empty(QueueName::Webhooks));
    }

    #[tokio::test]
    async fn stale_receipt_is_a_no_op() {
        let q = queue();
        q.send(QueueName::Webhooks, "stale", Duration::ZERO)
            .await
            .unwrap();
        let first = receive_one(&q, SEC).await.unwrap();
        q.skip_ahead(SEC);
        let second = receive_one(&q, SEC).await.unwrap();
        q.delete(QueueName::Webhooks, &first.receipt).await.unwrap();
        assert_eq!(q.len(QueueName::Webhooks), 1);
        q.skip_ahead(SEC);
        let third = receive_one(&q, SEC).await.unwrap();
        assert_eq!(
            (third.id.as_str(), third.receive_count),
            (second.id.as_str(), 3)
        );
        // The previous receipt is stale now too.
        q.delete(QueueName::Webhooks, &second.receipt)
            .await
            .unwrap();
        assert_eq!(q.len(QueueName::Webhooks), 1);
        q.delete(QueueName::Webhooks, &third.receipt).await.unwrap();
        assert!(q.is_empty(QueueName::Webhooks));
    }

    #[tokio::test]
    async fn foreign_receipt_is_invalid() {
        let q = queue();
        for bad in ["", "nonsense", "~x", "x~"] {
            let err = q.delete(QueueName::Webhooks, bad).await.unwrap_err();
            assert!(matches!(err, QueueError::Invalid(_)), "{bad:?}: {err:?}");
        }
    }

    #[tokio::test]
    async fn invalid_arguments() {
        let q = queue();
        for max in [0, MAX_RECEIVE + 1] {
            let err = q
                .receive(QueueName::Sms, max, Duration::ZERO, SEC)
                .await
                .unwrap_err();
            assert!(matches!(err, QueueError::Invalid(_)), "{max}: {err:?}");
        }
        let err = q
            .receive(QueueName::Sms, 1, Duration::ZERO, MAX_VISIBILITY + SEC)
            .await
            .unwrap_err();
        assert!(matches!(err, QueueError::Invalid(_)), "{err:?}");
        for body in [
            String::new(),
            "a\u{0}b".into(),
            "\u{FFFE}".into(),
            "x".repeat(MAX_BODY_BYTES + 1),
        ] {
            let err = q
                .send(QueueName::Sms, &body, Duration::ZERO)
                .await
                .unwrap_err();
            assert!(matches!(err, QueueError::Invalid(_)), "{err:?}");
        }
        assert!(q.is_empty(QueueName::Sms));
        q.send(QueueName::Sms, &"x".repeat(MAX_BODY_BYTES), Duration::ZERO)
            .await
            .unwrap();
        q.send(QueueName::Sms, "tab\tnewline\n\r नमस्ते 🙏", Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(q.len(QueueName::Sms), 2);
    }

    #[tokio::test]
    async fn batches_respect_max_and_send_order() {
        let q = queue();
        for i in 0..5 {
            q.send(QueueName::Webhooks, &format!("m{i}"), Duration::ZERO)
                .await
                .unwrap();
        }
        let first = q
            .receive(QueueName::Webhooks, 3, Duration::ZERO, 30 * SEC)
            .await
            .unwrap();
        let rest = q
            .receive(QueueName::Webhooks, 10, Duration::ZERO, 30 * SEC)
            .await
            .unwrap();
        let bodies: Vec<_> = first.iter().chain(&rest).map(|m| m.body.as_str()).collect();
        assert_eq!(bodies, ["m0", "m1", "m2", "m3", "m4"]);
        assert_eq!(first.len(), 3);
    }

    #[tokio::test]
    async fn queues_are_separate_and_clones_share_them() {
        let q = queue();
        let other = q.clone();
        q.send(QueueName::Webhooks, "w", Duration::ZERO)
            .await
            .unwrap();
        assert!(
            other
                .receive(QueueName::Sms, 10, Duration::ZERO, SEC)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            other
                .receive(QueueName::Webhooks, 10, Duration::ZERO, SEC)
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(InProcessQueue::new().is_empty(QueueName::Webhooks));
    }

    /// The shared behaviour suite, in real time.
    mod conformance {
        use std::sync::Arc;

        use crate::queue::Queue;
        use crate::queue::memory::InProcessQueue;

        async fn make() -> Option<Arc<dyn Queue>> {
            Some(Arc::new(InProcessQueue::new()))
        }

        crate::queue_conformance_tests!(make);
    }

    /// Many receivers long-polling at once: each message goes to exactly one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_receivers_share_the_work() {
        let q = queue();
        let receivers: Vec<_> = (0..8)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    loop {
                        let batch = q.receive(QueueName::Sms, 3, SEC, 60 * SEC).await.unwrap();
                        if batch.is_empty() {
                            return got;
                        }
                        for m in batch {
                            q.delete(QueueName::Sms, &m.receipt).await.unwrap();
                            got.push(m.body);
                        }
                    }
                })
            })
            .collect();
        let senders: Vec<_> = (0..4)
            .map(|s| {
                let q = q.clone();
                tokio::spawn(async move {
                    for i in 0..50 {
                        q.send(QueueName::Sms, &format!("{s}-{i}"), Duration::ZERO)
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
        all.sort();
        let mut expected: Vec<_> = (0..4)
            .flat_map(|s| (0..50).map(move |i| format!("{s}-{i}")))
            .collect();
        expected.sort();
        assert_eq!(all, expected);
        assert!(q.is_empty(QueueName::Sms));
    }
}
