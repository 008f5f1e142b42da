//! Records to store items and back: the record's own fields plus its key
//! attributes. Extra attributes (`pk`, `sk`, index keys) are ignored when
//! reading, so adding an index never breaks old records.

use std::borrow::Borrow;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::store::{
    Cond, Index, Item, Key, PK, Query, SK, Seek, Store, StoreError, TxOp, Update, seek_window,
};

/// A kind of stored record: where one lives and which indexes list it
/// follow from its fields. Conditions and updates on it are written with
/// its [`Attr`] constants (declared with [`attrs!`](crate::attrs)), never
/// with attribute names.
pub trait Record: Serialize + DeserializeOwned {
    /// The table key of this record.
    fn item_key(&self) -> Key;

    /// The index entries its fields determine (a sparse entry whose time
    /// an update chooses is a pair of fields of its own, [`Gsi2Entry`]).
    fn entries(&self) -> Vec<Entry> {
        Vec::new()
    }

    /// The whole item: fields, key and index entries.
    fn to_item(&self) -> Result<Item, StoreError> {
        item_of(self, &self.item_key(), &self.entries())
    }

    /// Writes this record where none is yet (the only whole-record write
    /// of most kinds: later changes are [`Changes`]).
    fn put_new(&self) -> Result<TxOp, StoreError> {
        Ok(TxOp::Put {
            item: self.to_item()?,
            cond: Some(Cond::NotExists),
        })
    }
}

/// One entry of a record in an index: the partition it is listed in and
/// its place there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub index: Index,
    pub partition: String,
    pub sort: String,
}

impl Entry {
    pub fn gsi1(partition: impl Into<String>, sort: impl Into<String>) -> Entry {
        Entry {
            index: Index::Gsi1,
            partition: partition.into(),
            sort: sort.into(),
        }
    }

    pub fn gsi2(partition: impl Into<String>, sort: impl Into<String>) -> Entry {
        Entry {
            index: Index::Gsi2,
            partition: partition.into(),
            sort: sort.into(),
        }
    }
}

/// A `gsi2` entry whose sort key an update chooses (a due time), which
/// the record's other fields cannot derive. The record keeps it as two
/// fields of its own, `gsi2pk` and `gsi2sk` (`Option<String>`, left out
/// when `None`: plain fields, not a flattened struct, so decoding stays
/// one pass); [`Changes::index`] and [`Changes::unindex`] move it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gsi2Entry {
    pub partition: String,
    pub sort: String,
}

impl Gsi2Entry {
    pub fn new(partition: impl Into<String>, sort: impl Into<String>) -> Gsi2Entry {
        Gsi2Entry {
            partition: partition.into(),
            sort: sort.into(),
        }
    }
}

/// One stored attribute of record `R`, holding a `V`: conditions and
/// updates name it through this, with a `V` serialized by serde, so the
/// compiler checks both the attribute and its value.
pub struct Attr<R, V: ?Sized> {
    name: &'static str,
    of: PhantomData<fn(&R) -> &V>,
}

impl<R, V: ?Sized> Clone for Attr<R, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R, V: ?Sized> Copy for Attr<R, V> {}

impl<R, V: ?Sized> std::fmt::Debug for Attr<R, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The JSON a value is stored as. Record values (strings, numbers,
/// timestamps, enums, maps with string keys) always serialize.
fn stored<V: Serialize + ?Sized>(v: &V) -> Value {
    match serde_json::to_value(v) {
        Ok(value) => value,
        Err(e) => {
            tracing::error!(error = %e, "a record value did not serialize");
            Value::Null
        }
    }
}

impl<R, V: Serialize + ?Sized> Attr<R, V> {
    /// Declared by [`attrs!`](crate::attrs), which checks the field.
    #[doc(hidden)]
    pub const fn declared(name: &'static str) -> Self {
        Attr {
            name,
            of: PhantomData,
        }
    }

    /// The attribute's name in the item.
    pub fn name(self) -> &'static str {
        self.name
    }

    pub fn eq<Q: Serialize + ?Sized>(self, v: &Q) -> Cond
    where
        V: Borrow<Q>,
    {
        Cond::eq(self.name, stored(v))
    }
    pub fn ne<Q: Serialize + ?Sized>(self, v: &Q) -> Cond
    where
        V: Borrow<Q>,
    {
        Cond::ne(self.name, stored(v))
    }
    pub fn lt<Q: Serialize + ?Sized>(self, v: &Q) -> Cond
    where
        V: Borrow<Q>,
    {
        Cond::lt(self.name, stored(v))
    }
    pub fn le<Q: Serialize + ?Sized>(self, v: &Q) -> Cond
    where
        V: Borrow<Q>,
    {
        Cond::le(self.name, stored(v))
    }
    pub fn gt<Q: Serialize + ?Sized>(self, v: &Q) -> Cond
    where
        V: Borrow<Q>,
    {
        Cond::gt(self.name, stored(v))
    }
    pub fn ge<Q: Serialize + ?Sized>(self, v: &Q) -> Cond
    where
        V: Borrow<Q>,
    {
        Cond::ge(self.name, stored(v))
    }
    /// The attribute is one of `values`.
    pub fn is_in<'a>(self, values: impl IntoIterator<Item = &'a V>) -> Cond
    where
        V: 'a,
    {
        Cond::Or(values.into_iter().map(|v| self.eq(v)).collect())
    }
    /// The item holds the attribute.
    pub fn exists(self) -> Cond {
        Cond::AttrExists(self.name.into())
    }
    /// The item does not hold the attribute.
    pub fn missing(self) -> Cond {
        Cond::AttrNotExists(self.name.into())
    }
}

