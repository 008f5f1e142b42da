use super::manage::{insert, invalid};
use super::page::typed;
use super::*;
use crate::domain::{Tenant, Window};
use crate::fields::Phone;
use crate::store::Update;
use crate::store::fence::Fence;
use serde_json::json;

fn now() -> Timestamp {
    Timestamp::parse("2026-11-22T10:00:00Z").unwrap()
}

/// A create request, parsed as the API parses it: a field's rule
/// ([`crate::fields`]) is kept or the error names the field's path.
fn create(v: Value) -> Result<PaymentLink, LinkError> {
    let req: CreateLink = serde_path_to_error::deserialize(v)
        .map_err(|e| invalid(&e.path().to_string(), e.inner().to_string()))?;
    new_link(&Tenant::new("proj_1", Mode::Sandbox), req, now())
}

fn field(r: Result<PaymentLink, LinkError>) -> String {
    match r {
        Err(LinkError::Invalid { field, .. }) => field,
        other => panic!("{other:?}"),
    }
}

#[test]
fn links_are_fixed_or_bounded_and_checked() {
    let fixed = create(json!({"title": "Momo box", "amount": 50000})).unwrap();
    assert_eq!(fixed.amount.map(Paisa::get), Some(50000));
    assert_eq!((fixed.min_amount, fixed.max_amount), (None, None));
    let open = create(json!({"title": "Donate", "minAmount": 10000, "maxAmount": 500000})).unwrap();
    assert_eq!(
        (open.amount, open.min_amount, open.max_amount),
        (None, Some(10000), Some(500000))
    );
    let defaults = create(json!({"title": "Tip jar"})).unwrap();
    assert_eq!(defaults.min_amount, Some(DEFAULT_MIN_AMOUNT));
    assert_eq!(field(create(json!({"title": ""}))), "title");
    assert_eq!(field(create(json!({"title": "x".repeat(101)}))), "title");
    assert_eq!(field(create(json!({"title": "a", "amount": 0}))), "amount");
    assert_eq!(
        field(create(json!({"title": "a", "amount": 5, "minAmount": 1}))),
        "amount"
    );
    assert_eq!(
        field(create(
            json!({"title": "a", "minAmount": 5000, "maxAmount": 10})
        )),
        "minAmount"
    );
    assert_eq!(
        field(create(
            json!({"title": "a", "amount": 500, "provider": "khalti"})
        )),
        "amount"
    );
    assert_eq!(
        field(create(json!({"title": "a", "maxUses": 0}))),
        "maxUses"
    );
    assert_eq!(
        field(create(
            json!({"title": "a", "expiresAt": "2026-11-22T09:00:00Z"})
        )),
        "expiresAt"
    );
    assert_eq!(
        field(create(json!({"title": "a", "expiresAt": "tomorrow"}))),
        "expiresAt"
    );
    assert_eq!(
        field(create(
            json!({"title": "a", "redirectUrl": "http://shop.example/x"})
        )),
        "redirectUrl"
    );
    assert_eq!(
        field(create(
            json!({"title": "a", "inactiveMessage": "x".repeat(301)})
        )),
        "inactiveMessage"
    );
    assert_eq!(
        field(create(
            json!({"title": "a", "referenceId": "x".repeat(101)})
        )),
        "referenceId"
    );
    assert_eq!(
        field(create(
            json!({"title": "a", "description": "x".repeat(501)})
        )),
        "description"
    );
    assert_eq!(field(create(json!({"title": "a", "bogus": 1}))), "bogus");
}

/// What a customer types is held to the rule; a link's own pre-fill
/// that breaks today's rule (stored before it) is left out instead of
/// refusing every customer.
#[test]
fn typed_details_are_checked_and_stale_prefills_dropped() {
    let stale = "call me".to_owned();
    let good = "9800000001".to_owned();
    assert!(matches!(
        typed::<Phone>("customerPhone", Some("call me".into()), Some(&good)),
        Err(OpenError::Invalid { ref field, .. }) if field == "customerPhone"
    ));
    assert_eq!(
        typed::<Phone>("customerPhone", None, Some(&stale)).ok(),
        Some(None)
    );
    assert_eq!(
        typed::<Phone>("customerPhone", None, Some(&good)).ok(),
        Some(Some(good.clone()))
    );
    assert_eq!(
        typed::<Phone>("customerPhone", Some("  ".into()), Some(&good)).ok(),
        Some(None),
        "a blank field clears the pre-fill"
    );
}

