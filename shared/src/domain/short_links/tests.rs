use std::collections::HashSet;
use std::sync::Arc;

use super::*;
use crate::domain::billing::invoice::issue_invoice;
use crate::domain::billing::reminders::MAX_PAY_URL_CHARS;
use crate::domain::billing::subscription::{NewSubscription, create, new_subscription};
use crate::domain::billing::terms::monthly;
use crate::store::counting::CountingStore;
use crate::store::{Query, Store};
use crate::testenv::at;
use crate::time::ManualClock;
use crate::{AppState, Config};

const NOW: &str = "2026-01-10T06:00:00Z";

fn deps_on(store: Arc<dyn Store>) -> AppState {
    AppState::new(
        store,
        Arc::new(ManualClock::new(at(NOW))),
        Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

/// The embedded store, and moto when `DHUKUTI_TEST_AWS_ENDPOINT` is set
/// (a fresh table).
async fn stores() -> Vec<(&'static str, Arc<dyn Store>)> {
    let mut out: Vec<(&'static str, Arc<dyn Store>)> =
        vec![("embedded", crate::testenv::memory_store())];
    if let Some(endpoint) = crate::queue::testkit::aws_endpoint() {
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "ap-south-1".into());
        let client = crate::store::dynamo::client_for_endpoint(&endpoint, &region);
        let table = format!("dhukuti-test-{}", ulid::Ulid::new());
        crate::store::dynamo::create_table(&client, &table)
            .await
            .unwrap_or_else(|e| panic!("create table {table}: {e}"));
        out.push((
            "dynamodb",
            Arc::new(crate::store::dynamo::DynamoStore::new(client, table)),
        ));
    }
    out
}

/// A sandbox subscription of `project` (a trial ending `trial` when
/// given), stored.
async fn subscription(deps: &Deps, project: &str, trial: Option<&str>) -> Subscription {
    let tenant = Tenant::new(project, Mode::Sandbox);
    let now = at(NOW);
    let input = NewSubscription {
        customer_id: "cus_1".into(),
        plan_id: "bp_1".into(),
        terms: monthly(),
        reference_id: None,
        metadata: serde_json::Map::new(),
        start: now,
        trial_ends_at: trial.map(at),
        billing_anchor_day: None,
        dunning_policy_id: None,
        test_clock_id: None,
    };
    let sub = new_subscription(&tenant, input, now).unwrap();
    create(deps, &sub).await.unwrap();
    sub
}

async fn invoice(deps: &Deps, project: &str) -> BillingInvoice {
    let sub = subscription(deps, project, None).await;
    let period = sub.current_period().unwrap();
    issue_invoice(deps, &sub, period, at(NOW))
        .await
        .unwrap()
        .invoice
}

async fn token_items(store: &dyn Store, link: &ShortLink) -> usize {
    let page = store
        .query(&Query::partition(ShortLink::key(&link.token).pk))
        .await
        .unwrap();
    page.items.len()
}

#[test]
fn a_url_is_the_base_and_the_token() {
    assert_eq!(
        url("https://dk.np", "aB3dE6gH9j"),
        "https://dk.np/r/aB3dE6gH9j"
    );
    assert_eq!(
        url("https://dk.np/", "aB3dE6gH9j"),
        "https://dk.np/r/aB3dE6gH9j"
    );
    // A short host leaves room: 40 characters at most in a reminder.
    assert!(url("https://pay.dhukuti.np", "aB3dE6gH9j").chars().count() <= MAX_PAY_URL_CHARS);
    assert_eq!(too_long_on("https://pay.dhukuti.np"), None);
    assert_eq!(too_long_on("http://127.0.0.1:8080"), None);
    assert_eq!(too_long_on(""), None, "no base: the request's host");
    // 27 + 3 + 10 = 40 fits; one more does not.
    assert_eq!(too_long_on("https://pay.dhukuti-shop.np"), None);
    assert_eq!(too_long_on("https://pay.dhukuti-shops.np"), Some(41));
    assert_eq!(
        too_long_on("https://abc123def4.execute-api.ap-south-1.amazonaws.com"),
        Some(68)
    );
}

#[test]
fn a_token_is_ten_letters_or_digits_and_each_is_fresh() {
    let mut seen = HashSet::new();
    let mut chars = HashSet::new();
    for _ in 0..2000 {
        let t = new_token().unwrap();
        assert!(is_token(&t), "{t}");
        chars.extend(t.chars());
        assert!(seen.insert(t), "a token repeated");
    }
    // 20,000 draws over 62 characters: every one of them shows up.
    assert_eq!(chars.len(), 62, "{chars:?}");
    for bad in [
        "",
        "aB3dE6gH9",
        "aB3dE6gH9jk",
        "aB3dE6gH9-",
        "aB3dE6gH9é",
        "aB3d E6gH9",
    ] {
        assert!(!is_token(bad), "{bad:?}");
    }
}

#[tokio::test]
async fn a_target_has_one_token_and_it_resolves_to_it() {
    let deps = deps_on(crate::testenv::memory_store());
    let inv = invoice(&deps, "proj_one").await;
    let tenant = Tenant::new("proj_one", Mode::Sandbox);
    let target = ShortTarget::Invoice(inv.id.clone());
    let first = ensure(&deps, &tenant, &target).await.unwrap();
    let again = ensure(&deps, &tenant, &target).await.unwrap();
    assert_eq!(first, again);
    assert!(is_token(&first.token));
    assert_eq!(first.target, target);
    assert_eq!(first.tenant(), tenant);
    assert_eq!(
        resolve(&deps, &first.token).await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        landing(&deps, &first.token).await.unwrap(),
        Some(Landing::Invoice(inv.id.clone()))
    );
    // Another target, another token.
    let sub = subscription(&deps, "proj_one", Some("2026-02-01T06:00:00Z")).await;
    let other = ensure(&deps, &tenant, &ShortTarget::Subscription(sub.id.clone()))
        .await
        .unwrap();
    assert_ne!(other.token, first.token);
}

#[tokio::test]
async fn a_token_that_cannot_be_one_reads_nothing() {
    let store = Arc::new(CountingStore::new(crate::testenv::memory_store()));
    let deps = deps_on(store.clone());
    for bad in [
        "",
        "short",
        "aB3dE6gH9jk",
        "aB3dE6gH9%",
        "../aB3dE6g",
        "aB3dE6gH9é",
    ] {
        assert_eq!(resolve(&deps, bad).await.unwrap(), None, "{bad:?}");
        assert_eq!(landing(&deps, bad).await.unwrap(), None, "{bad:?}");
    }
    assert_eq!(store.calls(), 0);
    // A well-formed token nobody was given: one read, no write.
    assert_eq!(landing(&deps, "aB3dE6gH9j").await.unwrap(), None);
    assert_eq!(store.calls(), 1);
}

#[tokio::test]
async fn another_projects_target_gets_no_token() {
    let store = crate::testenv::memory_store();
    let deps = deps_on(store.clone());
    let inv = invoice(&deps, "proj_owner").await;
    let target = ShortTarget::Invoice(inv.id.clone());
    for tenant in [
        Tenant::new("proj_other", Mode::Sandbox),
        Tenant::new("proj_owner", Mode::Live),
    ] {
        match ensure(&deps, &tenant, &target).await {
            Err(StoreError::Invalid(m)) => assert!(m.contains(inv.id.as_str()), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(store.get(&target.back_key()).await.unwrap(), None);
    // Nor a missing one.
    let missing = ShortTarget::Subscription(SubscriptionId::new());
    let owner = Tenant::new("proj_owner", Mode::Sandbox);
    assert!(matches!(
        ensure(&deps, &owner, &missing).await,
        Err(StoreError::Invalid(_))
    ));
    // Once made, the owner's token is not handed to another project.
    ensure(&deps, &owner, &target).await.unwrap();
    let stranger = Tenant::new("proj_other", Mode::Sandbox);
    assert!(matches!(
        ensure(&deps, &stranger, &target).await,
        Err(StoreError::Invalid(_))
    ));
}

#[tokio::test]
async fn a_token_drawn_twice_is_drawn_again() {
    let deps = deps_on(crate::testenv::memory_store());
    let tenant = Tenant::new("proj_clash", Mode::Sandbox);
    let a = invoice(&deps, "proj_clash").await;
    let b = invoice(&deps, "proj_clash").await;
    let first = ensure_drawing(&deps, &tenant, &ShortTarget::Invoice(a.id.clone()), || {
        Ok("AAAAAAAAAA".into())
    })
    .await
    .unwrap();
    assert_eq!(first.token, "AAAAAAAAAA");
    let mut draws = vec!["BBBBBBBBBB", "AAAAAAAAAA"];
    let second = ensure_drawing(&deps, &tenant, &ShortTarget::Invoice(b.id.clone()), || {
        Ok(draws.pop().unwrap_or("CCCCCCCCCC").into())
    })
    .await
    .unwrap();
    assert_eq!(
        second.token, "BBBBBBBBBB",
        "the taken token was drawn again"
    );
    assert_eq!(
        resolve(&deps, "AAAAAAAAAA")
            .await
            .unwrap()
            .map(|l| l.target),
        Some(ShortTarget::Invoice(a.id))
    );
}

/// Twenty callers asking at once for one target's token get one token,
/// and one token item exists. On both backends.
#[tokio::test]
async fn racing_callers_get_one_token() {
    for (name, store) in stores().await {
        let deps = deps_on(store.clone());
        let inv = invoice(&deps, "proj_race").await;
        let tenant = Tenant::new("proj_race", Mode::Sandbox);
        let target = ShortTarget::Invoice(inv.id.clone());
        let calls = (0..20).map(|_| {
            let (deps, tenant, target) = (deps.clone(), tenant.clone(), target.clone());
            tokio::spawn(async move { ensure(&deps, &tenant, &target).await })
        });
        let links: Vec<ShortLink> = futures::future::join_all(calls)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap_or_else(|e| panic!("{name}: {e}")))
            .collect();
        let tokens: HashSet<&str> = links.iter().map(|l| l.token.as_str()).collect();
        assert_eq!(tokens.len(), 1, "{name}: {tokens:?}");
        let link = &links[0];
        assert_eq!(token_items(&*store, link).await, 1, "{name}");
        let back: Option<ShortBack> = record::get(&*store, &target.back_key()).await.unwrap();
        assert_eq!(back, Some(ShortBack(link.clone())), "{name}");
        assert_eq!(
            resolve(&deps, &link.token).await.unwrap().as_ref(),
            Some(link)
        );
    }
}

#[tokio::test]
async fn a_subscriptions_token_shows_its_trial() {
    let deps = deps_on(crate::testenv::memory_store());
    let tenant = Tenant::new("proj_trial", Mode::Sandbox);
    // 2024-07-30 is BS 2081-04-15 (Shrawan 15); 06:00 UTC is that Nepal day.
    let sub = subscription(&deps, "proj_trial", Some("2024-07-30T06:00:00Z")).await;
    let link = ensure(&deps, &tenant, &ShortTarget::Subscription(sub.id.clone()))
        .await
        .unwrap();
    let Some(Landing::Trial(view)) = landing(&deps, &link.token).await.unwrap() else {
        panic!("a trial page")
    };
    assert_eq!(view.plan, sub.terms.description);
    assert_eq!(view.amount, sub.terms.amount);
    assert!(view.sandbox);
    assert!(!view.ended);
    assert_eq!(view.trial_ends_on, NaiveDate::from_ymd_opt(2024, 7, 30));
    let bs = view.trial_ends_bs.unwrap_or_default();
    assert!(bs.contains("2081") && bs.contains("15"), "{bs}");
}
