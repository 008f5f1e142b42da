//! Records to store items and back: the record's own fields plus its key
//! attributes. Extra attributes (`pk`, `sk`, index keys) are ignored when
//! reading, so adding an index never breaks old records.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::store::{Index, Item, Key, PK, Query, SK, Store, StoreError, query_window};

/// The item for `record` stored at `key`, listed in `indexes`.
pub fn to_item<T: Serialize>(
    record: &T,
    key: &Key,
    indexes: &[(Index, String, String)],
) -> Result<Item, StoreError> {
    let mut item = match serde_json::to_value(record) {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            return Err(StoreError::Invalid(
                "a record must serialize to an object".into(),
            ));
        }
        Err(e) => {
            return Err(StoreError::Invalid(format!(
                "record does not serialize: {e}"
            )));
        }
    };
    item.insert(PK.into(), Value::String(key.pk.clone()));
    item.insert(SK.into(), Value::String(key.sk.clone()));
    for (index, ipk, isk) in indexes {
        item.insert(index.pk_attr().into(), Value::String(ipk.clone()));
        item.insert(index.sk_attr().into(), Value::String(isk.clone()));
    }
    Ok(item)
}

/// Which records of a list one page holds: `limit` of them after the
/// first `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub offset: usize,
    pub limit: usize,
}

impl Window {
    /// The first `limit` records.
    pub fn first(limit: usize) -> Self {
        Window { offset: 0, limit }
    }
}

/// One page of `query` (the records in `window`) as records, and the
/// total the query matches: what every list endpoint answers.
pub async fn page_of<T: DeserializeOwned>(
    store: &dyn Store,
    query: &Query,
    window: Window,
) -> Result<(Vec<T>, u64), StoreError> {
    // Side by side: one round trip's wait, not two.
    let (items, total) = tokio::join!(
        query_window(store, query, window.offset, window.limit),
        store.count(query)
    );
    let (items, total) = (items?, total?);
    let records = items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<T>, _>>()?;
    Ok((records, total))
}

/// The records of one page of `query` (its `limit` bounds them): small
/// lists read whole, such as a merchant's projects or people.
pub async fn all_of<T: DeserializeOwned>(
    store: &dyn Store,
    query: &Query,
) -> Result<Vec<T>, StoreError> {
    store
        .query(query)
        .await?
        .items
        .into_iter()
        .map(from_item)
        .collect()
}

/// The record stored at `key`, if any: one [`Store::get_stored`], decoded
/// straight into `T` (records are read this way; [`from_item`] is for
/// items a query or a write answered).
pub async fn get<T: DeserializeOwned>(
    store: &dyn Store,
    key: &Key,
) -> Result<Option<T>, StoreError> {
    match store.get_stored(key).await? {
        Some(stored) => stored
            .decode()
            .map(Some)
            .map_err(|e| unparseable(Some(key), e)),
        None => Ok(None),
    }
}

/// A record that no longer parses is a bug or corruption: say where.
fn unparseable(key: Option<&Key>, e: serde_json::Error) -> StoreError {
    StoreError::Backend(format!("stored record {key:?} does not parse: {e}"))
}

/// The record stored in `item`.
pub fn from_item<T: DeserializeOwned>(item: Item) -> Result<T, StoreError> {
    let key = Key::of(&item);
    serde_json::from_value(Value::Object(item)).map_err(|e| unparseable(key.as_ref(), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Thing {
        id: String,
        n: i64,
    }

    #[test]
    fn records_round_trip_through_items() {
        let t = Thing {
            id: "x".into(),
            n: 3,
        };
        let key = Key::new("THING#x", "THING");
        let item = to_item(&t, &key, &[(Index::Gsi1, "P".into(), "x".into())]);
        let Ok(item) = item else {
            panic!("to_item failed")
        };
        assert_eq!(item["pk"], "THING#x");
        assert_eq!(item["gsi1pk"], "P");
        assert_eq!(from_item::<Thing>(item).ok(), Some(t));
    }

    #[tokio::test]
    async fn get_reads_a_record_in_one_call_and_names_one_that_does_not_parse() {
        use crate::store::counting::CountingStore;
        use crate::store::embedded::EmbeddedStore;
        use std::sync::Arc;
        let Ok(embedded) = EmbeddedStore::in_memory() else {
            panic!("in-memory store did not open")
        };
        let store = CountingStore::new(Arc::new(embedded));
        let t = Thing {
            id: "x".into(),
            n: 3,
        };
        let key = Key::new("THING#x", "THING");
        let Ok(item) = to_item(&t, &key, &[]) else {
            panic!("to_item failed")
        };
        assert_eq!(store.put(item, None).await, Ok(()));
        let before = store.calls();
        assert_eq!(get::<Thing>(&store, &key).await, Ok(Some(t)));
        assert_eq!(store.calls() - before, 1, "one store call");
        let missing = Key::new("THING#y", "THING");
        assert_eq!(get::<Thing>(&store, &missing).await, Ok(None));

        let bad = Key::new("THING#z", "THING");
        let mut item = Item::new();
        item.insert(PK.into(), Value::from("THING#z"));
        item.insert(SK.into(), Value::from("THING"));
        item.insert("id".into(), Value::from(5));
        assert_eq!(store.put(item, None).await, Ok(()));
        match get::<Thing>(&store, &bad).await {
            Err(StoreError::Backend(message)) => {
                assert!(message.contains("THING#z"), "names the record: {message}");
            }
            other => panic!("expected a backend error, got {other:?}"),
        }
    }

    #[test]
    fn unparseable_records_are_errors_not_panics() {
        let mut item = Item::new();
        item.insert("id".into(), Value::from(5));
        assert!(matches!(
            from_item::<Thing>(item),
            Err(StoreError::Backend(_))
        ));
    }
}
