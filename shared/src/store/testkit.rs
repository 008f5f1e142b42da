//! The conformance suite every [`Store`] backend passes, unchanged.
//!
//! Each case is a `pub async fn case(store: Arc<dyn Store>)` that panics on
//! failure. [`store_conformance_tests!`](crate::store_conformance_tests)
//! expands to one `#[tokio::test]` per case (the calling crate needs `tokio`
//! with the `macros` and `rt-multi-thread` features):
//!
//! ```ignore
//! async fn make() -> Arc<dyn Store> { Arc::new(EmbeddedStore::in_memory().unwrap()) }
//! shared::store_conformance_tests!(make);
//! ```
//!
//! Written for a DynamoDB table too:
//! - cases may share one table, so each uses partition keys (table and
//!   index) made unique with a ULID and never looks outside them;
//! - index (GSI) reads are eventually consistent on DynamoDB, so assertions
//!   on `gsi1`/`gsi2` queries and counts retry for a few seconds
//!   ([`eventually`]); `get` and table queries are expected to be strongly
//!   consistent (a DynamoDB backend sets `ConsistentRead` on table queries);
//! - a query page that reaches the limit exactly on the partition's last item
//!   may or may not carry `last_key` (DynamoDB does); both are accepted;
//! - [`StoreError::Unavailable`] (throttling) and [`TxReason::Conflict`] are
//!   retried in the concurrency cases, never counted as outcomes.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Barrier;
use ulid::Ulid;

use super::{
    CmpOp, Cond, Index, Item, Key, MAX_TX_OPS, PK, Query, QueryPage, SK, Seek, SkCond, Store,
    StoreError, TxOp, TxReason, Update, query_window, seek_window,
};

/// Expands to one `#[tokio::test]` per conformance case; `$make` is an async
/// fn (or closure returning a future) yielding a fresh `Arc<dyn Store>`.
///
/// `store_conformance_tests!(@optional make)` is the same suite for a
/// backend that may be unavailable: `make` yields
/// `Option<Arc<dyn Store>>`, and a case whose `make` yields `None` returns
/// at once (the maker says why, or panics when the backend is required).
#[macro_export]
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::store_conformance_tests!(@list @cases $make;);
    };
    (@optional $make:expr) => {
        $crate::store_conformance_tests!(@list @optional_cases $make;);
    };
    (@list $($head:tt)+) => {
        $crate::store_conformance_tests!($($head)+
            put_get_roundtrip,
            get_stored_decodes_as_get_reads,
            put_replaces_whole_item,
            put_rejects_invalid_items,
            put_if_not_exists,
            put_if_exists,
            condition_comparisons,
            condition_logic,
            update_set_add_remove,
            update_add_missing_starts_at_zero,
            update_upserts_missing_item,
            update_failed_condition_changes_nothing,
            update_rejects_invalid_requests,
            delete_with_and_without_condition,
            transact_all_or_nothing,
            transact_rejects_invalid_requests,
            query_forward_and_backward,
            query_sort_key_conditions,
            query_paging_forward,
            query_paging_backward,
            query_filter_applies_after_limit,
            query_rejects_invalid_requests,
            query_gsi1,
            query_gsi2_and_index_maintenance,
            query_list_indexes,
            query_index_paging_with_ties,
            count_with_sort_key_and_filter,
            window_offset_and_limit,
            window_seeks_by_sort_key,
            race_conditional_put,
            race_reservations,
            race_optimistic_transactions,
            race_counter_allocation,
        );
    };
    (@cases $make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let store: ::std::sync::Arc<dyn $crate::store::Store> = ($make)().await;
                $crate::store::testkit::$case(store).await;
            }
        )+
    };
    (@optional_cases $make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let store: ::std::option::Option<::std::sync::Arc<dyn $crate::store::Store>> =
                    ($make)().await;
                if let ::std::option::Option::Some(store) = store {
                    $crate::store::testkit::$case(store).await;
                }
            }
        )+
    };
}

// ---------------------------------------------------------------- helpers

/// A partition key no other case (or run) uses.
pub fn unique(tag: &str) -> String {
    format!("conformance#{tag}#{}", Ulid::new())
}

/// A JSON object literal as an [`Item`] (panics on anything else).
pub fn obj(value: Value) -> Item {
    match value {
        Value::Object(map) => map,
        other => panic!("not a JSON object: {other}"),
    }
}

/// An item at `(pk, sk)` with the attributes of `rest` (an object).
pub fn item(pk: &str, sk: &str, rest: Value) -> Item {
    let mut item = obj(rest);
    item.insert(PK.into(), Value::from(pk));
    item.insert(SK.into(), Value::from(sk));
    item
}

fn key_of(item: &Item) -> Key {
    Key::of(item).expect("test item has a key")
}

fn sk_of(item: &Item) -> String {
    item.get(SK)
        .and_then(Value::as_str)
        .expect("item has a string sk")
        .to_owned()
}

fn sks(items: &[Item]) -> Vec<String> {
    items.iter().map(sk_of).collect()
}