impl<R, T: Serialize> Attr<R, Option<T>> {
    /// The attribute as its value when present: a comparison with it is
    /// false where the item lacks the attribute (`ne`: true).
    pub fn some(self) -> Attr<R, T> {
        Attr::declared(self.name)
    }

    /// The attribute holds `v` (an optional field compared with a value).
    pub fn is<Q: Serialize + ?Sized>(self, v: &Q) -> Cond
    where
        T: Borrow<Q>,
    {
        Cond::eq(self.name, stored(v))
    }
}

/// A value's word as serde stores it (a status for a log line), without
/// its JSON quotes: `success`, not `Success` or `"success"`.
pub fn word<V: Serialize + ?Sized>(v: &V) -> String {
    match stored(v) {
        Value::String(s) => s,
        other => other.to_string(),
    }
}

/// A family of attributes of record `R`, one per member (a name the
/// record's data chooses, e.g. one hold per attempt): `<prefix><member>`,
/// each holding a `V`. The record reads them back as a map (see
/// [`members`]).
pub struct Family<R, V> {
    prefix: &'static str,
    of: PhantomData<fn(&R) -> &V>,
}

impl<R, V> Clone for Family<R, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R, V> Copy for Family<R, V> {}

impl<R, V> Family<R, V> {
    /// Declared beside the record.
    pub const fn declared(prefix: &'static str) -> Self {
        Family {
            prefix,
            of: PhantomData,
        }
    }

    /// The attribute of `member`.
    fn name(self, member: &str) -> String {
        format!("{}{member}", self.prefix)
    }

    /// The member an attribute name holds, if it is of this family.
    pub fn member(self, attr: &str) -> Option<&str> {
        attr.strip_prefix(self.prefix)
    }
}

/// Decodes the members of `family` out of a whole item's attributes (for a
/// record's custom `Deserialize` of a flattened map): other attributes
/// are left alone, a member that does not decode is an error.
pub fn members<R, V: DeserializeOwned>(
    family: Family<R, V>,
    attrs: std::collections::BTreeMap<String, Value>,
) -> Result<std::collections::BTreeMap<String, V>, serde_json::Error> {
    attrs
        .into_iter()
        .filter_map(|(attr, value)| family.member(&attr).map(|m| (m.to_owned(), value)))
        .map(|(m, value)| Ok((m, serde_json::from_value(value)?)))
        .collect()
}

/// A number an update may `ADD` to.
pub trait Count {
    fn delta(n: Self) -> i64;
}
impl Count for i64 {
    fn delta(n: i64) -> i64 {
        n
    }
}
impl Count for u32 {
    fn delta(n: u32) -> i64 {
        i64::from(n)
    }
}
impl Count for crate::money::Paisa {
    fn delta(n: crate::money::Paisa) -> i64 {
        n.get()
    }
}

/// Changes to one stored record of kind `R`: what [`Store::update`]
/// applies, built from `R`'s attributes only.
pub struct Changes<R> {
    update: Update,
    of: PhantomData<fn(&R)>,
}

impl<R> Clone for Changes<R> {
    fn clone(&self) -> Self {
        Changes {
            update: self.update.clone(),
            of: PhantomData,
        }
    }
}

