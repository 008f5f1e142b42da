use std::sync::Arc;

use super::*;
use crate::app::AppState;
use crate::store::Store;
use crate::store::embedded::EmbeddedStore;
use crate::testenv::at;
use crate::time::ManualClock;

fn state() -> (AppState, Arc<ManualClock>) {
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}")));
    let clock = Arc::new(ManualClock::new(at("2026-11-28T10:00:00Z")));
    let state = AppState::new(
        store,
        clock.clone(),
        crate::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    (state, clock)
}

fn tenant(p: &str) -> Tenant {
    Tenant::new(ProjectId::stored(p), Mode::Live)
}

const FIFTY_S: chrono::Duration = chrono::Duration::seconds(50);

#[tokio::test]
async fn a_project_holds_at_most_its_cap_and_others_are_not_touched() {
    let (state, _) = state();
    let a = tenant("proj_a");
    let mut held = Vec::new();
    for n in 0..3 {
        let h = take(&state, &a, 3, FIFTY_S).await;
        let h = h.unwrap_or_else(|e| panic!("{n}: {e}"));
        held.push(h.unwrap_or_else(|| panic!("slot {n} of 3 refused")));
    }
    let mut slots: Vec<u32> = held.iter().map(|h| h.slot).collect();
    slots.sort_unstable();
    assert_eq!(slots, vec![0, 1, 2]);
    assert_eq!(take(&state, &a, 3, FIFTY_S).await, Ok(None), "the 4th");
    // Another project, and the same project's other mode, have their own.
    let b = tenant("proj_b");
    assert!(matches!(take(&state, &b, 3, FIFTY_S).await, Ok(Some(_))));
    let sandbox = Tenant::new(ProjectId::stored("proj_a"), Mode::Sandbox);
    assert!(matches!(
        take(&state, &sandbox, 3, FIFTY_S).await,
        Ok(Some(_))
    ));
    assert_eq!(held_now(&state, &a).await, 3);
    // A stream that ends gives its slot back; another takes it.
    give_back(&state, &held[1])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(held_now(&state, &a).await, 2);
    let again = take(&state, &a, 3, FIFTY_S).await;
    assert_eq!(again.map(|h| h.map(|h| h.slot)), Ok(Some(held[1].slot)));
}

async fn held_now(state: &AppState, t: &Tenant) -> usize {
    held(state, t).await.unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn a_crashed_stream_leaks_nothing_and_a_stale_holder_frees_nothing() {
    let (state, clock) = state();
    let a = tenant("proj_a");
    let first = take(&state, &a, 1, FIFTY_S).await;
    let first = first.unwrap_or_else(|e| panic!("{e}"));
    let first = first.unwrap_or_else(|| panic!("the one slot"));
    assert_eq!(take(&state, &a, 1, FIFTY_S).await, Ok(None));
    // Never given back (the instance froze): free once its time is over.
    clock.advance(FIFTY_S + GRACE - chrono::Duration::milliseconds(1));
    assert_eq!(take(&state, &a, 1, FIFTY_S).await, Ok(None));
    clock.advance(chrono::Duration::milliseconds(1));
    let second = take(&state, &a, 1, FIFTY_S).await;
    let second = second.unwrap_or_else(|e| panic!("{e}"));
    assert!(second.is_some(), "an expired lease is free");
    // The old holder waking up gives back nothing it no longer holds.
    give_back(&state, &first)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(held_now(&state, &a).await, 1);
    assert_eq!(take(&state, &a, 1, FIFTY_S).await, Ok(None));
}

#[tokio::test]
async fn concurrent_streams_never_share_a_slot_nor_pass_the_cap() {
    let (state, _) = state();
    let a = tenant("proj_a");
    let tries = (0..40).map(|_| {
        let state = state.clone();
        let a = a.clone();
        tokio::spawn(async move { take(&state, &a, 5, FIFTY_S).await })
    });
    let mut slots = Vec::new();
    for t in tries {
        let r = t.await.unwrap_or_else(|e| panic!("{e}"));
        if let Some(h) = r.unwrap_or_else(|e| panic!("{e}")) {
            slots.push(h.slot);
        }
    }
    slots.sort_unstable();
    let before = slots.len();
    slots.dedup();
    assert_eq!(slots.len(), before, "a slot given twice: {slots:?}");
    assert!(slots.len() <= 5, "{slots:?}");
    assert!(!slots.is_empty());
    assert_eq!(held_now(&state, &a).await, slots.len());
}

#[tokio::test]
async fn a_lowered_cap_counts_only_its_own_slots() {
    let (state, _) = state();
    let a = tenant("proj_a");
    for _ in 0..4 {
        assert!(matches!(take(&state, &a, 4, FIFTY_S).await, Ok(Some(_))));
    }
    // The cap went down to 2 while four streams are open: none is taken
    // until slots 0 and 1 are free.
    assert_eq!(take(&state, &a, 2, FIFTY_S).await, Ok(None));
}