/// Retries `check` until it returns `Ok` or 15 seconds pass (then panics
/// with the last message): for reads of eventually consistent indexes.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut pause = Duration::from_millis(50);
    loop {
        match check().await {
            Ok(value) => return value,
            Err(message) if Instant::now() >= deadline => panic!("{what}: {message}"),
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Runs `op` again while it reports [`StoreError::Unavailable`].
async fn retry_unavailable<T, F, Fut>(mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut pause = Duration::from_millis(10);
    for _ in 0..50 {
        match op().await {
            Err(StoreError::Unavailable(_)) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
    op().await
}

async fn put_all(store: &dyn Store, items: &[Item]) {
    for it in items {
        store.put(it.clone(), None).await.expect("put");
    }
}

async fn get(store: &dyn Store, pk: &str, sk: &str) -> Option<Item> {
    store.get(&Key::new(pk, sk)).await.expect("get")
}

async fn query(store: &dyn Store, q: &Query) -> QueryPage {
    store
        .query(q)
        .await
        .unwrap_or_else(|e| panic!("query {q:?}: {e}"))
}

/// Every page of `q` (limit kept), asserting each page's shape; returns the
/// items in order and the number of pages.
async fn all_pages(store: &dyn Store, q: &Query) -> (Vec<Item>, usize) {
    let mut q = q.clone();
    let mut items = Vec::new();
    for pages in 1..=1000 {
        let page = query(store, &q).await;
        if let Some(limit) = q.limit {
            assert!(page.items.len() <= limit, "page longer than the limit");
            if q.filter.is_none() && page.last_key.is_some() {
                assert_eq!(
                    page.items.len(),
                    limit,
                    "short page with last_key, no filter"
                );
            }
        }
        items.extend(page.items);
        match page.last_key {
            Some(last) => {
                assert_key_attrs(&last, q.index);
                q.start_after = Some(last);
            }
            None => return (items, pages),
        }
    }
    panic!("query never finished paging: {q:?}");
}

/// `last_key` holds exactly the key attributes of the table (and index).
fn assert_key_attrs(last: &Item, index: Option<Index>) {
    let mut expected = BTreeSet::from([PK, SK]);
    if let Some(index) = index {
        expected.insert(index.pk_attr());
        expected.insert(index.sk_attr());
    }
    let actual: BTreeSet<&str> = last.keys().map(String::as_str).collect();
    assert_eq!(actual, expected, "last_key attributes");
    assert!(
        last.values().all(Value::is_string),
        "last_key values are strings"
    );
}

/// Whether `cond` holds on the item at `key`, through a transaction `Check`.
async fn holds(store: &dyn Store, key: &Key, cond: Cond) -> bool {
    let res = store
        .transact(vec![TxOp::Check {
            key: key.clone(),
            cond: cond.clone(),
        }])
        .await;
    match res {
        Ok(()) => true,
        Err(StoreError::TransactionCanceled { reasons }) => {
            assert_eq!(reasons, vec![TxReason::ConditionFailed], "{cond:?}");
            false
        }
        Err(e) => panic!("check {cond:?}: {e}"),
    }
}

/// Whether `cond` holds on the (existing) item at `key`, through a
/// conditional update of an attribute no condition looks at.
async fn holds_on_write(store: &dyn Store, key: &Key, cond: Cond) -> bool {
    let res = store
        .update(key, Update::new().set("probe", 1), Some(cond.clone()))
        .await;
    match res {
        Ok(_) => true,
        Err(StoreError::ConditionFailed) => false,
        Err(e) => panic!("update if {cond:?}: {e}"),
    }
}

fn assert_invalid<T: std::fmt::Debug>(res: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(res, Err(StoreError::Invalid(_))),
        "{what}: expected Invalid, got {res:?}"
    );
}

fn assert_condition_failed<T: std::fmt::Debug>(res: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(res, Err(StoreError::ConditionFailed)),
        "{what}: expected ConditionFailed, got {res:?}"
    );
}

// ------------------------------------------------------------ single items

pub async fn put_get_roundtrip(store: Arc<dyn Store>) {
    let pk = unique("roundtrip");
    let it = item(
        &pk,
        "a",
        json!({
            "int": 42, "neg": -7, "zero": 0, "float": 1.25, "big": u64::MAX, "min": i64::MIN,
            "s": "héllo 😀 \"quoted\"", "empty": "", "yes": true, "no": false, "nul": null,
            "list": [1, "two", {"three": 3}, [], null],
            "map": {"x": {"y": [true, 2.5]}, "empty": {}},
            "ttl": 1_900_000_000,
        }),
    );
    store.put(it.clone(), None).await.expect("put");
    assert_eq!(get(&*store, &pk, "a").await, Some(it));
    assert_eq!(get(&*store, &pk, "b").await, None, "other sort key");
    assert_eq!(get(&*store, &unique("roundtrip"), "a").await, None);
}

/// `get_stored` reads the item `get` reads, and a record decoded from it
/// is the one decoded from `get`'s item; a missing item or an invalid key
/// answers as `get` does.
pub async fn get_stored_decodes_as_get_reads(store: Arc<dyn Store>) {
    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Record {
        pk: String,
        int: i64,
        big: u64,
        float: f64,
        s: String,
        nul: Option<String>,
        list: Vec<Value>,
        #[serde(default)]
        absent: Option<u32>,
    }
    let pk = unique("stored");
    let it = item(
        &pk,
        "a",
        json!({
            "int": -42, "big": u64::MAX, "float": 1.25, "s": "héllo 😀 \"q\"", "nul": null,
            "list": [1, "two", {"three": 3}], "extra": {"ignored": true},
        }),
    );
    store.put(it.clone(), None).await.expect("put");
    let key = Key::new(&pk, "a");
    let read = || async {
        match store.get_stored(&key).await.expect("get_stored") {
            Some(stored) => stored,
            None => panic!("get_stored found nothing where get finds the item"),
        }
    };
    assert_eq!(
        read().await.decode::<Value>().expect("decode"),
        Value::Object(it.clone())
    );
    let via_item: Record = serde_json::from_value(Value::Object(it)).expect("from the item");
    assert_eq!(read().await.decode::<Record>().expect("decode"), via_item);
    assert_eq!(via_item.s, "héllo 😀 \"q\"");
    assert_eq!(store.get_stored(&Key::new(&pk, "b")).await, Ok(None));
    let invalid = Key::new("", "a");
    assert_eq!(
        store.get_stored(&invalid).await.map(|_| ()),
        store.get(&invalid).await.map(|_| ()),
    );
}

pub async fn put_replaces_whole_item(store: Arc<dyn Store>) {
    let pk = unique("replace");
    store
        .put(item(&pk, "a", json!({"x": 1, "y": 2})), None)
        .await
        .expect("put");
    let second = item(&pk, "a", json!({"z": 3}));
    store.put(second.clone(), None).await.expect("put again");
    assert_eq!(get(&*store, &pk, "a").await, Some(second));
}

pub async fn put_rejects_invalid_items(store: Arc<dyn Store>) {
    let pk = unique("invalid");
    let cases = [
        ("missing pk", obj(json!({"sk": "a"}))),
        ("missing sk", obj(json!({"pk": pk}))),
        ("numeric sk", obj(json!({"pk": pk, "sk": 1}))),
        ("null pk", obj(json!({"pk": null, "sk": "a"}))),
        ("empty pk", obj(json!({"pk": "", "sk": "a"}))),
        ("empty sk", obj(json!({"pk": pk, "sk": ""}))),
        (
            "numeric index key",
            item(&pk, "g", json!({"gsi1pk": 5, "gsi1sk": "x"})),
        ),
        (
            "empty index key",
            item(&pk, "g", json!({"gsi2pk": "x", "gsi2sk": ""})),
        ),
    ];
    for (what, it) in cases {
        assert_invalid(store.put(it, None).await, what);
    }
    assert_eq!(get(&*store, &pk, "g").await, None);
    assert_invalid(store.get(&Key::new("", "a")).await, "get with an empty pk");
}

pub async fn put_if_not_exists(store: Arc<dyn Store>) {
    let pk = unique("not-exists");
    let first = item(&pk, "a", json!({"v": 1}));
    store
        .put(first.clone(), Some(Cond::NotExists))
        .await
        .expect("first put");
    let res = store
        .put(item(&pk, "a", json!({"v": 2})), Some(Cond::NotExists))
        .await;
    assert_condition_failed(res, "second put if not exists");
    assert_eq!(get(&*store, &pk, "a").await, Some(first));
}

pub async fn put_if_exists(store: Arc<dyn Store>) {
    let pk = unique("exists");
    let res = store
        .put(item(&pk, "a", json!({"v": 1})), Some(Cond::Exists))
        .await;
    assert_condition_failed(res, "put if exists on a missing item");
    assert_eq!(get(&*store, &pk, "a").await, None);

    store
        .put(item(&pk, "a", json!({"v": 1})), None)
        .await
        .expect("put");
    let second = item(&pk, "a", json!({"v": 2}));
    store
        .put(second.clone(), Some(Cond::Exists))
        .await
        .expect("put if exists");
    assert_eq!(get(&*store, &pk, "a").await, Some(second.clone()));

    let res = store
        .put(item(&pk, "a", json!({"v": 3})), Some(Cond::eq("v", 1)))
        .await;
    assert_condition_failed(res, "put if v == 1");
    store
        .put(item(&pk, "a", json!({"v": 3})), Some(Cond::eq("v", 2)))
        .await
        .expect("put if v == 2");
    assert_eq!(
        get(&*store, &pk, "a")
            .await
            .and_then(|i| i.get("v").cloned()),
        Some(json!(3))
    );
}

/// Comparisons and the answer each must give on an item holding numbers,
/// strings, a boolean, an object and an array.
fn comparison_cases() -> Vec<(&'static str, CmpOp, Value, bool)> {
    use CmpOp::{Eq, Ge, Gt, Le, Lt, Ne};
    vec![
        // equality, numbers numerically
        ("n", Eq, json!(10), true),
        ("n", Eq, json!(11), false),
        ("n", Ne, json!(11), true),
        ("n", Ne, json!(10), false),
        ("big", Eq, json!(u64::MAX), true),
        ("f", Eq, json!(2.5), true),
        ("s", Eq, json!("m"), true),
        ("s", Eq, json!("M"), false),
        ("b", Eq, json!(true), true),
        ("b", Ne, json!(false), true),
        ("obj", Eq, json!({"y": [1, "z"], "x": 1}), true),
        ("obj", Eq, json!({"x": 1}), false),
        ("arr", Eq, json!([1, "a"]), true),
        ("arr", Eq, json!(["a", 1]), false),
        // equality across types
        ("s", Eq, json!(10), false),
        ("n", Eq, json!("10"), false),
        ("s", Ne, json!(10), true),
        // ordering numbers
        ("n", Lt, json!(11), true),
        ("n", Lt, json!(10), false),
        ("n", Le, json!(10), true),
        ("n", Le, json!(9), false),
        ("n", Gt, json!(9), true),
        ("n", Gt, json!(10), false),
        ("n", Ge, json!(10), true),
        ("n", Ge, json!(10.5), false),
        ("n", Lt, json!(10.5), true),
        ("f", Gt, json!(2), true),
        ("f", Lt, json!(2.5), false),
        ("f", Le, json!(2.5), true),
        ("neg", Lt, json!(0), true),
        ("neg", Gt, json!(-3.5), true),
        ("big", Gt, json!(i64::MAX), true),
        // ordering strings by UTF-8 bytes
        ("s", Lt, json!("n"), true),
        ("s", Gt, json!("l"), true),
        ("s", Ge, json!("m"), true),
        ("s", Le, json!("m"), true),
        ("s", Gt, json!("M"), true),
        ("s", Lt, json!("ma"), true),
        ("s", Lt, json!("é"), true),
        ("hi", Lt, json!("😀"), true),
        ("hi", Gt, json!("😀"), false),
        // ordering across types is false
        ("n", Lt, json!("z"), false),
        ("n", Gt, json!("a"), false),
        ("s", Lt, json!(100), false),
        ("s", Ge, json!(0), false),
        ("b", Gt, json!(0), false),
        ("obj", Lt, json!(1), false),
        ("arr", Ge, json!("a"), false),
    ]
}

pub async fn condition_comparisons(store: Arc<dyn Store>) {
    let pk = unique("cmp");
    let key = Key::new(&pk, "a");
    store
        .put(
            item(
                &pk,
                "a",
                json!({
                    "n": 10, "f": 2.5, "neg": -3, "big": u64::MAX,
                    "s": "m", "hi": "\u{FFFD}", "b": true,
                    "obj": {"x": 1, "y": [1, "z"]}, "arr": [1, "a"],
                }),
            ),
            None,
        )
        .await
        .expect("put");
    use CmpOp::{Eq, Ge, Gt, Le, Lt, Ne};
    for (attr, op, value, expected) in comparison_cases() {
        let cond = Cond::Cmp(attr.into(), op, value);
        assert_eq!(
            holds(&*store, &key, cond.clone()).await,
            expected,
            "{cond:?}"
        );
        assert_eq!(
            holds_on_write(&*store, &key, cond.clone()).await,
            expected,
            "on write: {cond:?}"
        );
    }
    // A missing attribute fails every comparison but `Ne`, which holds
    // (DynamoDB: `a <> :v` is true when `a` is absent).
    for op in [Eq, Lt, Le, Gt, Ge] {
        let cond = Cond::Cmp("absent".into(), op, json!(1));
        assert!(!holds(&*store, &key, cond.clone()).await, "{cond:?}");
        assert!(
            !holds_on_write(&*store, &key, cond.clone()).await,
            "{cond:?}"
        );
        let negated = Cond::Not(Box::new(cond));
        assert!(holds(&*store, &key, negated.clone()).await, "{negated:?}");
    }
    let absent_ne = Cond::Cmp("absent".into(), Ne, json!(1));
    assert!(holds(&*store, &key, absent_ne.clone()).await);
    assert!(holds_on_write(&*store, &key, absent_ne).await);
    // So does a missing item.
    let missing = Key::new(&pk, "missing");
    for op in [Eq, Lt, Ge] {
        let cond = Cond::Cmp("n".into(), op, json!(10));
        assert!(
            !holds(&*store, &missing, cond.clone()).await,
            "missing item {cond:?}"
        );
    }
    assert!(holds(&*store, &missing, Cond::Cmp("n".into(), Ne, json!(10))).await);
    // Ordering against a constant that is not a number or string is refused.
    let res = store
        .transact(vec![TxOp::Check {
            key: key.clone(),
            cond: Cond::lt("b", true),
        }])
        .await;
    assert_invalid(res, "ordering against a boolean");
}

pub async fn condition_logic(store: Arc<dyn Store>) {
    let pk = unique("logic");
    let key = Key::new(&pk, "a");
    let missing = Key::new(&pk, "missing");
    store
        .put(item(&pk, "a", json!({"n": 10, "nul": null})), None)
        .await
        .expect("put");
    let t = Cond::eq("n", 10);
    let f = Cond::eq("n", 11);
    let cases = vec![
        (Cond::Exists, true),
        (Cond::NotExists, false),
        (Cond::AttrExists("n".into()), true),
        (Cond::AttrExists("nul".into()), true),
        (Cond::AttrExists("absent".into()), false),
        (Cond::AttrNotExists("absent".into()), true),
        (Cond::AttrNotExists("n".into()), false),
        (Cond::And(vec![t.clone(), t.clone()]), true),
        (Cond::And(vec![t.clone(), f.clone()]), false),
        (Cond::Or(vec![f.clone(), t.clone()]), true),
        (Cond::Or(vec![f.clone(), f.clone()]), false),
        (Cond::Not(Box::new(f.clone())), true),
        (Cond::Not(Box::new(t.clone())), false),
        (
            Cond::And(vec![
                Cond::Exists,
                Cond::Or(vec![f.clone(), Cond::Not(Box::new(Cond::lt("n", 5)))]),
            ]),
            true,
        ),
        (
            Cond::Or(vec![
                Cond::And(vec![t.clone(), f.clone()]),
                Cond::Not(Box::new(Cond::AttrExists("n".into()))),
            ]),
            false,
        ),
    ];
    for (cond, expected) in cases {
        assert_eq!(
            holds(&*store, &key, cond.clone()).await,
            expected,
            "{cond:?}"
        );
        assert_eq!(
            holds_on_write(&*store, &key, cond.clone()).await,
            expected,
            "on write: {cond:?}"
        );
    }
    let on_missing = vec![
        (Cond::Exists, false),
        (Cond::NotExists, true),
        (Cond::AttrExists("n".into()), false),
        (Cond::AttrNotExists("n".into()), true),
        (Cond::Not(Box::new(Cond::eq("n", 10))), true),
        (Cond::Or(vec![Cond::NotExists, Cond::eq("n", 10)]), true),
    ];
    for (cond, expected) in on_missing {
        assert_eq!(
            holds(&*store, &missing, cond.clone()).await,
            expected,
            "missing item: {cond:?}"
        );
    }
    assert_eq!(
        get(&*store, &pk, "missing").await,
        None,
        "checks write nothing"
    );
}

pub async fn update_set_add_remove(store: Arc<dyn Store>) {
    let pk = unique("update");
    let key = Key::new(&pk, "a");
    store
        .put(
            item(&pk, "a", json!({"a": 1, "b": "x", "c": [1], "keep": true})),
            None,
        )
        .await
        .expect("put");
    let update = Update::new()
        .set("b", "y")
        .set("d", json!({"nested": [1, 2]}))
        .add("a", 5)
        .add("e", -3)
        .remove("c")
        .remove("absent");
    let expected = item(
        &pk,
        "a",
        json!({"a": 6, "b": "y", "d": {"nested": [1, 2]}, "e": -3, "keep": true}),
    );
    let returned = store.update(&key, update, None).await.expect("update");
    assert_eq!(returned, expected, "update returns the whole new item");
    assert_eq!(store.get(&key).await.expect("get"), Some(expected));
}

pub async fn update_add_missing_starts_at_zero(store: Arc<dyn Store>) {
    let pk = unique("add-zero");
    let key = Key::new(&pk, "a");
    store
        .put(item(&pk, "a", json!({"other": 1})), None)
        .await
        .expect("put");
    let returned = store
        .update(&key, Update::new().add("n", 7), None)
        .await
        .expect("add");
    assert_eq!(returned.get("n"), Some(&json!(7)));
    let returned = store
        .update(&key, Update::new().add("n", -10), None)
        .await
        .expect("add");
    assert_eq!(returned.get("n"), Some(&json!(-3)));
    assert_eq!(returned.get("other"), Some(&json!(1)));
}

pub async fn update_upserts_missing_item(store: Arc<dyn Store>) {
    let pk = unique("upsert");
    let key = Key::new(&pk, "a");
    let res = store
        .update(&key, Update::new().set("x", 1), Some(Cond::Exists))
        .await;
    assert_condition_failed(res, "update if exists on a missing item");
    assert_eq!(store.get(&key).await.expect("get"), None);

    let expected = item(&pk, "a", json!({"x": "one", "n": 2}));
    let returned = store
        .update(&key, Update::new().set("x", "one").add("n", 2), None)
        .await
        .expect("upsert");
    assert_eq!(returned, expected);
    assert_eq!(store.get(&key).await.expect("get"), Some(expected));

    let other = Key::new(&pk, "b");
    let returned = store
        .update(
            &other,
            Update::new().add("n", 1),
            Some(Cond::AttrNotExists("n".into())),
        )
        .await
        .expect("conditional upsert");
    assert_eq!(returned, item(&pk, "b", json!({"n": 1})));
}

pub async fn update_failed_condition_changes_nothing(store: Arc<dyn Store>) {
    let pk = unique("update-cond");
    let key = Key::new(&pk, "a");
    let original = item(
        &pk,
        "a",
        json!({"n": 1, "s": "x", "gsi1pk": format!("{pk}#g"), "gsi1sk": "1"}),
    );
    store.put(original.clone(), None).await.expect("put");
    let update = Update::new()
        .set("s", "y")
        .add("n", 1)
        .remove("gsi1pk")
        .add("m", 1);
    let res = store
        .update(&key, update.clone(), Some(Cond::eq("n", 5)))
        .await;
    assert_condition_failed(res, "update if n == 5");
    assert_eq!(store.get(&key).await.expect("get"), Some(original));
    let returned = store
        .update(&key, update, Some(Cond::eq("n", 1)))
        .await
        .expect("update if n == 1");
    assert_eq!(
        returned,
        item(&pk, "a", json!({"n": 2, "s": "y", "m": 1, "gsi1sk": "1"}))
    );
}

pub async fn update_rejects_invalid_requests(store: Arc<dyn Store>) {
    let pk = unique("update-invalid");
    let key = Key::new(&pk, "a");
    let original = item(&pk, "a", json!({"s": "text", "n": 1}));
    store.put(original.clone(), None).await.expect("put");
    let cases = [
        ("set pk", Update::new().set(PK, "other")),
        ("set sk to its own value", Update::new().set(SK, "a")),
        ("remove sk", Update::new().remove(SK)),
        ("add on a string", Update::new().add("s", 1)),
        ("one attribute twice", Update::new().set("n", 2).remove("n")),
        ("numeric index key", Update::new().set("gsi2pk", 7)),
    ];
    for (what, update) in cases {
        assert_invalid(store.update(&key, update, None).await, what);
    }
    assert_invalid(
        store
            .update(&Key::new(&pk, ""), Update::new().set("x", 1), None)
            .await,
        "empty sk",
    );
    assert_eq!(store.get(&key).await.expect("get"), Some(original));
}

pub async fn delete_with_and_without_condition(store: Arc<dyn Store>) {
    let pk = unique("delete");
    let key = Key::new(&pk, "a");
    store
        .delete(&key, None)
        .await
        .expect("deleting a missing item is fine");
    assert_condition_failed(
        store.delete(&key, Some(Cond::Exists)).await,
        "delete if exists on a missing item",
    );
    store
        .put(item(&pk, "a", json!({"v": 1})), None)
        .await
        .expect("put");
    assert_condition_failed(
        store.delete(&key, Some(Cond::eq("v", 2))).await,
        "delete if v == 2",
    );
    assert!(store.get(&key).await.expect("get").is_some());
    store
        .delete(&key, Some(Cond::eq("v", 1)))
        .await
        .expect("delete if v == 1");
    assert_eq!(store.get(&key).await.expect("get"), None);

    store
        .put(item(&pk, "b", json!({})), None)
        .await
        .expect("put");
    store
        .delete(&Key::new(&pk, "b"), None)
        .await
        .expect("delete");
    assert_eq!(get(&*store, &pk, "b").await, None);
}

// ------------------------------------------------------------ transactions

pub async fn transact_all_or_nothing(store: Arc<dyn Store>) {
    let pk = unique("tx");
    let (a, b, c, d) = (
        Key::new(&pk, "a"),
        Key::new(&pk, "b"),
        Key::new(&pk, "c"),
        Key::new(&pk, "d"),
    );
    put_all(
        &*store,
        &[
            item(&pk, "a", json!({"v": 1})),
            item(&pk, "c", json!({"v": 1})),
            item(&pk, "d", json!({"state": "open"})),
        ],
    )
    .await;
    let ops = |check_state: &str| {
        vec![
            TxOp::Put {
                item: item(&pk, "b", json!({"new": true})),
                cond: Some(Cond::NotExists),
            },
            TxOp::Update {
                key: a.clone(),
                update: Update::new().add("v", 1),
                cond: Some(Cond::eq("v", 1)),
            },
            TxOp::Delete {
                key: c.clone(),
                cond: Some(Cond::Exists),
            },
            TxOp::Check {
                key: d.clone(),
                cond: Cond::eq("state", check_state),
            },
        ]
    };

    // The check fails: nothing is written, and only the check is blamed.
    let res = store.transact(ops("closed")).await;
    let expected = vec![
        TxReason::None,
        TxReason::None,
        TxReason::None,
        TxReason::ConditionFailed,
    ];
    assert_eq!(
        res,
        Err(StoreError::TransactionCanceled { reasons: expected })
    );
    assert!(res.is_err_and(|e| e.is_condition_failure()));
    assert_eq!(store.get(&b).await.expect("get"), None);
    assert_eq!(
        store.get(&a).await.expect("get"),
        Some(item(&pk, "a", json!({"v": 1})))
    );
    assert!(store.get(&c).await.expect("get").is_some());

    // Everything holds: everything is written.
    store.transact(ops("open")).await.expect("transaction");
    assert_eq!(
        store.get(&b).await.expect("get"),
        Some(item(&pk, "b", json!({"new": true})))
    );
    assert_eq!(
        store.get(&a).await.expect("get"),
        Some(item(&pk, "a", json!({"v": 2})))
    );
    assert_eq!(store.get(&c).await.expect("get"), None);
    assert_eq!(
        store.get(&d).await.expect("get"),
        Some(item(&pk, "d", json!({"state": "open"}))),
        "a check writes nothing"
    );

    // Run again: the first three conditions fail, the check holds.
    let res = store.transact(ops("open")).await;
    let expected = vec![
        TxReason::ConditionFailed,
        TxReason::ConditionFailed,
        TxReason::ConditionFailed,
        TxReason::None,
    ];
    assert_eq!(
        res,
        Err(StoreError::TransactionCanceled { reasons: expected })
    );
    assert_eq!(
        store.get(&a).await.expect("get"),
        Some(item(&pk, "a", json!({"v": 2})))
    );

    // Upsert and unconditional ops inside a transaction.
    transact_upserts(&*store, &pk).await;
}

/// An upsert and unconditional ops inside a transaction: the update
/// creates its item, the delete of a missing item is no failure.
async fn transact_upserts(store: &dyn Store, pk: &str) {
    store
        .transact(vec![
            TxOp::Update {
                key: Key::new(pk, "e"),
                update: Update::new().add("n", 3),
                cond: None,
            },
            TxOp::Delete {
                key: Key::new(pk, "never"),
                cond: None,
            },
        ])
        .await
        .expect("transaction");
    assert_eq!(
        get(store, pk, "e").await,
        Some(item(pk, "e", json!({"n": 3})))
    );
}

pub async fn transact_rejects_invalid_requests(store: Arc<dyn Store>) {
    let pk = unique("tx-invalid");
    let put = |sk: String| TxOp::Put {
        item: item(&pk, &sk, json!({})),
        cond: None,
    };
    assert_invalid(store.transact(vec![]).await, "empty transaction");

    let twice = vec![
        put("a".into()),
        TxOp::Check {
            key: Key::new(&pk, "a"),
            cond: Cond::NotExists,
        },
    ];
    assert_invalid(store.transact(twice).await, "one key twice");
    let twice = vec![
        TxOp::Update {
            key: Key::new(&pk, "b"),
            update: Update::new().add("n", 1),
            cond: None,
        },
        TxOp::Delete {
            key: Key::new(&pk, "b"),
            cond: None,
        },
    ];
    assert_invalid(store.transact(twice).await, "one key twice");

    let too_many: Vec<TxOp> = (0..=MAX_TX_OPS).map(|i| put(format!("m{i:03}"))).collect();
    assert_invalid(store.transact(too_many).await, "too many operations");
    assert_invalid(
        store
            .transact(vec![TxOp::Put {
                item: obj(json!({"pk": pk})),
                cond: None,
            }])
            .await,
        "put without sk",
    );
    let q = Query::partition(&pk);
    assert_eq!(store.count(&q).await.expect("count"), 0, "nothing written");

    let most: Vec<TxOp> = (0..MAX_TX_OPS).map(|i| put(format!("m{i:03}"))).collect();
    store.transact(most).await.expect("the largest transaction");
    assert_eq!(store.count(&q).await.expect("count"), MAX_TX_OPS as u64);
}

// ----------------------------------------------------------------- queries

pub async fn query_forward_and_backward(store: Arc<dyn Store>) {
    let pk = unique("order");
    let other = unique("order");
    for sk in ["c", "a", "e", "b", "d"] {
        store
            .put(item(&pk, sk, json!({"v": sk})), None)
            .await
            .expect("put");
    }
    store
        .put(item(&other, "a", json!({})), None)
        .await
        .expect("put");
    let page = query(&*store, &Query::partition(&pk)).await;
    assert_eq!(sks(&page.items), ["a", "b", "c", "d", "e"]);
    assert_eq!(
        page.items[0],
        item(&pk, "a", json!({"v": "a"})),
        "whole items"
    );
    assert_eq!(page.last_key, None);
    let page = query(&*store, &Query::partition(&pk).backward()).await;
    assert_eq!(sks(&page.items), ["e", "d", "c", "b", "a"]);
    assert_eq!(page.last_key, None);
    let page = query(&*store, &Query::partition(unique("order"))).await;
    assert_eq!(page, QueryPage::default(), "empty partition");
}

pub async fn query_sort_key_conditions(store: Arc<dyn Store>) {
    let pk = unique("skcond");
    let all = [
        "a",
        "a#1",
        "a#2",
        "ab",
        "b",
        "b#1",
        "c",
        "z",
        "é",
        "\u{D7FF}1",
        "\u{E000}",
        "\u{FFFD}",
        "😀",
        "\u{10FFFF}",
        "\u{10FFFF}a",
    ];
    for sk in all {
        store
            .put(item(&pk, sk, json!({})), None)
            .await
            .expect("put");
    }
    let mut sorted: Vec<&str> = all.to_vec();
    sorted.sort_by(|x, y| x.as_bytes().cmp(y.as_bytes()));
    let s = String::from;
    type Pred = Box<dyn Fn(&str) -> bool>;
    let cases: Vec<(SkCond, Pred)> = vec![
        (SkCond::Any, Box::new(|_| true)),
        (SkCond::Eq(s("ab")), Box::new(|x| x == "ab")),
        (SkCond::Eq(s("nope")), Box::new(|_| false)),
        (SkCond::BeginsWith(s("a")), Box::new(|x| x.starts_with('a'))),
        (
            SkCond::BeginsWith(s("a#")),
            Box::new(|x| x.starts_with("a#")),
        ),
        (SkCond::BeginsWith(s("é")), Box::new(|x| x.starts_with('é'))),
        (SkCond::BeginsWith(s("zz")), Box::new(|_| false)),
        (
            SkCond::BeginsWith(s("\u{D7FF}")),
            Box::new(|x| x.starts_with('\u{D7FF}')),
        ),
        (
            SkCond::BeginsWith(s("\u{10FFFF}")),
            Box::new(|x| x.starts_with('\u{10FFFF}')),
        ),
        (
            SkCond::Between(s("a#2"), s("b#1")),
            Box::new(|x| ("a#2"..="b#1").contains(&x)),
        ),
        (SkCond::Between(s("b"), s("b")), Box::new(|x| x == "b")),
        (SkCond::Between(s("b#"), s("b#0")), Box::new(|_| false)),
        (SkCond::Lt(s("b")), Box::new(|x| x < "b")),
        (SkCond::Le(s("b")), Box::new(|x| x <= "b")),
        (SkCond::Gt(s("b")), Box::new(|x| x > "b")),
        (SkCond::Ge(s("b")), Box::new(|x| x >= "b")),
        (SkCond::Lt(s("a")), Box::new(|_| false)),
        (SkCond::Gt(s("\u{10FFFF}a")), Box::new(|_| false)),
        (SkCond::Ge(s("\u{FFFD}")), Box::new(|x| x >= "\u{FFFD}")),
        (SkCond::Lt(s("😀")), Box::new(|x| x < "😀")),
    ];
    for (cond, pred) in cases {
        let expected: Vec<String> = sorted
            .iter()
            .filter(|x| pred(x))
            .map(|x| x.to_string())
            .collect();
        let q = Query::partition(&pk).sk(cond.clone());
        let page = query(&*store, &q).await;
        assert_eq!(sks(&page.items), expected, "forward {cond:?}");
        let page = query(&*store, &q.clone().backward()).await;
        let mut reversed = expected.clone();
        reversed.reverse();
        assert_eq!(sks(&page.items), reversed, "backward {cond:?}");
        let count = store.count(&q).await.expect("count");
        assert_eq!(count, expected.len() as u64, "count {cond:?}");
        let (paged, _) = all_pages(&*store, &q.clone().limit(2)).await;
        assert_eq!(sks(&paged), expected, "paged {cond:?}");
    }
}

async fn paging(store: Arc<dyn Store>, forward: bool) {
    let pk = unique("paging");
    let mut expected: Vec<String> = (0..25).map(|i| format!("item#{i:02}")).collect();
    // Insert out of order.
    for i in [7, 3, 24, 0, 12, 18, 1] {
        store
            .put(item(&pk, &expected[i], json!({"i": i})), None)
            .await
            .expect("put");
    }
    for (i, sk) in expected.iter().enumerate() {
        store
            .put(item(&pk, sk, json!({"i": i})), None)
            .await
            .expect("put");
    }
    if !forward {
        expected.reverse();
    }
    for limit in [1, 5, 7, 24, 25, 26, 100] {
        let mut q = Query::partition(&pk).limit(limit);
        q.forward = forward;
        let (items, pages) = all_pages(&*store, &q).await;
        assert_eq!(sks(&items), expected, "limit {limit}");
        let at_least = 25_usize.div_ceil(limit);
        assert!(
            pages == at_least || (25 % limit == 0 && pages == at_least + 1),
            "limit {limit}: {pages} pages"
        );
    }
    // A page starting in the middle.
    let mut q = Query::partition(&pk).limit(3);
    q.forward = forward;
    q.start_after = Some(obj(json!({"pk": pk, "sk": expected[9]})));
    let page = query(&*store, &q).await;
    assert_eq!(sks(&page.items), expected[10..13]);
    assert_eq!(
        page.last_key,
        Some(obj(json!({"pk": pk, "sk": expected[12]})))
    );
    // Paging combines with a sort-key condition.
    let mut q = Query::partition(&pk)
        .sk(SkCond::Between("item#05".into(), "item#14".into()))
        .limit(4);
    q.forward = forward;
    let (items, _) = all_pages(&*store, &q).await;
    let mut window: Vec<String> = (5..15).map(|i| format!("item#{i:02}")).collect();
    if !forward {
        window.reverse();
    }
    assert_eq!(sks(&items), window);
}

pub async fn query_paging_forward(store: Arc<dyn Store>) {
    paging(store, true).await;
}

pub async fn query_paging_backward(store: Arc<dyn Store>) {
    paging(store, false).await;
}

pub async fn query_filter_applies_after_limit(store: Arc<dyn Store>) {
    let pk = unique("filter");
    for i in 0..10 {
        let kind = if i % 3 == 0 { "a" } else { "b" };
        store
            .put(
                item(&pk, &format!("s{i}"), json!({"kind": kind, "i": i})),
                None,
            )
            .await
            .expect("put");
    }
    let q = Query::partition(&pk).limit(4).filter(Cond::eq("kind", "a"));
    let page = query(&*store, &q).await;
    assert_eq!(sks(&page.items), ["s0", "s3"], "first four examined");
    assert_eq!(page.last_key, Some(obj(json!({"pk": pk, "sk": "s3"}))));

    // A page may hold no item at all and still continue.
    let mut q2 = Query::partition(&pk).limit(2).filter(Cond::eq("kind", "a"));
    q2.start_after = Some(obj(json!({"pk": pk, "sk": "s3"})));
    let page = query(&*store, &q2).await;
    assert_eq!(page.items, Vec::<Item>::new());
    assert_eq!(page.last_key, Some(obj(json!({"pk": pk, "sk": "s5"}))));

    let (items, pages) = all_pages(&*store, &q).await;
    assert_eq!(sks(&items), ["s0", "s3", "s6", "s9"]);
    assert_eq!(pages, 3);

    let back = Query::partition(&pk)
        .backward()
        .limit(3)
        .filter(Cond::Or(vec![Cond::eq("kind", "a"), Cond::ge("i", 8)]));
    let (items, _) = all_pages(&*store, &back).await;
    assert_eq!(sks(&items), ["s9", "s8", "s6", "s3", "s0"]);

    let none = Query::partition(&pk).filter(Cond::eq("kind", "c"));
    let page = query(&*store, &none).await;
    assert_eq!(page, QueryPage::default());
}

pub async fn query_rejects_invalid_requests(store: Arc<dyn Store>) {
    let pk = unique("query-invalid");
    store
        .put(item(&pk, "a", json!({})), None)
        .await
        .expect("put");
    let between = Query::partition(&pk).sk(SkCond::Between("c".into(), "a".into()));
    assert_invalid(store.query(&between).await, "between with reversed bounds");
    assert_invalid(
        store.query(&Query::partition(&pk).limit(0)).await,
        "limit 0",
    );
    let mut elsewhere = Query::partition(&pk).limit(1);
    elsewhere.start_after = Some(obj(json!({"pk": unique("query-invalid"), "sk": "a"})));
    assert_invalid(
        store.query(&elsewhere).await,
        "start_after in another partition",
    );
}

// ----------------------------------------------------------------- indexes

pub async fn query_gsi1(store: Arc<dyn Store>) {
    let p1 = unique("gsi1");
    let p2 = unique("gsi1");
    let g = unique("gsi1-g");
    let g_other = unique("gsi1-g");
    let i1 = item(
        &p1,
        "1",
        json!({"gsi1pk": g, "gsi1sk": "2024-01-03", "n": 1}),
    );
    let i2 = item(
        &p2,
        "2",
        json!({"gsi1pk": g, "gsi1sk": "2024-01-01", "n": 2}),
    );
    let i3 = item(&p1, "3", json!({"gsi1pk": g, "n": 3}));
    let i4 = item(&p1, "4", json!({"gsi1sk": "2024-01-02", "n": 4}));
    let i5 = item(
        &p2,
        "5",
        json!({"gsi1pk": g, "gsi1sk": "2024-01-02", "n": 5}),
    );
    let i6 = item(&p1, "6", json!({"gsi1pk": g_other, "gsi1sk": "2024-01-02"}));
    let i7 = item(&p1, "7", json!({"gsi2pk": g, "gsi2sk": "2024-01-02"}));
    put_all(
        &*store,
        &[i1.clone(), i2.clone(), i3, i4, i5.clone(), i6, i7],
    )
    .await;

    let q = Query::partition(&g).on(Index::Gsi1);
    let expected = vec![i2.clone(), i5.clone(), i1.clone()];
    eventually("gsi1 forward", || async {
        let page = query(&*store, &q).await;
        if page.items == expected && page.last_key.is_none() {
            Ok(())
        } else {
            Err(format!("got {page:?}"))
        }
    })
    .await;
    let page = query(&*store, &q.clone().backward()).await;
    assert_eq!(page.items, vec![i1.clone(), i5.clone(), i2.clone()]);
    let page = query(&*store, &q.clone().sk(SkCond::Gt("2024-01-01".into()))).await;
    assert_eq!(page.items, vec![i5.clone(), i1.clone()]);
    let page = query(
        &*store,
        &q.clone().sk(SkCond::BeginsWith("2024-01-0".into())),
    )
    .await;
    assert_eq!(page.items.len(), 3);
    let page = query(&*store, &q.clone().filter(Cond::ge("n", 2))).await;
    assert_eq!(page.items, vec![i2.clone(), i5.clone()]);

    let page = query(&*store, &q.clone().limit(2)).await;
    assert_eq!(page.items, vec![i2, i5]);
    let last = page.last_key.expect("more to come");
    assert_key_attrs(&last, Some(Index::Gsi1));
    assert_eq!(last.get(PK), Some(&json!(p2)));
    assert_eq!(last.get("gsi1sk"), Some(&json!("2024-01-02")));
    let mut next = q.clone().limit(2);
    next.start_after = Some(last);
    let page = query(&*store, &next).await;
    assert_eq!(page.items, vec![i1]);
    assert_eq!(page.last_key, None);

    let count = store
        .count(&Query::partition(&g).on(Index::Gsi2))
        .await
        .expect("count");
    assert!(count <= 1, "gsi2 holds only the gsi2 item");
}

/// The filtered lists' indexes (`gsi3`..`gsi6`): each is its own sparse
/// index, ranged by sort key (a creation time), and an update that moves
/// an item's partition (a status change) moves its entry.
pub async fn query_list_indexes(store: Arc<dyn Store>) {
    let pk = unique("gsi-list");
    let lists = [Index::Gsi3, Index::Gsi4, Index::Gsi5, Index::Gsi6];
    let g = unique("gsi-list-g");
    let moved = unique("gsi-list-moved");
    let mut items = Vec::new();
    for (i, index) in lists.iter().enumerate() {
        for (n, sk) in ["0001#a", "0002#b", "0003#c"].iter().enumerate() {
            let mut it = item(&pk, &format!("{i}-{n}"), json!({"n": n}));
            it.insert(index.pk_attr().into(), json!(format!("{g}#{i}")));
            it.insert(index.sk_attr().into(), json!(sk));
            items.push(it);
        }
    }
    put_all(&*store, &items).await;
    for (i, index) in lists.iter().enumerate() {
        let q = Query::partition(format!("{g}#{i}"))
            .on(*index)
            .backward()
            .sk(SkCond::Between("0002".into(), "0003".into()));
        eventually("list index range", || async {
            let page = query(&*store, &q).await;
            let got: Vec<Value> = page.items.iter().map(|x| x["n"].clone()).collect();
            if got == vec![json!(1)] {
                Ok(())
            } else {
                Err(format!("{} got {got:?}", index.name()))
            }
        })
        .await;
        for other in lists.iter().filter(|o| *o != index) {
            let count = store
                .count(&Query::partition(format!("{g}#{i}")).on(*other))
                .await
                .expect("count");
            assert_eq!(count, 0, "{} holds no {} entry", other.name(), index.name());
        }
    }
    // A status change moves the entry from one partition to another.
    let key = Key::new(pk.as_str(), "1-0");
    store
        .update(
            &key,
            Update::new().set(Index::Gsi4.pk_attr(), moved.clone()),
            Some(Cond::Exists),
        )
        .await
        .expect("move");
    eventually("moved entry", || async {
        let there = store
            .count(&Query::partition(&moved).on(Index::Gsi4))
            .await
            .map_err(|e| e.to_string())?;
        let left = store
            .count(&Query::partition(format!("{g}#1")).on(Index::Gsi4))
            .await
            .map_err(|e| e.to_string())?;
        if (there, left) == (1, 2) {
            Ok(())
        } else {
            Err(format!("moved {there}, left {left}"))
        }
    })
    .await;
}

pub async fn query_gsi2_and_index_maintenance(store: Arc<dyn Store>) {
    let pk = unique("gsi-maint");
    let ga = unique("gsi-maint-a");
    let gb = unique("gsi-maint-b");
    let g2 = unique("gsi-maint-2");
    let i1 = item(
        &pk,
        "1",
        json!({"gsi1pk": ga, "gsi1sk": "t3", "gsi2pk": g2, "gsi2sk": "x1"}),
    );
    let i2 = item(&pk, "2", json!({"gsi1pk": ga, "gsi1sk": "t1"}));
    let i3 = item(&pk, "3", json!({"gsi1pk": ga}));
    let i5 = item(
        &pk,
        "5",
        json!({"gsi1pk": ga, "gsi1sk": "t2", "gsi2pk": g2}),
    );
    let i6 = item(&pk, "6", json!({"gsi2pk": g2, "gsi2sk": "x0"}));
    put_all(&*store, &[i1, i2, i3, i5, i6]).await;

    let on = |index: Index, g: &str| Query::partition(g).on(index);
    let expect = |what: &'static str, q: Query, want: Vec<&'static str>| {
        let store = Arc::clone(&store);
        async move {
            eventually(what, || async {
                let page = query(&*store, &q).await;
                let count = store.count(&q).await.expect("count");
                if sks(&page.items) == want && count == want.len() as u64 {
                    Ok(())
                } else {
                    Err(format!("got {:?}, count {count}", sks(&page.items)))
                }
            })
            .await
        }
    };
    expect("gsi1 initial", on(Index::Gsi1, &ga), vec!["2", "5", "1"]).await;
    expect("gsi2 initial", on(Index::Gsi2, &g2), vec!["6", "1"]).await;

    let k = |sk: &str| Key::new(&pk, sk);
    store
        .update(&k("1"), Update::new().set("gsi1pk", gb.as_str()), None)
        .await
        .expect("move 1 to gb");
    expect("moved out of ga", on(Index::Gsi1, &ga), vec!["2", "5"]).await;
    expect("moved into gb", on(Index::Gsi1, &gb), vec!["1"]).await;
    expect("gsi2 untouched", on(Index::Gsi2, &g2), vec!["6", "1"]).await;

    store
        .update(&k("5"), Update::new().remove("gsi1sk"), None)
        .await
        .expect("unindex 5");
    store
        .update(&k("3"), Update::new().set("gsi1sk", "t9"), None)
        .await
        .expect("index 3");
    expect("after remove and set", on(Index::Gsi1, &ga), vec!["2", "3"]).await;

    store
        .update(&k("2"), Update::new().set("gsi1sk", "t99"), None)
        .await
        .expect("re-sort 2");
    expect("re-sorted", on(Index::Gsi1, &ga), vec!["3", "2"]).await;

    store.delete(&k("2"), None).await.expect("delete 2");
    expect("after delete", on(Index::Gsi1, &ga), vec!["3"]).await;

    store
        .put(item(&pk, "6", json!({"plain": true})), None)
        .await
        .expect("overwrite 6 without index attributes");
    expect("after overwrite", on(Index::Gsi2, &g2), vec!["1"]).await;

    store
        .transact(vec![
            TxOp::Update {
                key: k("5"),
                update: Update::new().set("gsi2sk", "x2"),
                cond: None,
            },
            TxOp::Delete {
                key: k("1"),
                cond: None,
            },
        ])
        .await
        .expect("transaction");
    expect("after transaction", on(Index::Gsi2, &g2), vec!["5"]).await;
    expect("gb emptied", on(Index::Gsi1, &gb), vec![]).await;
}

pub async fn query_index_paging_with_ties(store: Arc<dyn Store>) {
    let g = unique("gsi-ties");
    let pks = [unique("gsi-ties"), unique("gsi-ties")];
    let mut all = Vec::new();
    for i in 0..12 {
        let it = item(
            &pks[i % 2],
            &format!("s{i:02}"),
            json!({"gsi2pk": g, "gsi2sk": format!("t{}", i / 3)}),
        );
        all.push(it);
    }
    put_all(&*store, &all).await;
    let q = Query::partition(&g).on(Index::Gsi2);
    eventually("all indexed", || async {
        match store.count(&q).await.expect("count") {
            12 => Ok(()),
            n => Err(format!("{n} of 12 indexed")),
        }
    })
    .await;
    for forward in [true, false] {
        for limit in [1, 4, 5, 12] {
            let mut paged = q.clone().limit(limit);
            paged.forward = forward;
            let (items, _) = all_pages(&*store, &paged).await;
            let isks: Vec<&str> = items
                .iter()
                .map(|i| i.get("gsi2sk").and_then(Value::as_str).expect("gsi2sk"))
                .collect();
            let mut sorted = isks.clone();
            sorted.sort_unstable();
            if !forward {
                sorted.reverse();
            }
            assert_eq!(isks, sorted, "index order, limit {limit}");
            let keys: Vec<Key> = items.iter().map(key_of).collect();
            let distinct: HashSet<&Key> = keys.iter().collect();
            assert_eq!(keys.len(), 12, "every item once, limit {limit}");
            assert_eq!(distinct.len(), 12, "no item twice, limit {limit}");
        }
    }
}

pub async fn count_with_sort_key_and_filter(store: Arc<dyn Store>) {
    let pk = unique("count");
    for i in 0..20 {
        let kind = if i % 4 == 0 { "a" } else { "b" };
        store
            .put(
                item(&pk, &format!("item#{i:02}"), json!({"kind": kind, "i": i})),
                None,
            )
            .await
            .expect("put");
    }
    let q = Query::partition(&pk);
    let count = |q: Query| {
        let store = Arc::clone(&store);
        async move { store.count(&q).await.expect("count") }
    };
    assert_eq!(count(q.clone()).await, 20);
    assert_eq!(count(Query::partition(unique("count"))).await, 0);
    assert_eq!(
        count(q.clone().sk(SkCond::BeginsWith("item#1".into()))).await,
        10
    );
    assert_eq!(count(q.clone().filter(Cond::eq("kind", "a"))).await, 5);
    assert_eq!(
        count(
            q.clone()
                .sk(SkCond::Ge("item#10".into()))
                .filter(Cond::eq("kind", "a"))
        )
        .await,
        2,
        "item#12 and item#16"
    );
    let mut ignored = q.clone().limit(3).filter(Cond::lt("i", 10)).backward();
    ignored.start_after = Some(obj(json!({"pk": pk, "sk": "item#15"})));
    assert_eq!(
        count(ignored).await,
        10,
        "count ignores limit and start_after"
    );
}

pub async fn window_offset_and_limit(store: Arc<dyn Store>) {
    let pk = unique("window");
    for i in 0..10 {
        let kind = if i % 3 == 0 { "a" } else { "b" };
        store
            .put(item(&pk, &format!("s{i}"), json!({"kind": kind})), None)
            .await
            .expect("put");
    }
    let q = Query::partition(&pk);
    let window = |q: Query, offset: usize, limit: usize| {
        let store = Arc::clone(&store);
        async move {
            let items = query_window(&*store, &q, offset, limit)
                .await
                .expect("query_window");
            sks(&items)
        }
    };
    assert_eq!(window(q.clone(), 0, 3).await, ["s0", "s1", "s2"]);
    assert_eq!(window(q.clone(), 3, 4).await, ["s3", "s4", "s5", "s6"]);
    assert_eq!(window(q.clone(), 8, 5).await, ["s8", "s9"]);
    assert_eq!(window(q.clone(), 10, 5).await, Vec::<String>::new());
    assert_eq!(window(q.clone(), 20, 5).await, Vec::<String>::new());
    assert_eq!(window(q.clone(), 0, 0).await, Vec::<String>::new());
    assert_eq!(window(q.clone().backward(), 0, 2).await, ["s9", "s8"]);
    let only_a = q.clone().filter(Cond::eq("kind", "a"));
    assert_eq!(window(only_a.clone(), 1, 2).await, ["s3", "s6"]);
    assert_eq!(
        window(only_a.clone(), 0, 10).await,
        ["s0", "s3", "s6", "s9"]
    );
    assert_eq!(window(only_a.backward(), 3, 10).await, ["s0"]);
}

/// A page that starts at a sort key (a cursor) reads from there, not
/// through what lies before it: the same records as the offsets reach,
/// in a bounded number of items examined.
pub async fn window_seeks_by_sort_key(store: Arc<dyn Store>) {
    let pk = unique("seek");
    for i in 0..10 {
        let kind = if i % 3 == 0 { "a" } else { "b" };
        store
            .put(item(&pk, &format!("s{i}"), json!({"kind": kind})), None)
            .await
            .expect("put");
    }
    let newest_first = Query::partition(&pk).backward();
    let window = |q: Query, seek: Seek, offset: usize, limit: usize| {
        let store = Arc::clone(&store);
        async move {
            let items = seek_window(&*store, &q, &seek, offset, limit)
                .await
                .expect("seek_window");
            sks(&items)
        }
    };
    let after = |sk: &str| Seek::After(sk.to_owned());
    let before = |sk: &str| Seek::Before(sk.to_owned());
    let q = newest_first.clone();
    assert_eq!(
        window(q.clone(), Seek::Start, 0, 3).await,
        ["s9", "s8", "s7"]
    );
    assert_eq!(
        window(q.clone(), after("s7"), 0, 3).await,
        ["s6", "s5", "s4"]
    );
    assert_eq!(window(q.clone(), after("s7"), 2, 2).await, ["s4", "s3"]);
    assert_eq!(window(q.clone(), after("s1"), 0, 3).await, ["s0"]);
    assert_eq!(
        window(q.clone(), after("s0"), 0, 3).await,
        Vec::<String>::new()
    );
    // A cursor need not be a stored key: it is a place in the order.
    assert_eq!(window(q.clone(), after("s55"), 0, 2).await, ["s5", "s4"]);
    // The page before a cursor, in the list's order.
    assert_eq!(
        window(q.clone(), before("s4"), 0, 3).await,
        ["s7", "s6", "s5"]
    );
    assert_eq!(window(q.clone(), before("s8"), 0, 3).await, ["s9"]);
    assert_eq!(
        window(q.clone(), before("s9"), 0, 3).await,
        Vec::<String>::new()
    );
    // Ascending lists seek the other way.
    let up = Query::partition(&pk);
    assert_eq!(window(up.clone(), after("s7"), 0, 5).await, ["s8", "s9"]);
    assert_eq!(window(up.clone(), before("s2"), 0, 5).await, ["s0", "s1"]);
    // Filters apply after the seek.
    let only_a = newest_first.filter(Cond::eq("kind", "a"));
    assert_eq!(
        window(only_a.clone(), after("s9"), 0, 5).await,
        ["s6", "s3", "s0"]
    );
    assert_eq!(window(only_a, before("s3"), 0, 1).await, ["s6"]);
    // Walking every page by its last key reaches every record once.
    let mut seen = Vec::new();
    let mut seek = Seek::Start;
    loop {
        let page = window(q.clone(), seek.clone(), 0, 3).await;
        let Some(last) = page.last().cloned() else {
            break;
        };
        seen.extend(page);
        seek = after(&last);
    }
    assert_eq!(
        seen,
        ["s9", "s8", "s7", "s6", "s5", "s4", "s3", "s2", "s1", "s0"]
    );
}

// ------------------------------------------------------------- concurrency

pub async fn race_conditional_put(store: Arc<dyn Store>) {
    const TASKS: usize = 32;
    let pk = unique("race-put");
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let (store, barrier, pk) = (Arc::clone(&store), Arc::clone(&barrier), pk.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let it = item(&pk, "the-one", json!({"winner": task}));
            let res = retry_unavailable(|| store.put(it.clone(), Some(Cond::NotExists))).await;
            (task, res)
        }));
    }
    let mut winners = Vec::new();
    for handle in handles {
        let (task, res) = handle.await.expect("task");
        match res {
            Ok(()) => winners.push(task),
            Err(StoreError::ConditionFailed) => {}
            Err(e) => panic!("task {task}: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one put wins: {winners:?}");
    let stored = get(&*store, &pk, "the-one").await.expect("stored");
    assert_eq!(stored.get("winner"), Some(&json!(winners[0])));
}

pub async fn race_reservations(store: Arc<dyn Store>) {
    const TASKS: usize = 50;
    let pk = unique("race-reserve");
    let key = Key::new(&pk, "balance");
    store
        .put(
            item(&pk, "balance", json!({"amount": 100, "reserved": 0})),
            None,
        )
        .await
        .expect("put");
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let (store, barrier, key) = (Arc::clone(&store), Arc::clone(&barrier), key.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            // amount - reserved >= 30, i.e. reserved <= 70
            retry_unavailable(|| {
                store.update(
                    &key,
                    Update::new().add("reserved", 30),
                    Some(Cond::le("reserved", 70)),
                )
            })
            .await
        }));
    }
    let mut reserved_after = Vec::new();
    for handle in handles {
        match handle.await.expect("task") {
            Ok(item) => reserved_after.push(item.get("reserved").cloned()),
            Err(StoreError::ConditionFailed) => {}
            Err(e) => panic!("reservation: {e}"),
        }
    }
    reserved_after.sort_by_key(|v| v.as_ref().and_then(Value::as_i64));
    assert_eq!(
        reserved_after,
        vec![Some(json!(30)), Some(json!(60)), Some(json!(90))],
        "exactly three reservations fit"
    );
    let stored = store.get(&key).await.expect("get").expect("stored");
    assert_eq!(stored.get("reserved"), Some(&json!(90)));
    assert_eq!(stored.get("amount"), Some(&json!(100)));
}