impl<R> std::fmt::Debug for Changes<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.update.fmt(f)
    }
}

impl<R> Default for Changes<R> {
    fn default() -> Self {
        Changes {
            update: Update::new(),
            of: PhantomData,
        }
    }
}

impl<R> PartialEq for Changes<R> {
    fn eq(&self, other: &Self) -> bool {
        self.update == other.update
    }
}

impl<R> Changes<R> {
    pub fn new() -> Self {
        Self::default()
    }

    /// `SET attr = v` (`&str` for a `String` field, and so on).
    pub fn set<V, Q>(mut self, attr: Attr<R, V>, v: &Q) -> Self
    where
        V: Serialize + Borrow<Q> + ?Sized,
        Q: Serialize + ?Sized,
    {
        self.update = self.update.set(attr.name, stored(v));
        self
    }

    /// `SET attr = v` on an optional field (`None` is [`Changes::remove`]
    /// or a `set` of `&None`, as the record's other writes store it).
    pub fn set_some<T, Q>(mut self, attr: Attr<R, Option<T>>, v: &Q) -> Self
    where
        T: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        self.update = self.update.set(attr.name, stored(v));
        self
    }

    /// `ADD attr n`: the one way a counted field changes once stored.
    pub fn add<V: Count>(mut self, attr: Attr<R, V>, n: V) -> Self {
        self.update = self.update.add(attr.name, V::delta(n));
        self
    }

    /// `ADD attr -n`.
    pub fn subtract<V: Count>(mut self, attr: Attr<R, V>, n: V) -> Self {
        self.update = self.update.add(attr.name, -V::delta(n));
        self
    }

    /// `REMOVE attr` of an optional field.
    pub fn remove<T>(mut self, attr: Attr<R, Option<T>>) -> Self {
        self.update = self.update.remove(attr.name);
        self
    }

    /// `SET` the attribute of `member` in `family`.
    pub fn set_member<V: Serialize>(mut self, family: Family<R, V>, member: &str, v: &V) -> Self {
        self.update = self.update.set(family.name(member), stored(v));
        self
    }

    /// `ADD` `n` to the attribute of `member` in `family`.
    pub fn add_member<V: Count>(mut self, family: Family<R, V>, member: &str, n: V) -> Self {
        self.update = self.update.add(family.name(member), V::delta(n));
        self
    }

    /// `REMOVE` the attribute of `member` in `family`.
    pub fn remove_member<V>(mut self, family: Family<R, V>, member: &str) -> Self {
        self.update = self.update.remove(family.name(member));
        self
    }

    /// Lists the record in `gsi2` at `entry`.
    pub fn index(mut self, entry: &Gsi2Entry) -> Self {
        self.update = self
            .update
            .set(Index::Gsi2.pk_attr(), entry.partition.clone())
            .set(Index::Gsi2.sk_attr(), entry.sort.clone());
        self
    }

    /// Lists the record at `entries` (its computed ones, for a record
    /// stored before an index listed it).
    pub fn enter(mut self, entries: impl IntoIterator<Item = Entry>) -> Self {
        for entry in entries {
            self.update = self
                .update
                .set(entry.index.pk_attr(), entry.partition)
                .set(entry.index.sk_attr(), entry.sort);
        }
        self
    }

    /// Moves the record within its `gsi2` partition to `sort` (a new due
    /// time), keeping the partition.
    pub fn index_sort(mut self, sort: impl Into<String>) -> Self {
        self.update = self.update.set(Index::Gsi2.sk_attr(), sort.into());
        self
    }

    /// Takes the record out of the sparse `index`.
    pub fn unindex(mut self, index: Index) -> Self {
        self.update = self.update.unindex(index);
        self
    }

    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        self.update.set.is_empty() && self.update.add.is_empty() && self.update.remove.is_empty()
    }

    /// Whether no attribute would be set.
    pub fn sets_nothing(&self) -> bool {
        self.update.set.is_empty()
    }
}

impl<R> From<Changes<R>> for Update {
    fn from(changes: Changes<R>) -> Update {
        changes.update
    }
}