#[test]
fn usability_and_stats() {
    let mut l = create(json!({"title": "a", "amount": 1000, "maxUses": 2})).unwrap();
    assert_eq!(l.unusable(now()), None);
    l.used_count = 2;
    assert_eq!(l.unusable(now()), Some("used up"));
    l.used_count = 1;
    l.expires_at = Some(now());
    assert_eq!(l.unusable(now()), Some("expired"));
    l.active = false;
    assert_eq!(l.unusable(now()), Some("inactive"));
    l.views = 4;
    let v =
        serde_json::to_value(PaymentLinkView::of(l.clone(), "https://pay.example", true)).unwrap();
    assert_eq!(
        v["stats"],
        json!({"views": 4, "used_count": 1, "conversion_rate": 0.25})
    );
    assert_eq!(v["url"], format!("https://pay.example/l/{}", l.id).as_str());
    let no_stats =
        serde_json::to_value(PaymentLinkView::of(l, "https://pay.example", false)).unwrap();
    assert!(no_stats.get("stats").is_none());
}

#[tokio::test]
async fn a_fenced_create_that_committed_answers_its_first_link() {
    let deps = crate::AppState::for_tests();
    let fence = Fence::new(Key::new("IDEMFENCE#test", "FENCE"), 0);
    let first = create(json!({"title": "Once", "amount": 1000})).unwrap();
    let stored = insert_once(&deps, &first, Some(&fence), Vec::new())
        .await
        .unwrap();
    assert_eq!(stored.id, first.id);
    // The retry built another link; the fence answers the first.
    let second = create(json!({"title": "Once", "amount": 1000})).unwrap();
    let again = insert_once(&deps, &second, Some(&fence), Vec::new())
        .await
        .unwrap();
    assert_eq!(again.id, first.id);
    assert!(get(&deps, &second.id).await.unwrap().is_none());
    let (_, total) = list(
        &deps,
        &Tenant::new("proj_1", Mode::Sandbox),
        None,
        Window::first(10),
    )
    .await
    .unwrap();
    assert_eq!(total, 1);
}

#[tokio::test]
async fn an_opened_session_is_counted_on_its_day() {
    let deps = crate::AppState::for_tests();
    let store = &*deps.store;
    let l = create(json!({"title": "Momo box", "amount": 50000})).unwrap();
    insert(store, &l).await.unwrap();
    for _ in 0..2 {
        open_session(
            &deps,
            &l.id,
            LinkCustomer::default(),
            "https://pay.example",
            now(),
        )
        .await
        .unwrap();
    }
    let counted = crate::domain::analytics::day_totals(
        store,
        &crate::domain::Tenant::new("proj_1", Mode::Sandbox),
        now(),
    )
    .await
    .unwrap();
    assert_eq!(counted.get("sessions_created"), Some(&2));
}

