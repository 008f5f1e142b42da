//! The request checks every backend runs before touching its storage, so
//! that the embedded store and DynamoDB refuse exactly the same requests
//! with the same [`StoreError`] variant ([`StoreError::Invalid`]).
//!
//! Refused here: an empty `pk`/`sk`; an item without string `pk` and `sk`;
//! an index key attribute (`gsi1pk`, ...) that is not a non-empty string,
//! in an item or in an update's `SET`; an update naming an empty attribute,
//! a key attribute, or one attribute twice; a malformed condition (see
//! [`cond::validate`]); an empty transaction, one of more than
//! [`MAX_TX_OPS`] operations, or one touching a key twice; a query on an
//! empty partition key, with a `limit` of 0, or a `Between` whose bounds
//! are reversed; a `start_after` outside the queried partition.
//!
//! Refusals that depend on the stored item (`add` on a non-integer) stay
//! with the backends: the embedded store checks them while applying the
//! update, DynamoDB answers them with a `ValidationException`.

use std::collections::HashSet;

use serde_json::Value;

use super::cond;
use super::{Cond, Index, Item, Key, MAX_TX_OPS, PK, Query, SK, SkCond, StoreError, TxOp, Update};

/// Both key attributes must be non-empty (DynamoDB refuses empty key
/// strings).
pub(crate) fn validate_key(key: &Key) -> Result<(), StoreError> {
    if key.pk.is_empty() || key.sk.is_empty() {
        return Err(StoreError::Invalid(format!(
            "key attributes must be non-empty strings: ({:?}, {:?})",
            key.pk, key.sk
        )));
    }
    Ok(())
}

/// An index key attribute (`gsi1pk`, `gsi1sk`, ...) written as `value` must
/// be a non-empty string; any other attribute may hold anything.
pub(crate) fn validate_index_attr(attr: &str, value: &Value) -> Result<(), StoreError> {
    let is_index_attr = Index::ALL
        .iter()
        .any(|i| attr == i.pk_attr() || attr == i.sk_attr());
    match value {
        _ if !is_index_attr => Ok(()),
        Value::String(s) if !s.is_empty() => Ok(()),
        other => Err(StoreError::Invalid(format!(
            "index key attribute {attr} must be a non-empty string, got {other}"
        ))),
    }
}

/// The key of an item to write, after checking its key and index attributes.
pub(crate) fn validate_item(item: &Item) -> Result<Key, StoreError> {
    let key = Key::of(item)
        .ok_or_else(|| StoreError::Invalid("an item needs string attributes pk and sk".into()))?;
    validate_key(&key)?;
    for index in Index::ALL {
        for attr in [index.pk_attr(), index.sk_attr()] {
            if let Some(value) = item.get(attr) {
                validate_index_attr(attr, value)?;
            }
        }
    }
    Ok(key)
}

/// An update names each attribute at most once, never an empty name or a
/// key attribute, and sets index key attributes only to non-empty strings.
/// (Removing an index attribute is fine: the index is sparse.)
pub(crate) fn validate_update(update: &Update) -> Result<(), StoreError> {
    let names = update
        .set
        .iter()
        .map(|(a, _)| a)
        .chain(update.add.iter().map(|(a, _)| a))
        .chain(update.remove.iter());
    let mut seen = HashSet::new();
    for attr in names {
        if attr.is_empty() {
            return Err(StoreError::Invalid(
                "update of an empty attribute name".into(),
            ));
        }
        if attr == PK || attr == SK {
            return Err(StoreError::Invalid(format!(
                "key attribute {attr} cannot be updated"
            )));
        }
        if !seen.insert(attr.as_str()) {
            return Err(StoreError::Invalid(format!(
                "attribute {attr} appears twice in one update"
            )));
        }
    }
    for (attr, value) in &update.set {
        validate_index_attr(attr, value)?;
    }
    Ok(())
}

/// An optional condition (see [`cond::validate`]).
pub(crate) fn validate_cond(cond: Option<&Cond>) -> Result<(), StoreError> {
    cond.map_or(Ok(()), cond::validate)
}

