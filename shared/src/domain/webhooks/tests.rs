use super::delivery::dispatch;
use super::endpoints::EndpointCounter;
use super::fan_out::fan_out;
use super::test_event::sample_object;
use super::*;
use crate::domain::credentials::SealedSecret;
use crate::domain::outbox::{self, Event, EventType};
use crate::domain::record::Changes;
use crate::domain::{Mode, Tenant};
use crate::ids::IdKind;
use crate::queue::{MAX_DELAY, QueueError, QueueName};
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Key, Update};
use crate::time::Timestamp;
use crate::webhooks::client::WebhookClient;
use serde_json::json;
use std::time::Duration;

#[test]
fn schedules_parse_and_refuse_nonsense() {
    assert_eq!(
        parse_schedule("1, 0.5,60").unwrap(),
        vec![
            Duration::from_secs(1),
            Duration::from_millis(500),
            Duration::from_secs(60)
        ]
    );
    assert!(parse_schedule("1,x").is_err());
    assert!(parse_schedule("-1").is_err());
    assert!(parse_schedule("999999999").is_err());
    assert_eq!(WebhookSettings::default().schedule.len(), 8);
    let total: Duration = RETRY_SCHEDULE.iter().sum();
    assert_eq!(
        total.as_secs(),
        60 + 300 + 1800 + 7200 + 18000 + 36000 + 86400 * 2
    );
}

#[test]
fn events_are_validated_and_deduplicated() {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        parse_events(&names(&[
            "payment.failed",
            "payment.failed",
            "refund.succeeded"
        ]))
        .unwrap(),
        vec![EventType::PaymentFailed, EventType::RefundSucceeded]
    );
    assert!(parse_events(&[]).unwrap().is_empty());
    let err = parse_events(&names(&["payment.success"])).unwrap_err();
    assert!(
        matches!(err, WebhookError::Invalid { field: "events", ref message } if message.contains("payment.success")),
        "{err:?}"
    );
}

#[test]
fn endpoints_want_their_events_only_while_enabled() {
    let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
    let mut e = Endpoint {
        id: "we_1".into(),
        project_id: "proj_1".into(),
        mode: Mode::Sandbox,
        url: "https://example.com/h".into(),
        events: vec![EventType::PaymentFailed],
        enabled: true,
        created_at: now,
        updated_at: now,
        secret: SealedSecret {
            master_key: "k1".into(),
            alg: "A256GCM".into(),
            nonce: String::new(),
            ciphertext: String::new(),
        },
    };
    assert!(e.wants(EventType::PaymentFailed));
    assert!(!e.wants(EventType::PaymentSucceeded));
    e.events.clear();
    assert!(EventType::ALL.iter().all(|t| e.wants(*t)));
    e.enabled = false;
    assert!(!e.wants(EventType::PaymentFailed));
}

#[test]
fn the_payment_of_an_event_is_found_in_its_object() {
    assert_eq!(
        outbox::payment_of(&json!({"id": "pay_1"})).as_deref(),
        Some("pay_1")
    );
    assert_eq!(
        outbox::payment_of(&json!({"id": "ref_1", "paymentId": "pay_2"})).as_deref(),
        Some("pay_2")
    );
    assert_eq!(outbox::payment_of(&json!({"id": "oinv_1"})), None);
}

#[test]
fn local_receivers_are_for_sandbox_under_the_flag_only() {
    let mut s = WebhookSettings::default();
    assert!(!s.policy(Mode::Sandbox).allow_local_http);
    s.allow_local_http = true;
    assert!(s.policy(Mode::Sandbox).allow_local_http);
    assert!(!s.policy(Mode::Live).allow_local_http);
}