#[tokio::test]
async fn patch_cancel_and_delete_follow_the_rules() {
    let deps = crate::AppState::for_tests();
    let store = &*deps.store;
    let l = create(json!({"title": "Box", "amount": 1000, "description": "d"})).unwrap();
    insert(store, &l).await.unwrap();
    let p: PatchLink =
        serde_json::from_value(json!({"title": "Big box", "description": "", "maxUses": 3}))
            .unwrap();
    let after = patch(
        &deps,
        &Tenant::new("proj_1", Mode::Sandbox),
        &l.id,
        p,
        now(),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        (
            after.title.as_str(),
            after.description.clone(),
            after.max_uses
        ),
        ("Big box", None, Some(3))
    );
    assert_eq!(after.amount, l.amount, "keys not sent stay");
    // maxUses null: unlimited again.
    let p: PatchLink = serde_json::from_value(json!({"maxUses": null})).unwrap();
    let after = patch(
        &deps,
        &Tenant::new("proj_1", Mode::Sandbox),
        &l.id,
        p,
        now(),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(after.max_uses, None);
    // Pre-fills: set one address part, keep the others; "" clears.
    let p: PatchLink = serde_json::from_value(json!({
        "customerName": "Sita", "customerEmail": "sita@example.com",
        "customerPhone": "9800000001", "customerCity": "Pokhara", "customerLine1": "Lakeside 4"
    }))
    .unwrap();
    let after = patch(
        &deps,
        &Tenant::new("proj_1", Mode::Sandbox),
        &l.id,
        p,
        now(),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(after.customer_name.as_deref(), Some("Sita"));
    assert_eq!(after.customer_email.as_deref(), Some("sita@example.com"));
    assert_eq!(after.customer_phone.as_deref(), Some("9800000001"));
    let a = after.customer_address.clone().unwrap_or_default();
    assert_eq!(
        (a.line1.as_deref(), a.city.as_deref()),
        (Some("Lakeside 4"), Some("Pokhara"))
    );
    let p: PatchLink =
        serde_json::from_value(json!({"customerCity": "", "customerEmail": ""})).unwrap();
    let after = patch(
        &deps,
        &Tenant::new("proj_1", Mode::Sandbox),
        &l.id,
        p,
        now(),
        Vec::new(),
    )
    .await
    .unwrap();
    let a = after.customer_address.clone().unwrap_or_default();
    assert_eq!((a.line1.as_deref(), a.city), (Some("Lakeside 4"), None));
    assert_eq!(after.customer_email, None);
    let p: Result<PatchLink, _> =
        serde_path_to_error::deserialize(json!({"customerEmail": "not-an-email"}));
    assert_eq!(
        p.err().map(|e| e.path().to_string()).as_deref(),
        Some("customerEmail")
    );
    // Keys the contract does not type as nullable refuse null.
    for key in [
        "title",
        "description",
        "active",
        "inactiveMessage",
        "referenceId",
        "collectAddress",
        "customerName",
        "customerEmail",
        "customerPhone",
        "customerLine1",
        "customerLine2",
        "customerCity",
        "customerState",
        "customerPostalCode",
        "customerCountry",
    ] {
        let p: PatchLink = serde_json::from_value(json!({ key: null })).unwrap();
        assert!(
            matches!(patch(&deps, &Tenant::new("proj_1", Mode::Sandbox), &l.id, p, now(), Vec::new()).await,
                    Err(LinkError::Invalid { ref field, .. }) if field == key),
            "{key}"
        );
    }
    // Two uses, then maxUses below them is refused.
    store
        .update(
            &PaymentLink::key(&l.id),
            Update::new().add("used_count", 2),
            None,
        )
        .await
        .unwrap();
    let p: PatchLink = serde_json::from_value(json!({"maxUses": 1})).unwrap();
    assert!(matches!(
        patch(&deps, &Tenant::new("proj_1", Mode::Sandbox), &l.id, p, now(), Vec::new()).await,
        Err(LinkError::Invalid { field, .. }) if field == "maxUses"
    ));
    assert!(matches!(
        delete(&deps, &Tenant::new("proj_1", Mode::Sandbox), &l.id).await,
        Err(LinkError::Used)
    ));
    assert!(
        cancel(
            &deps,
            &Tenant::new("proj_1", Mode::Sandbox),
            &l.id,
            now(),
            Vec::new()
        )
        .await
        .is_ok()
    );
    assert!(matches!(
        cancel(
            &deps,
            &Tenant::new("proj_1", Mode::Sandbox),
            &l.id,
            now(),
            Vec::new()
        )
        .await,
        Err(LinkError::Inactive)
    ));
    // Another project sees nothing.
    assert!(matches!(
        cancel(
            &deps,
            &Tenant::new("proj_2", Mode::Sandbox),
            &l.id,
            now(),
            Vec::new()
        )
        .await,
        Err(LinkError::NotFound(_))
    ));
    let unused = create(json!({"title": "Unused"})).unwrap();
    insert(store, &unused).await.unwrap();
    assert_eq!(
        delete(&deps, &Tenant::new("proj_1", Mode::Sandbox), &unused.id)
            .await
            .unwrap(),
        unused.id
    );
    assert!(get(&deps, &unused.id).await.unwrap().is_none());
    let (active, total) = list(
        &deps,
        &Tenant::new("proj_1", Mode::Sandbox),
        Some(true),
        Window::first(10),
    )
    .await
    .unwrap();
    assert_eq!((active.len(), total), (0, 0));
    let (all, total) = list(
        &deps,
        &Tenant::new("proj_1", Mode::Sandbox),
        None,
        Window::first(10),
    )
    .await
    .unwrap();
    assert_eq!((all.len(), total), (1, 1));
}

#[test]
fn checkout_counts_a_links_claimed_uses_in_the_links_own_field() {
    assert_eq!(
        super::PaymentLink::CLAIMED.name(),
        crate::domain::checkout::LinkUses::CLAIMED.name()
    );
}