/// Checks a whole transaction before any of it runs: one to [`MAX_TX_OPS`]
/// operations, each valid, on distinct keys. Returns each operation's key,
/// in order.
pub(crate) fn validate_transaction(ops: &[TxOp]) -> Result<Vec<Key>, StoreError> {
    if ops.is_empty() {
        return Err(StoreError::Invalid(
            "a transaction needs an operation".into(),
        ));
    }
    if ops.len() > MAX_TX_OPS {
        return Err(StoreError::Invalid(format!(
            "a transaction holds at most {MAX_TX_OPS} operations, got {}",
            ops.len()
        )));
    }
    let mut seen = HashSet::new();
    let mut keys = Vec::with_capacity(ops.len());
    for op in ops {
        let key = match op {
            TxOp::Put { item, cond } => {
                validate_cond(cond.as_ref())?;
                validate_item(item)?
            }
            TxOp::Update { key, update, cond } => {
                validate_cond(cond.as_ref())?;
                validate_update(update)?;
                key.clone()
            }
            TxOp::Delete { key, cond } => {
                validate_cond(cond.as_ref())?;
                key.clone()
            }
            TxOp::Check { key, cond } => {
                cond::validate(cond)?;
                key.clone()
            }
        };
        validate_key(&key)?;
        if !seen.insert(key.clone()) {
            return Err(StoreError::Invalid(format!(
                "a transaction touches ({}, {}) twice",
                key.pk, key.sk
            )));
        }
        keys.push(key);
    }
    Ok(keys)
}

/// The parts of a query both backends check up front: a non-empty
/// partition key, a valid filter and, for a page (`paged`; a count ignores
/// the limit), a `limit` of at least 1. The sort-key condition is checked
/// by [`validate_sk`], which each backend calls where it translates it;
/// `start_after` by [`validate_start_after`].
pub(crate) fn validate_query(q: &Query, paged: bool) -> Result<(), StoreError> {
    if q.pk.is_empty() {
        return Err(StoreError::Invalid(
            "query on an empty partition key".into(),
        ));
    }
    if let Some(filter) = &q.filter {
        cond::validate(filter)?;
    }
    if paged && q.limit == Some(0) {
        return Err(StoreError::Invalid("query limit must be at least 1".into()));
    }
    Ok(())
}

/// A sort-key condition: `Between` needs its lower bound at most its upper.
pub(crate) fn validate_sk(sk: &SkCond) -> Result<(), StoreError> {
    if let SkCond::Between(lo, hi) = sk {
        if lo > hi {
            return Err(StoreError::Invalid(format!(
                "sort key between {lo:?} and {hi:?}: lower bound above upper bound"
            )));
        }
    }
    Ok(())
}

/// The key of a query's `start_after`, checked: string key attributes of
/// the table (and of the queried index), in the queried partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StartKey<'a> {
    /// The index key (`gsi1pk`, `gsi1sk`, ...) when the query is on an index.
    pub index: Option<(&'a str, &'a str)>,
    pub pk: &'a str,
    pub sk: &'a str,
}

/// Checks `start` as the `start_after` of `q` (see [`StartKey`]).
pub(crate) fn validate_start_after<'a>(
    q: &Query,
    start: &'a Item,
) -> Result<StartKey<'a>, StoreError> {
    let index = match q.index {
        None => {
            if string_attr(start, PK)? != q.pk {
                return Err(StoreError::Invalid(
                    "start_after is not in the queried partition".into(),
                ));
            }
            None
        }
        Some(index) => {
            let ipk = string_attr(start, index.pk_attr())?;
            if ipk != q.pk {
                return Err(StoreError::Invalid(
                    "start_after is not in the queried index partition".into(),
                ));
            }
            Some((ipk, string_attr(start, index.sk_attr())?))
        }
    };
    Ok(StartKey {
        index,
        pk: string_attr(start, PK)?,
        sk: string_attr(start, SK)?,
    })
}