pub async fn race_optimistic_transactions(store: Arc<dyn Store>) {
    const TASKS: usize = 40;
    const ATTEMPTS: usize = 1000;
    let pk = unique("race-tx");
    let counter = Key::new(&pk, "counter");
    store
        .put(item(&pk, "counter", json!({"value": 0})), None)
        .await
        .expect("put");
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
        let (pk, counter) = (pk.clone(), counter.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut attempted = Vec::new();
            for attempt in 0..ATTEMPTS {
                let current = retry_unavailable(|| store.get(&counter))
                    .await
                    .expect("read counter")
                    .expect("counter exists");
                let seen = current
                    .get("value")
                    .and_then(Value::as_i64)
                    .expect("integer counter");
                let sk = format!("entry#{task:02}#{attempt:04}");
                attempted.push(sk.clone());
                let ops = vec![
                    TxOp::Update {
                        key: counter.clone(),
                        update: Update::new().add("value", 1),
                        cond: Some(Cond::eq("value", seen)),
                    },
                    TxOp::Put {
                        item: item(&pk, &sk, json!({"task": task, "seen": seen})),
                        cond: Some(Cond::NotExists),
                    },
                ];
                match store.transact(ops).await {
                    Ok(()) => return (attempted, Some((sk, seen))),
                    Err(StoreError::TransactionCanceled { reasons }) => {
                        assert_eq!(reasons.len(), 2, "one reason per operation");
                        assert!(
                            !matches!(reasons[1], TxReason::ConditionFailed),
                            "fresh put key cannot fail its condition: {reasons:?}"
                        );
                        assert!(
                            reasons.iter().any(|r| matches!(
                                r,
                                TxReason::ConditionFailed | TxReason::Conflict
                            )),
                            "a cancelled transaction names a cause: {reasons:?}"
                        );
                    }
                    Err(StoreError::Unavailable(_)) => {}
                    Err(e) => panic!("task {task}: {e}"),
                }
                tokio::task::yield_now().await;
            }
            (attempted, None)
        }));
    }
    let mut committed = BTreeMap::new();
    let mut attempted = Vec::new();
    for handle in handles {
        let (tried, won) = handle.await.expect("task");
        attempted.extend(tried);
        if let Some((sk, seen)) = won {
            committed.insert(sk, seen);
        }
    }
    let stored = store.get(&counter).await.expect("get").expect("counter");
    assert_eq!(
        stored.get("value"),
        Some(&json!(committed.len())),
        "final counter equals the number of committed transactions"
    );
    assert_eq!(committed.len(), TASKS, "every task eventually commits");
    let seen: BTreeSet<i64> = committed.values().copied().collect();
    let expected: BTreeSet<i64> = (0..TASKS as i64).collect();
    assert_eq!(
        seen, expected,
        "each committed transaction saw a distinct value"
    );
    for sk in &attempted {
        let exists = get(&*store, &pk, sk).await.is_some();
        assert_eq!(
            exists,
            committed.contains_key(sk),
            "{sk}: a put exists exactly when its transaction committed"
        );
    }
}

pub async fn race_counter_allocation(store: Arc<dyn Store>) {
    const TASKS: i64 = 100;
    let pk = unique("race-counter");
    let key = Key::new(&pk, "seq");
    let barrier = Arc::new(Barrier::new(TASKS as usize));
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let (store, barrier, key) = (Arc::clone(&store), Arc::clone(&barrier), key.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let item = retry_unavailable(|| store.update(&key, Update::new().add("next", 1), None))
                .await
                .expect("allocate");
            item.get("next")
                .and_then(Value::as_i64)
                .expect("integer counter")
        }));
    }
    let mut values = Vec::new();
    for handle in handles {
        values.push(handle.await.expect("task"));
    }
    values.sort_unstable();
    let expected: Vec<i64> = (1..=TASKS).collect();
    assert_eq!(values, expected, "gapless, no repeats");
    let stored = store.get(&key).await.expect("get").expect("counter");
    assert_eq!(stored.get("next"), Some(&json!(TASKS)));
}
