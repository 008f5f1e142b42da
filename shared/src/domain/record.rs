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

/// One page of `query` (`offset`, `limit`) as records, and the total the
/// query matches: what every list endpoint answers.
pub async fn page_of<T: DeserializeOwned>(
    store: &dyn Store,
    query: &Query,
    offset: usize,
    limit: usize,
) -> Result<(Vec<T>, u64), StoreError> {
    // Side by side: one round trip's wait, not two.
    let (items, total) = tokio::join!(
        query_window(store, query, offset, limit),
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

/// The record stored in `item`.
pub fn from_item<T: DeserializeOwned>(item: Item) -> Result<T, StoreError> {
    let key = Key::of(&item);
    serde_json::from_value(Value::Object(item)).map_err(|e| {
        // A record that no longer parses is a bug or corruption: say where.
        StoreError::Backend(format!("stored record {key:?} does not parse: {e}"))
    })
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