fn string_attr<'a>(item: &'a Item, attr: &str) -> Result<&'a str, StoreError> {
    item.get(attr)
        .and_then(Value::as_str)
        .ok_or_else(|| StoreError::Invalid(format!("start_after needs a string attribute {attr}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Item {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn invalid_requests_are_refused() {
        for update in [
            Update::new().set(PK, "x"),
            Update::new().remove(SK),
            Update::new().set("", 1),
            Update::new().set("n", 1).add("n", 1),
            Update::new().set("gsi1pk", 7),
            Update::new().set("gsi2sk", ""),
        ] {
            assert!(
                matches!(validate_update(&update), Err(StoreError::Invalid(_))),
                "{update:?}"
            );
        }
        assert!(validate_update(&Update::new().remove("gsi1pk")).is_ok());
        assert!(validate_item(&obj(json!({"pk": "p", "sk": "s", "gsi1pk": null}))).is_err());
        assert!(validate_item(&obj(json!({"pk": "p", "sk": "s", "other": 1}))).is_ok());
    }

    #[test]
    fn items_need_non_empty_string_keys() {
        let key = validate_item(&obj(json!({"pk": "p", "sk": "s", "gsi2sk": "t"}))).unwrap();
        assert_eq!(key, Key::new("p", "s"));
        for item in [
            json!({"pk": "p"}),
            json!({"pk": "p", "sk": 1}),
            json!({"pk": "", "sk": "s"}),
            json!({"pk": "p", "sk": "s", "gsi1sk": ""}),
        ] {
            assert!(
                matches!(
                    validate_item(&obj(item.clone())),
                    Err(StoreError::Invalid(_))
                ),
                "{item}"
            );
        }
        assert!(validate_key(&Key::new("p", "")).is_err());
    }

    #[test]
    fn transactions_return_each_key_in_order() {
        let ops = vec![
            TxOp::Put {
                item: obj(json!({"pk": "p", "sk": "a"})),
                cond: Some(Cond::NotExists),
            },
            TxOp::Check {
                key: Key::new("p", "b"),
                cond: Cond::Exists,
            },
            TxOp::Delete {
                key: Key::new("q", "a"),
                cond: None,
            },
        ];
        assert_eq!(
            validate_transaction(&ops).unwrap(),
            vec![Key::new("p", "a"), Key::new("p", "b"), Key::new("q", "a")]
        );
        let invalid =
            |ops: &[TxOp]| matches!(validate_transaction(ops), Err(StoreError::Invalid(_)));
        assert!(invalid(&[]));
        let twice = [
            ops[1].clone(),
            TxOp::Update {
                key: Key::new("p", "b"),
                update: Update::new().add("n", 1),
                cond: None,
            },
        ];
        assert!(invalid(&twice));
        let bad_cond = [TxOp::Check {
            key: Key::new("p", "b"),
            cond: Cond::lt("n", true),
        }];
        assert!(invalid(&bad_cond));
        let put = |i: usize| TxOp::Put {
            item: obj(json!({"pk": "p", "sk": format!("m{i:03}")})),
            cond: None,
        };
        let most: Vec<TxOp> = (0..MAX_TX_OPS).map(put).collect();
        assert_eq!(validate_transaction(&most).unwrap().len(), MAX_TX_OPS);
        let too_many: Vec<TxOp> = (0..=MAX_TX_OPS).map(put).collect();
        assert!(invalid(&too_many));
    }

    #[test]
    fn queries() {
        assert!(validate_query(&Query::partition("p"), true).is_ok());
        assert!(validate_query(&Query::partition(""), false).is_err());
        assert!(validate_query(&Query::partition("p").limit(0), true).is_err());
        assert!(validate_query(&Query::partition("p").limit(0), false).is_ok());
        let bad_filter = Query::partition("p").filter(Cond::AttrExists(String::new()));
        assert!(validate_query(&bad_filter, false).is_err());
        let s = String::from;
        assert!(validate_sk(&SkCond::Between(s("b"), s("a"))).is_err());
        assert!(validate_sk(&SkCond::Between(s("a"), s("a"))).is_ok());
    }

    #[test]
    fn start_after_must_be_in_the_partition() {
        let q = Query::partition("p").on(Index::Gsi2);
        let good = obj(json!({"gsi2pk": "p", "gsi2sk": "t", "pk": "a", "sk": "b", "x": 1}));
        assert_eq!(
            validate_start_after(&q, &good).unwrap(),
            StartKey {
                index: Some(("p", "t")),
                pk: "a",
                sk: "b"
            }
        );
        let bad = obj(json!({"gsi2pk": "q", "gsi2sk": "t", "pk": "a", "sk": "b"}));
        assert!(validate_start_after(&q, &bad).is_err());
        let table = Query::partition("p");
        assert!(validate_start_after(&table, &obj(json!({"pk": "q", "sk": "b"}))).is_err());
        assert!(validate_start_after(&table, &obj(json!({"pk": "p"}))).is_err());
        assert_eq!(
            validate_start_after(&table, &good).unwrap_err(),
            StoreError::Invalid("start_after is not in the queried partition".into())
        );
    }
}