/// Declares the stored attributes of a record as [`Attr`] constants, each
/// checked against the record's field of that name and type:
///
/// ```ignore
/// attrs! { Payment {
///     STATUS: PaymentStatus = status,
///     CHECKED_AT: Option<Timestamp> = checks.checked_at,
/// } }
/// attrs! { Event { KIND: EventType = kind as "type" } }
/// ```
///
/// One constant per stored field, named as the field in capitals (so
/// code elsewhere can rely on the name); a field serde renames says its
/// stored name with `as`.
///
/// ```ignore
/// ```
#[macro_export]
macro_rules! attrs {
    ($record:ident {
        $($konst:ident : $ty:ty = $first:ident $(. $rest:ident)* $(as $name:literal)?),* $(,)?
    }) => {
        // Every stored field has its constant, used or not yet.
        #[allow(dead_code)]
        impl $record {
            $(
                pub const $konst: $crate::domain::record::Attr<$record, $ty> =
                    $crate::domain::record::Attr::declared(
                        $crate::attrs!(@name [$($name)?] $first $($rest)*)
                    );
            )*
        }
        const _: () = {
            #[allow(dead_code)]
            fn fields_exist(r: &$record) {
                $( let _: &$ty = &r.$first $(. $rest)*; )*
            }
        };
    };
    (@name [$name:literal] $($path:ident)+) => { $name };
    (@name [] $($path:ident)+) => { $crate::attrs!(@last $($path)+) };
    (@last $only:ident) => { stringify!($only) };
    (@last $first:ident $($rest:ident)+) => { $crate::attrs!(@last $($rest)+) };
}

/// The item for `record` stored at `key`, listed in `indexes`.
fn item_of<T: Serialize + ?Sized>(
    record: &T,
    key: &Key,
    indexes: &[Entry],
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
    for entry in indexes {
        item.insert(
            entry.index.pk_attr().into(),
            Value::String(entry.partition.clone()),
        );
        item.insert(
            entry.index.sk_attr().into(),
            Value::String(entry.sort.clone()),
        );
    }
    Ok(item)
}

/// The item for `record` stored at `key`, in no index: for a record whose
/// key is not its own to say (the edge's idempotency records).
pub fn item_at<T: Serialize>(record: &T, key: &Key) -> Result<Item, StoreError> {
    item_of(record, key, &[])
}

/// Which records of a list one page holds: `limit` of them after the
/// first `offset` counted from `seek` (the list's start, or a record's
/// sort key: its id in every list).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub offset: usize,
    pub limit: usize,
    pub seek: Seek,
}

impl Window {
    /// The first `limit` records.
    pub fn first(limit: usize) -> Self {
        Window {
            offset: 0,
            limit,
            seek: Seek::Start,
        }
    }

    /// `limit` records after `offset` from the start.
    pub fn at(offset: usize, limit: usize) -> Self {
        Window {
            offset,
            limit,
            seek: Seek::Start,
        }
    }

    /// The records of this window of `query`.
    pub async fn read(&self, store: &dyn Store, query: &Query) -> Result<Vec<Item>, StoreError> {
        seek_window(store, query, &self.seek, self.offset, self.limit).await
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
    let (items, total) = tokio::join!(window.read(store, query), store.count(query));
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
        let item = item_of(&t, &key, &[Entry::gsi1("P", "x")]);
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
        let Ok(item) = item_at(&t, &key) else {
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
    fn attributes_write_their_values_as_serde_stores_them() {
        use crate::domain::payments::{Payment, PaymentStatus};
        use crate::time::Timestamp;
        assert_eq!(
            Payment::STATUS.eq(&PaymentStatus::Pending),
            Cond::eq("status", "pending")
        );
        assert_eq!(
            Payment::REVIEW.missing(),
            Cond::AttrNotExists("review".into())
        );
        assert_eq!(
            Payment::CHECKED_AT.name(),
            "checked_at",
            "a flattened field"
        );
        let Some(at) = Timestamp::from_unix_millis(1_700_000_000_123) else {
            panic!("a valid time")
        };
        let update: Update = Changes::<Payment>::new()
            .set(Payment::STATUS, &PaymentStatus::Success)
            .set(Payment::UPDATED_AT, &at)
            .set_some(Payment::FAILURE_REASON, "declined")
            .add(Payment::AMOUNT_RESERVED, crate::money::Paisa::ZERO)
            .remove(Payment::RECHECK_UNTIL)
            .unindex(Index::Gsi2)
            .into();
        assert_eq!(
            update,
            Update::new()
                .set("status", "success")
                .set("updated_at", at.to_rfc3339())
                .set("failure_reason", "declined")
                .add("amount_reserved", 0)
                .remove("recheck_until")
                .unindex(Index::Gsi2)
        );
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