#[test]
fn test_events_have_a_plausible_object() {
    let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
    for t in EventType::ALL {
        let o = sample_object(t, Mode::Sandbox, now);
        assert_eq!(o["test"], true, "{t:?}");
        if t == EventType::ReconciliationCompleted {
            assert!(
                o["id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("rrun_test"))
            );
            assert_eq!(outbox::payment_of(&o), None);
            continue;
        }
        if t == EventType::CustomerCreditUpdated {
            assert!(
                o["id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("cus_test"))
            );
            assert_eq!(outbox::payment_of(&o), None);
            continue;
        }
        if t.is_subscription() || t.is_billing_invoice() || t.is_coupon() {
            // About a subscription, billing invoice, coupon or promotion
            // code: no payment's timeline lists it.
            let prefix = if t.is_subscription() {
                "sub_test"
            } else if t.is_billing_invoice() {
                "inv_test"
            } else if t.as_str().starts_with("coupon.") {
                "cpn_test"
            } else {
                "promo_test"
            };
            assert!(
                o["id"].as_str().is_some_and(|id| id.starts_with(prefix)),
                "{t:?}"
            );
            assert_eq!(outbox::payment_of(&o), None, "{t:?}");
            continue;
        }
        assert!(
            outbox::payment_of(&o).is_some_and(|p| p.starts_with("pay_")),
            "{t:?}"
        );
    }
}

mod dispatching {
    use crate::AppState;
    use std::sync::Arc;

    use super::*;
    use crate::Config;
    use crate::domain::credentials::{CredentialsKey, CredentialsKeys};
    use crate::providers::ProviderHub;
    use crate::queue::memory::InProcessQueue;
    use crate::store::embedded::EmbeddedStore;
    use crate::time::{Clock, ManualClock};

    struct Fixture {
        state: AppState,
        queue: Arc<InProcessQueue>,
        clock: ManualClock,
        client: WebhookClient,
        event: Event,
        endpoint: Endpoint,
    }

    async fn fixture() -> Fixture {
        let clock = ManualClock::new(Timestamp::parse("2026-11-22T10:00:00Z").unwrap());
        let queue = Arc::new(InProcessQueue::new());
        let keys = CredentialsKeys::single(CredentialsKey::generate("k1").unwrap());
        let state = AppState::new(
            Arc::new(EmbeddedStore::in_memory().unwrap()),
            Arc::new(clock.clone()),
            Config {
                public_base_url: "http://127.0.0.1:8080".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
        .with_queue(queue.clone())
        .with_providers(ProviderHub::keys_only(keys))
        .with_webhooks(WebhookSettings {
            allow_local_http: true,
            ..WebhookSettings::default()
        });
        // Port 9 (discard) on loopback: nothing listens, sends fail fast.
        let (endpoint, _secret) = create(
            &state,
            &Tenant::new("proj_1", Mode::Sandbox),
            CreateEndpoint {
                url: "http://127.0.0.1:9/hook".into(),
                events: None,
                enabled: None,
            },
            None,
        )
        .await
        .unwrap();
        let event = Event::new(
            EventType::PaymentSucceeded,
            &Tenant::new("proj_1", Mode::Sandbox),
            json!({"id": "pay_1"}),
            clock.now(),
        );
        state
            .store
            .transact(event.put_ops().unwrap())
            .await
            .unwrap();
        let client = state.webhooks.client().unwrap();
        Fixture {
            state,
            queue,
            clock,
            client,
            event,
            endpoint,
        }
    }

    fn msg(f: &Fixture, attempt: u32) -> DeliveryMessage {
        DeliveryMessage {
            event_id: f.event.id.clone(),
            endpoint_id: f.endpoint.id.clone(),
            attempt,
        }
    }

    async fn current(f: &Fixture) -> Delivery {
        delivery(&*f.state.store, &f.event.id, &f.endpoint.id)
            .await
            .unwrap()
            .unwrap()
    }

    #[tokio::test]
    async fn fan_out_writes_one_delivery_per_endpoint_however_often_it_runs() {
        let f = fixture().await;
        assert_eq!(fan_out(&f.state, &f.event).await.unwrap(), 1);
        let first = current(&f).await;
        // Again (a concurrent poller, a stream retry): same delivery,
        // its first attempt queued again since it was not made.
        assert_eq!(fan_out(&f.state, &f.event).await.unwrap(), 1);
        assert_eq!(current(&f).await.id, first.id);
        assert_eq!(f.queue.len(QueueName::Webhooks), 2);
        assert!(
            outbox::undelivered(&*f.state.store, 10, f.state.clock.now())
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(first.status, DeliveryStatus::Pending);
        assert_eq!(first.payment_id.as_deref(), Some("pay_1"));
    }

    #[tokio::test]
    async fn a_failed_attempt_schedules_the_next_and_stale_messages_are_dropped() {
        let f = fixture().await;
        fan_out(&f.state, &f.event).await.unwrap();
        let out = dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap();
        assert_eq!(
            out,
            Outcome::Retrying {
                next_in: RETRY_SCHEDULE[0]
            }
        );
        let d = current(&f).await;
        assert_eq!((d.status, d.attempts), (DeliveryStatus::Retrying, 1));
        assert!(d.last_error.is_some() && d.response_status.is_none());
        assert!(d.lease_until_ms.is_none());
        assert_eq!(
            d.next_attempt_at,
            Some(f.clock.now().plus(chrono::Duration::seconds(60)))
        );
        // The duplicate of the first message: dropped, nothing sent.
        assert_eq!(
            dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
            Outcome::Skipped
        );
        assert_eq!(current(&f).await.attempts, 1);
        // The next attempt's message before its time: queued again.
        assert_eq!(
            dispatch(&f.state, &f.client, &msg(&f, 1)).await.unwrap(),
            Outcome::NotDue
        );
        assert_eq!(current(&f).await.attempts, 1);
        // A message ahead of the log waits instead of being lost.
        assert_eq!(
            dispatch(&f.state, &f.client, &msg(&f, 5)).await.unwrap(),
            Outcome::NotDue
        );
        f.clock.advance(chrono::Duration::seconds(61));
        assert!(matches!(
            dispatch(&f.state, &f.client, &msg(&f, 1)).await.unwrap(),
            Outcome::Retrying { .. }
        ));
        assert_eq!(current(&f).await.attempts, 2);
    }

    #[tokio::test]
    async fn the_last_failure_ends_the_delivery() {
        let f = fixture().await;
        fan_out(&f.state, &f.event).await.unwrap();
        for attempt in 0..=RETRY_SCHEDULE.len() as u32 {
            let out = dispatch(&f.state, &f.client, &msg(&f, attempt))
                .await
                .unwrap();
            if (attempt as usize) < RETRY_SCHEDULE.len() {
                assert!(
                    matches!(out, Outcome::Retrying { .. }),
                    "{attempt}: {out:?}"
                );
                f.clock.advance(chrono::Duration::days(2));
            } else {
                assert_eq!(out, Outcome::Failed);
            }
        }
        let d = current(&f).await;
        assert_eq!((d.status, d.attempts), (DeliveryStatus::Failed, 9));
        assert!(d.next_attempt_at.is_none());
        assert_eq!(
            dispatch(&f.state, &f.client, &msg(&f, 9)).await.unwrap(),
            Outcome::Skipped
        );
    }

    #[tokio::test]
    async fn a_claimed_attempt_is_not_made_twice() {
        let f = fixture().await;
        fan_out(&f.state, &f.event).await.unwrap();
        // Another worker holds the attempt.
        let until = f.clock.now().unix_millis() + 10_000;
        f.state
            .store
            .update(
                &Delivery::key(&f.event.id, &f.endpoint.id),
                Update::new().set("lease_until_ms", until),
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
            Outcome::Skipped
        );
        assert_eq!(current(&f).await.attempts, 0);
        // Its claim runs out (it crashed): the attempt is made.
        f.clock.advance(chrono::Duration::seconds(11));
        assert!(matches!(
            dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
            Outcome::Retrying { .. }
        ));
    }

    #[tokio::test]
    async fn disabled_and_deleted_endpoints_end_their_deliveries_unsent() {
        let f = fixture().await;
        fan_out(&f.state, &f.event).await.unwrap();
        patch(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &f.endpoint.id,
            PatchEndpoint {
                enabled: Some(false),
                ..PatchEndpoint::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(
            dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
            Outcome::Failed
        );
        let d = current(&f).await;
        assert_eq!((d.status, d.attempts), (DeliveryStatus::Failed, 0));
        assert!(d.last_error.unwrap().contains("disabled"));

        // Deleted: a new event gets no delivery at all.
        delete(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &f.endpoint.id,
        )
        .await
        .unwrap();
        let later = Event::new(
            EventType::PaymentFailed,
            &Tenant::new("proj_1", Mode::Sandbox),
            json!({"id": "pay_2"}),
            f.clock.now(),
        );
        assert_eq!(fan_out(&f.state, &later).await.unwrap(), 0);
    }

    /// A receiver on loopback that answers 200 (after `delay`) and
    /// counts requests.
    async fn counting_receiver(delay: Duration) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move || {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    "ok"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, hits)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_copies_of_a_message_send_once() {
        let f = fixture().await;
        let (url, hits) = counting_receiver(Duration::from_millis(200)).await;
        patch(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &f.endpoint.id,
            PatchEndpoint {
                url: Some(url),
                ..PatchEndpoint::default()
            },
        )
        .await
        .unwrap();
        fan_out(&f.state, &f.event).await.unwrap();
        let runs = (0..8).map(|_| {
            let state = f.state.clone();
            let client = f.client.clone();
            let m = msg(&f, 0);
            tokio::spawn(async move { dispatch(&state, &client, &m).await.unwrap() })
        });
        let outcomes: Vec<Outcome> = futures::future::join_all(runs)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| **o == Outcome::Delivered)
                .count(),
            1,
            "{outcomes:?}"
        );
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        let d = current(&f).await;
        assert_eq!(
            (d.status, d.attempts, d.response_status),
            (DeliveryStatus::Success, 1, Some(200))
        );
        // Later copies, of this attempt or the next: nothing is sent.
        for attempt in [0, 1] {
            assert_eq!(
                dispatch(&f.state, &f.client, &msg(&f, attempt))
                    .await
                    .unwrap(),
                Outcome::Skipped
            );
        }
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_delivery_whose_message_was_lost_is_queued_again_by_the_sweep() {
        use crate::queue::Queue;
        let f = fixture().await;
        fan_out(&f.state, &f.event).await.unwrap();
        // The message is lost (a purge, a dead-letter queue).
        let got = f
            .queue
            .receive(
                QueueName::Webhooks,
                10,
                Duration::ZERO,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        for m in got {
            f.queue
                .delete(QueueName::Webhooks, &m.receipt)
                .await
                .unwrap();
        }
        assert_eq!(
            requeue_overdue(&f.state, f.clock.now(), 10).await.unwrap(),
            0
        );
        f.clock.advance(chrono::Duration::minutes(16));
        let swept = sweep(&f.state, f.clock.now(), 10).await.unwrap();
        assert_eq!(swept.requeued, 1);
        let got = f
            .queue
            .receive(
                QueueName::Webhooks,
                10,
                Duration::ZERO,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        let again = DeliveryMessage::parse(&got[0].body).unwrap();
        assert_eq!(again, msg(&f, 0));
        // Once final, it leaves the open index.
        for attempt in 0..=RETRY_SCHEDULE.len() as u32 {
            dispatch(&f.state, &f.client, &msg(&f, attempt))
                .await
                .unwrap();
            f.clock.advance(chrono::Duration::days(2));
        }
        assert_eq!(current(&f).await.status, DeliveryStatus::Failed);
        assert_eq!(
            requeue_overdue(&f.state, f.clock.now(), 10).await.unwrap(),
            0
        );
    }

    #[tokio::test]
    async fn an_unreadable_delivery_does_not_keep_the_sweep_from_the_others() {
        use crate::queue::Queue;
        let f = fixture().await;
        fan_out(&f.state, &f.event).await.unwrap();
        // Its message is lost; a broken delivery of an old event sorts
        // before it in the same open shard.
        let got = f
            .queue
            .receive(
                QueueName::Webhooks,
                10,
                Duration::ZERO,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        for m in got {
            f.queue
                .delete(QueueName::Webhooks, &m.receipt)
                .await
                .unwrap();
        }
        let Some(good) = f
            .state
            .store
            .get(&Delivery::key(&f.event.id, &f.endpoint.id))
            .await
            .unwrap()
        else {
            panic!("no delivery")
        };
        let shard = good.get(Index::Gsi2.pk_attr()).cloned();
        let three_hours_ago = f.clock.now().plus(chrono::Duration::hours(-3));
        let old_event = format!(
            "{}{}",
            IdKind::Event.prefix(),
            ulid::Ulid::from_parts(three_hours_ago.unix_millis() as u64, 1)
                .to_string()
                .to_ascii_lowercase()
        );
        let broken = json!({
            "pk": format!("EVT#{old_event}"),
            "sk": "WHD#we_broken",
            "status": "no-such-status",
            Index::Gsi2.pk_attr(): shard,
            Index::Gsi2.sk_attr(): "000000000000000#broken",
        });
        f.state
            .store
            .put(broken.as_object().cloned().unwrap(), None)
            .await
            .unwrap();
        f.clock.advance(chrono::Duration::minutes(16));
        assert_eq!(
            requeue_overdue(&f.state, f.clock.now(), 10).await.unwrap(),
            1
        );
        // Taken out of the index (it is hours old), kept in the table.
        let kept = f
            .state
            .store
            .get(&Key::new(format!("EVT#{old_event}"), "WHD#we_broken"))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the bad record is kept"));
        assert!(!kept.contains_key(Index::Gsi2.pk_attr()));

        // A delivery of the same old event that newer code wrote a
        // moment ago (a rolling deploy): passed over, left in the index.
        let fresh = json!({
            "pk": format!("EVT#{old_event}"),
            "sk": "WHD#we_newer",
            "status": "a-status-of-newer-code",
            "updated_at": f.clock.now(),
            Index::Gsi2.pk_attr(): shard,
            Index::Gsi2.sk_attr(): "000000000000000#newer",
        });
        f.state
            .store
            .put(fresh.as_object().cloned().unwrap(), None)
            .await
            .unwrap();
        requeue_overdue(&f.state, f.clock.now(), 10).await.unwrap();
        let left = f
            .state
            .store
            .get(&Key::new(format!("EVT#{old_event}"), "WHD#we_newer"))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("kept"));
        assert!(left.contains_key(Index::Gsi2.pk_attr()));
    }

    #[tokio::test]
    async fn a_test_event_reaches_its_endpoint_whatever_its_filter() {
        let f = fixture().await;
        let (filtered, _) = create(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            CreateEndpoint {
                url: "http://127.0.0.1:9/other".into(),
                events: Some(vec!["payment.failed".into()]),
                enabled: None,
            },
            None,
        )
        .await
        .unwrap();
        let event = send_test_event(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &filtered.id,
            EventType::RefundSucceeded,
        )
        .await
        .unwrap();
        assert_eq!(fan_out(&f.state, &event).await.unwrap(), 1);
        assert!(
            delivery(&*f.state.store, &event.id, &filtered.id)
                .await
                .unwrap()
                .is_some()
        );
        // The fixture's endpoint takes every event, but not this one.
        assert!(
            delivery(&*f.state.store, &event.id, &f.endpoint.id)
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_fenced_registration_run_twice_creates_one_endpoint() {
        let f = fixture().await;
        let fence = Fence::new(Key::new("IDEMFENCE#t", "FENCE"), 0);
        let body = || CreateEndpoint {
            url: "http://127.0.0.1:9/fenced".into(),
            events: None,
            enabled: None,
        };
        let (first, secret) = create(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            body(),
            Some(&fence),
        )
        .await
        .unwrap();
        assert!(secret.is_some_and(|s| s.starts_with("whsec_") && s.len() == 6 + 64));
        // The answer was lost; the retry runs the handler again.
        let (again, secret) = create(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            body(),
            Some(&fence),
        )
        .await
        .unwrap();
        assert_eq!(again.id, first.id);
        assert!(secret.is_none(), "the secret is shown once");
        assert_eq!(
            list(&f.state, &Tenant::new("proj_1", Mode::Sandbox))
                .await
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn null_is_refused_rather_than_ignored() {
        for body in [
            r#"{"url": null}"#,
            r#"{"events": null}"#,
            r#"{"enabled": null}"#,
        ] {
            assert!(
                serde_json::from_str::<PatchEndpoint>(body).is_err(),
                "{body}"
            );
        }
        assert!(
            serde_json::from_str::<CreateEndpoint>(
                r#"{"url": "https://a.example", "events": null}"#
            )
            .is_err()
        );
        let p: PatchEndpoint = serde_json::from_str(r#"{"enabled": false}"#).unwrap();
        assert_eq!((p.url, p.events, p.enabled), (None, None, Some(false)));
    }

    #[tokio::test]
    async fn bad_messages_are_dropped() {
        let f = fixture().await;
        assert_eq!(
            handle_message(&f.state, &f.client, "{not json")
                .await
                .unwrap(),
            Outcome::Skipped
        );
        assert_eq!(
            dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
            Outcome::Skipped
        );
    }

    // ------------------------------------------------ the delivery log

    /// An event's deliveries are found from the event, one per endpoint,
    /// and nothing else of its partition (the event record) is read as one.
    #[tokio::test]
    async fn an_events_deliveries_are_found_from_the_event() {
        let f = fixture().await;
        assert!(
            deliveries_of_event(&*f.state.store, &f.event.id, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let (second, _) = create(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            CreateEndpoint {
                url: "http://127.0.0.1:9/other".into(),
                events: None,
                enabled: None,
            },
            None,
        )
        .await
        .unwrap();
        assert_eq!(fan_out(&f.state, &f.event).await.unwrap(), 2);
        let found = deliveries_of_event(&*f.state.store, &f.event.id, 10)
            .await
            .unwrap();
        let mut to: Vec<&str> = found.iter().map(|d| d.endpoint_id.as_str()).collect();
        to.sort_unstable();
        let mut want = vec![f.endpoint.id.as_str(), second.id.as_str()];
        want.sort_unstable();
        assert_eq!(to, want);
        assert!(
            found
                .iter()
                .all(|d| d.payment_id.as_deref() == Some("pay_1"))
        );
        assert_eq!(
            deliveries_of_event(&*f.state.store, &f.event.id, 1)
                .await
                .unwrap()
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn the_delivery_log_answers_the_newest_fifty_newest_first() {
        let f = fixture().await;
        let mut events = Vec::new();
        for i in 0..(DELIVERY_LOG + 10) {
            f.clock.advance(chrono::Duration::seconds(1));
            let event = Event::new(
                EventType::PaymentSucceeded,
                &Tenant::new("proj_1", Mode::Sandbox),
                json!({ "id": format!("pay_{i}") }),
                f.clock.now(),
            );
            f.state
                .store
                .transact(event.put_ops().unwrap())
                .await
                .unwrap();
            assert_eq!(fan_out(&f.state, &event).await.unwrap(), 1);
            events.push(event);
        }
        let log = deliveries(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &f.endpoint.id,
        )
        .await
        .unwrap();
        assert_eq!(log.len(), DELIVERY_LOG);
        // Exactly the newest 50 events, newest first.
        let listed: Vec<&str> = log.iter().map(|d| d.event_id.as_str()).collect();
        let newest: Vec<&str> = events
            .iter()
            .rev()
            .take(DELIVERY_LOG)
            .map(|e| e.id.as_str())
            .collect();
        assert_eq!(listed, newest);
        for pair in log.windows(2) {
            assert!(pair[0].id > pair[1].id, "ids newest first");
            assert!(pair[0].created_at > pair[1].created_at, "newest first");
        }
        assert!(log.iter().all(|d| d.endpoint_id == f.endpoint.id));
        // The oldest ten are still stored, just not listed.
        for e in &events[..10] {
            assert!(
                delivery(&*f.state.store, &e.id, &f.endpoint.id)
                    .await
                    .unwrap()
                    .is_some()
            );
        }
    }

    // ------------------------------------------------ long waits

    /// The queue of the fixture, recording every webhook message sent
    /// with its delay and the (manual) time it was sent at.
    struct Recording {
        inner: Arc<InProcessQueue>,
        clock: ManualClock,
        sent: std::sync::Mutex<Vec<(DeliveryMessage, Duration, Timestamp)>>,
    }

    impl Recording {
        fn sent(&self) -> Vec<(DeliveryMessage, Duration, Timestamp)> {
            self.sent.lock().unwrap().clone()
        }
    }

    #[async_trait::async_trait]
    impl crate::queue::Queue for Recording {
        async fn send(
            &self,
            queue: QueueName,
            body: &str,
            delay: Duration,
        ) -> Result<String, QueueError> {
            if queue == QueueName::Webhooks {
                let m = DeliveryMessage::parse(body).unwrap();
                self.sent.lock().unwrap().push((m, delay, self.clock.now()));
            }
            self.inner.send(queue, body, delay).await
        }

        async fn receive(
            &self,
            queue: QueueName,
            max: usize,
            wait: Duration,
            visibility: Duration,
        ) -> Result<Vec<crate::queue::Message>, QueueError> {
            self.inner.receive(queue, max, wait, visibility).await
        }

        async fn delete(&self, queue: QueueName, receipt: &str) -> Result<(), QueueError> {
            self.inner.delete(queue, receipt).await
        }
    }

    /// A receiver that answers 500 to its first `failures` requests,
    /// then 200, and records the (manual) time of each request.
    async fn flaky_receiver(
        failures: usize,
        clock: ManualClock,
    ) -> (String, Arc<std::sync::Mutex<Vec<Timestamp>>>) {
        let hits = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = hits.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move || {
                let seen = seen.clone();
                let clock = clock.clone();
                async move {
                    let mut seen = seen.lock().unwrap();
                    seen.push(clock.now());
                    if seen.len() <= failures {
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        axum::http::StatusCode::OK
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, hits)
    }

    /// Moves the manual clock and the queue's clock forward together by
    /// `step`, then handles every message now visible, as the worker
    /// does (a message is deleted once handled).
    async fn tick(f: &Fixture, step: Duration) -> Vec<Outcome> {
        use crate::queue::Queue;
        f.clock.advance(chrono::Duration::from_std(step).unwrap());
        f.queue.skip_ahead(step);
        let mut outcomes = Vec::new();
        loop {
            let got = f
                .queue
                .receive(
                    QueueName::Webhooks,
                    10,
                    Duration::ZERO,
                    Duration::from_secs(60),
                )
                .await
                .unwrap();
            if got.is_empty() {
                return outcomes;
            }
            for m in got {
                outcomes.push(handle_message(&f.state, &f.client, &m.body).await.unwrap());
                f.queue
                    .delete(QueueName::Webhooks, &m.receipt)
                    .await
                    .unwrap();
            }
        }
    }

    #[tokio::test]
    async fn a_wait_past_fifteen_minutes_is_chained_and_never_attempted_early() {
        let mut f = fixture().await;
        // Fails the first 4 attempts (waits 1 min, 5 min, 30 min, 2 h
        // follow them), answers the fifth.
        let (url, hits) = flaky_receiver(4, f.clock.clone()).await;
        patch(
            &f.state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &f.endpoint.id,
            PatchEndpoint {
                url: Some(url),
                ..PatchEndpoint::default()
            },
        )
        .await
        .unwrap();
        let recording = Arc::new(Recording {
            inner: f.queue.clone(),
            clock: f.clock.clone(),
            sent: std::sync::Mutex::new(Vec::new()),
        });
        f.state = f.state.clone().with_queue(recording.clone());
        let start = f.clock.now();
        fan_out(&f.state, &f.event).await.unwrap();

        // Minute by minute until the fourth attempt has failed.
        let minute = Duration::from_secs(60);
        let mut out = tick(&f, Duration::ZERO).await;
        while current(&f).await.attempts < 4 {
            assert!(f.clock.now() < start.plus(chrono::Duration::hours(1)));
            out.extend(tick(&f, minute).await);
        }
        let d = current(&f).await;
        assert_eq!(d.status, DeliveryStatus::Retrying);
        let failed_at = d.last_attempt_at.unwrap();
        let due = d.next_attempt_at.unwrap();
        assert_eq!(due, failed_at.plus(chrono::Duration::hours(2)));
        // Attempts at 0, +1 min, +6 min and +36 min (the 30 min wait
        // took two messages).
        let at = |mins: i64| start.plus(chrono::Duration::minutes(mins));
        assert_eq!(*hits.lock().unwrap(), vec![at(0), at(1), at(6), at(36)]);
        assert_eq!(failed_at, at(36));
        assert!(out.contains(&Outcome::NotDue), "{out:?}");

        // The 2 h wait, minute by minute: the chained messages arrive
        // early, send nothing and queue the rest of the wait.
        let stray_at = due.plus(chrono::Duration::minutes(-7));
        while f.clock.now() < stray_at {
            let out = tick(&f, minute).await;
            assert!(out.iter().all(|o| *o == Outcome::NotDue), "{out:?}");
            assert_eq!(hits.lock().unwrap().len(), 4, "sent early");
        }
        // A stray copy of the message 7 minutes early: not sent either,
        // and queued for exactly the 7 minutes left.
        assert_eq!(
            dispatch(&f.state, &f.client, &msg(&f, 4)).await.unwrap(),
            Outcome::NotDue
        );
        let (last, delay, _) = recording.sent().pop().unwrap();
        assert_eq!((last.attempt, delay), (4, Duration::from_secs(7 * 60)));
        while f.clock.now() < due.plus(chrono::Duration::minutes(-1)) {
            let out = tick(&f, minute).await;
            assert!(out.iter().all(|o| *o == Outcome::NotDue), "{out:?}");
            assert_eq!(hits.lock().unwrap().len(), 4, "sent early");
        }
        // Due: both messages arrive; exactly one sends.
        let mut out = tick(&f, minute).await;
        assert_eq!(f.clock.now(), due);
        out.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(out, vec![Outcome::Delivered, Outcome::Skipped]);
        assert_eq!(hits.lock().unwrap().len(), 5);
        assert_eq!(hits.lock().unwrap()[4], due);
        let d = current(&f).await;
        assert_eq!((d.status, d.attempts), (DeliveryStatus::Success, 5));
        // Nothing more, ever.
        for _ in 0..30 {
            assert!(tick(&f, minute).await.is_empty());
        }
        assert!(f.queue.is_empty(QueueName::Webhooks));
        assert_eq!(hits.lock().unwrap().len(), 5);

        // Every message was queued for at most 15 minutes; each one for
        // the fifth attempt before its time for what was left of the
        // wait (capped): 2 h took 8 chained messages, plus the stray.
        let sent = recording.sent();
        assert!(
            sent.iter().all(|(_, delay, _)| *delay <= MAX_DELAY),
            "{sent:?}"
        );
        let fifth: Vec<(Duration, Timestamp)> = sent
            .iter()
            .filter(|(m, _, _)| m.attempt == 4)
            .map(|(_, delay, t)| (*delay, *t))
            .collect();
        assert_eq!(fifth.len(), 8 + 1, "{fifth:?}");
        for (delay, t) in &fifth {
            let left = Duration::from_millis((due.unix_millis() - t.unix_millis()) as u64);
            assert_eq!(*delay, left.min(MAX_DELAY), "at {t:?}");
        }
        let chain: Vec<Timestamp> = fifth
            .iter()
            .filter(|(delay, _)| *delay == MAX_DELAY)
            .map(|(_, t)| *t)
            .collect();
        let every_quarter: Vec<Timestamp> = (0..8)
            .map(|i| failed_at.plus(chrono::Duration::minutes(15 * i)))
            .collect();
        assert_eq!(chain, every_quarter);
    }

    // ------------------------------------------------ the endpoint limit

    fn body(i: usize) -> CreateEndpoint {
        CreateEndpoint {
            url: format!("http://127.0.0.1:9/hook/{i}"),
            events: None,
            enabled: None,
        }
    }

    async fn count_of(f: &Fixture, project: &str) -> Option<i64> {
        EndpointCounter::read(&*f.state.store, &Tenant::new(project, Mode::Sandbox))
            .await
            .unwrap()
            .map(|(n, _)| n)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_registrations_never_pass_the_limit() {
        let f = fixture().await;
        let runs = (0..40).map(|i| {
            let state = f.state.clone();
            tokio::spawn(async move {
                create(&state, &Tenant::new("proj_2", Mode::Sandbox), body(i), None).await
            })
        });
        let results: Vec<Result<(Endpoint, Option<String>), WebhookError>> =
            futures::future::join_all(runs)
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
        let made = results.iter().filter(|r| r.is_ok()).count();
        let refused = results
            .iter()
            .filter(|r| matches!(r, Err(WebhookError::TooMany)))
            .count();
        assert_eq!((made, refused), (MAX_ENDPOINTS, 40 - MAX_ENDPOINTS));
        let listed = list(&f.state, &Tenant::new("proj_2", Mode::Sandbox))
            .await
            .unwrap();
        assert_eq!(listed.len(), MAX_ENDPOINTS);
        assert_eq!(count_of(&f, "proj_2").await, Some(MAX_ENDPOINTS as i64));
        // Per project and mode: the others are untouched.
        assert_eq!(count_of(&f, "proj_1").await, Some(1));
        create(
            &f.state,
            &Tenant::new("proj_3", Mode::Sandbox),
            body(0),
            None,
        )
        .await
        .unwrap();

        // Deleting makes room for exactly one; deleting twice (here at
        // once) frees one place only.
        let gone = listed[3].id.clone();
        let deletes = (0..4).map(|_| {
            let deps = f.state.clone();
            let gone = gone.clone();
            tokio::spawn(async move {
                delete(&deps, &Tenant::new("proj_2", Mode::Sandbox), &gone).await
            })
        });
        let deleted: Vec<Result<(), WebhookError>> = futures::future::join_all(deletes)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(deleted.iter().filter(|r| r.is_ok()).count(), 1);
        assert!(
            deleted
                .iter()
                .all(|r| matches!(r, Ok(()) | Err(WebhookError::NotFound(_))))
        );
        assert!(matches!(
            delete(&f.state, &Tenant::new("proj_2", Mode::Sandbox), &gone).await,
            Err(WebhookError::NotFound(_))
        ));
        assert_eq!(count_of(&f, "proj_2").await, Some(15));
        create(
            &f.state,
            &Tenant::new("proj_2", Mode::Sandbox),
            body(100),
            None,
        )
        .await
        .unwrap();
        assert!(matches!(
            create(
                &f.state,
                &Tenant::new("proj_2", Mode::Sandbox),
                body(101),
                None
            )
            .await,
            Err(WebhookError::TooMany)
        ));
        assert_eq!(
            list(&f.state, &Tenant::new("proj_2", Mode::Sandbox))
                .await
                .unwrap()
                .len(),
            MAX_ENDPOINTS
        );
    }

    async fn set_count(f: &Fixture, project: &str, n: i64) {
        f.state
            .store
            .update(
                &EndpointCounter::key(&Tenant::new(project, Mode::Sandbox)),
                Changes::<EndpointCounter>::new()
                    .set(EndpointCounter::N, &n)
                    .into(),
                Some(Cond::Exists),
            )
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_count_drifted_high_is_repaired_from_the_endpoints() {
        let f = fixture().await;
        for i in 0..3 {
            create(
                &f.state,
                &Tenant::new("proj_2", Mode::Sandbox),
                body(i),
                None,
            )
            .await
            .unwrap();
        }
        // Endpoints deleted without the count (old code, by hand).
        set_count(&f, "proj_2", MAX_ENDPOINTS as i64).await;
        create(
            &f.state,
            &Tenant::new("proj_2", Mode::Sandbox),
            body(3),
            None,
        )
        .await
        .unwrap();
        assert_eq!(count_of(&f, "proj_2").await, Some(4));
        let listed = list(&f.state, &Tenant::new("proj_2", Mode::Sandbox))
            .await
            .unwrap();
        assert_eq!(listed.len(), 4);

        // Still a limit: a full project is refused, repaired or not.
        for i in 4..MAX_ENDPOINTS {
            create(
                &f.state,
                &Tenant::new("proj_2", Mode::Sandbox),
                body(i),
                None,
            )
            .await
            .unwrap();
        }
        set_count(&f, "proj_2", MAX_ENDPOINTS as i64 + 3).await;
        assert!(matches!(
            create(
                &f.state,
                &Tenant::new("proj_2", Mode::Sandbox),
                body(99),
                None
            )
            .await,
            Err(WebhookError::TooMany)
        ));
        assert_eq!(
            list(&f.state, &Tenant::new("proj_2", Mode::Sandbox))
                .await
                .unwrap()
                .len(),
            MAX_ENDPOINTS
        );
    }

    #[tokio::test]
    async fn a_repair_from_a_stale_read_changes_nothing() {
        let f = fixture().await;
        for i in 0..2 {
            create(
                &f.state,
                &Tenant::new("proj_2", Mode::Sandbox),
                body(i),
                None,
            )
            .await
            .unwrap();
        }
        let store = &*f.state.store;
        let Some((n, v)) = EndpointCounter::read(store, &Tenant::new("proj_2", Mode::Sandbox))
            .await
            .unwrap()
        else {
            panic!("counter")
        };
        assert_eq!(n, 2);
        // A delete then a registration: the count is back at 2, but it
        // moved in between (a repair from the first read is stale).
        let listed = list(&f.state, &Tenant::new("proj_2", Mode::Sandbox))
            .await
            .unwrap();
        delete(
            &f.state,
            &Tenant::new("proj_2", Mode::Sandbox),
            &listed[0].id,
        )
        .await
        .unwrap();
        create(
            &f.state,
            &Tenant::new("proj_2", Mode::Sandbox),
            body(7),
            None,
        )
        .await
        .unwrap();
        EndpointCounter::repair(store, &Tenant::new("proj_2", Mode::Sandbox), (n, v), 9)
            .await
            .unwrap();
        assert_eq!(count_of(&f, "proj_2").await, Some(2), "stale: no change");
        let fresh = EndpointCounter::read(store, &Tenant::new("proj_2", Mode::Sandbox))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(fresh.1, v + 2);
        EndpointCounter::repair(store, &Tenant::new("proj_2", Mode::Sandbox), fresh, 2)
            .await
            .unwrap();
        assert_eq!(count_of(&f, "proj_2").await, Some(2));
    }

    #[tokio::test]
    async fn a_count_drifted_low_never_blocks_a_delete_nor_goes_negative() {
        let f = fixture().await;
        let (only, _) = create(
            &f.state,
            &Tenant::new("proj_2", Mode::Sandbox),
            body(0),
            None,
        )
        .await
        .unwrap();
        set_count(&f, "proj_2", 0).await;
        delete(&f.state, &Tenant::new("proj_2", Mode::Sandbox), &only.id)
            .await
            .unwrap();
        assert!(matches!(
            get(&f.state, &Tenant::new("proj_2", Mode::Sandbox), &only.id).await,
            Err(WebhookError::NotFound(_))
        ));
        assert_eq!(count_of(&f, "proj_2").await, Some(0));
        assert!(matches!(
            delete(&f.state, &Tenant::new("proj_2", Mode::Sandbox), &only.id).await,
            Err(WebhookError::NotFound(_))
        ));
        assert_eq!(count_of(&f, "proj_2").await, Some(0));

        // Low with several left: set from the endpoints that remain.
        let mut made = Vec::new();
        for i in 0..3 {
            let (e, _) = create(
                &f.state,
                &Tenant::new("proj_2", Mode::Sandbox),
                body(i),
                None,
            )
            .await
            .unwrap();
            made.push(e.id);
        }
        set_count(&f, "proj_2", 0).await;
        delete(&f.state, &Tenant::new("proj_2", Mode::Sandbox), &made[0])
            .await
            .unwrap();
        assert_eq!(count_of(&f, "proj_2").await, Some(2));
        delete(&f.state, &Tenant::new("proj_2", Mode::Sandbox), &made[1])
            .await
            .unwrap();
        assert_eq!(count_of(&f, "proj_2").await, Some(1));
    }

    #[tokio::test]
    async fn endpoints_from_before_the_counter_are_counted() {
        let f = fixture().await;
        for i in 0..MAX_ENDPOINTS {
            create(
                &f.state,
                &Tenant::new("proj_2", Mode::Sandbox),
                body(i),
                None,
            )
            .await
            .unwrap();
        }
        // As stored before the counter existed.
        let counter = EndpointCounter::key(&Tenant::new("proj_2", Mode::Sandbox));
        f.state.store.delete(&counter, None).await.unwrap();
        assert!(matches!(
            create(
                &f.state,
                &Tenant::new("proj_2", Mode::Sandbox),
                body(99),
                None
            )
            .await,
            Err(WebhookError::TooMany)
        ));
        assert_eq!(count_of(&f, "proj_2").await, Some(MAX_ENDPOINTS as i64));

        // A delete is the first write after the upgrade: counted too.
        f.state.store.delete(&counter, None).await.unwrap();
        let some = list(&f.state, &Tenant::new("proj_2", Mode::Sandbox))
            .await
            .unwrap()
            .remove(0);
        delete(&f.state, &Tenant::new("proj_2", Mode::Sandbox), &some.id)
            .await
            .unwrap();
        assert_eq!(count_of(&f, "proj_2").await, Some(15));
        create(
            &f.state,
            &Tenant::new("proj_2", Mode::Sandbox),
            body(100),
            None,
        )
        .await
        .unwrap();
        assert!(matches!(
            create(
                &f.state,
                &Tenant::new("proj_2", Mode::Sandbox),
                body(101),
                None
            )
            .await,
            Err(WebhookError::TooMany)
        ));
    }
}
