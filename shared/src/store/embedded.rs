//! The embedded backend: a redb database (a file for the dev server, memory
//! for tests) behind the [`Store`] port.
//!
//! Layout: the table `items` maps `(pk, sk)` to the item's JSON bytes; the
//! tables `gsi1` and `gsi2` map `(index pk, index sk, pk, sk)` to `()` and
//! hold exactly the items whose two index attributes are both present (a
//! sparse index). Every write is one redb write transaction that reads the
//! current item, evaluates the condition and rewrites the item and its index
//! entries, so conditions and writes are atomic and the indexes never lag
//! (stricter than DynamoDB, whose GSIs are eventually consistent). redb runs
//! one write transaction at a time, so concurrent writers are serialised and
//! [`TxReason::Conflict`] never happens here.
//!
//! Group commit: one writer thread runs every write waiting at that moment
//! in one redb transaction, one after another (each sees the ones before
//! it), and commits them with one fsync; each is answered only once that
//! commit returned. A write checks its conditions before it changes
//! anything, so a refused one leaves the batch as it found it; a failure of
//! the database itself fails the whole batch, none of it committed.
//!
//! Beyond what the brief of [`super`] states, requests DynamoDB refuses are
//! refused here too ([`StoreError::Invalid`]): an empty `pk`/`sk`, an index
//! key attribute that is not a non-empty string, an update naming a key
//! attribute or one attribute twice, an empty transaction, a `Between` whose
//! bounds are reversed, a `limit` of 0, an ordering condition against a
//! constant that is neither a number nor a string. Those checks live in
//! the store's `validate` module, shared with the DynamoDB backend; only
//! those that need the stored item are made here, while applying an update (`add`
//! on a non-integer, an `add` that overflows `i64`, an index attribute an
//! `add` turns into a number).

use std::any::Any;
use std::fmt;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use redb::backends::InMemoryBackend;
use redb::{
    AccessGuard, Database, ReadableDatabase, ReadableTable, StorageError, Table, TableDefinition,
    WriteTransaction,
};
use serde_json::{Map, Value};

use super::cond;
use super::validate::{
    validate_cond, validate_item, validate_key, validate_query, validate_sk, validate_start_after,
    validate_transaction, validate_update,
};
use super::{
    Cond, Index, Item, Key, PK, Query, QueryPage, SK, SkCond, Store, StoreError, Stored, TxOp,
    TxReason, Update,
};

type MainKey = (&'static str, &'static str);
type IndexKey = (&'static str, &'static str, &'static str, &'static str);

const ITEMS: TableDefinition<MainKey, &[u8]> = TableDefinition::new("items");
const GSI1: TableDefinition<IndexKey, ()> = TableDefinition::new("gsi1");
const GSI2: TableDefinition<IndexKey, ()> = TableDefinition::new("gsi2");
const GSI3: TableDefinition<IndexKey, ()> = TableDefinition::new("gsi3");
const GSI4: TableDefinition<IndexKey, ()> = TableDefinition::new("gsi4");
const GSI5: TableDefinition<IndexKey, ()> = TableDefinition::new("gsi5");
const GSI6: TableDefinition<IndexKey, ()> = TableDefinition::new("gsi6");

fn index_table(index: Index) -> TableDefinition<'static, IndexKey, ()> {
    match index {
        Index::Gsi1 => GSI1,
        Index::Gsi2 => GSI2,
        Index::Gsi3 => GSI3,
        Index::Gsi4 => GSI4,
        Index::Gsi5 => GSI5,
        Index::Gsi6 => GSI6,
    }
}

/// Maps a redb (or any displayable) error to [`StoreError::Backend`].
fn backend<E: fmt::Display>(context: &str) -> impl FnOnce(E) -> StoreError + '_ {
    move |e| StoreError::Backend(format!("{context}: {e}"))
}

/// [`Store`] on redb. Cheap to clone (the database is shared).
#[derive(Clone)]
pub struct EmbeddedStore {
    db: Arc<Database>,
    writer: Arc<Writer>,
    instance: u64,
}

impl fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
    }
}

/// Creates `path`'s parent directories when missing.
fn make_parent(path: &Path) -> Result<(), StoreError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| {
            StoreError::Backend(format!("create directory {}: {e}", parent.display()))
        })?;
    }
    Ok(())
}

impl EmbeddedStore {
    /// Opens the database file at `path`, creating it (and its parent
    /// directories) when missing.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        make_parent(path)?;
        let db = Database::create(path)
            .map_err(|e| StoreError::Backend(format!("open {}: {e}", path.display())))?;
        Self::init(db)
    }

    /// [`open`](Self::open) with redb's page cache bounded to
    /// `cache_bytes` (redb's default lets it grow to 1 GiB): a benchmark
    /// separates what it measures from the cache this way.
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        make_parent(path)?;
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(|e| StoreError::Backend(format!("open {}: {e}", path.display())))?;
        Self::init(db)
    }

    /// A fresh database held in memory (for tests).
    pub fn in_memory() -> Result<Self, StoreError> {
        let db = Database::builder()
            .set_cache_size(16 * 1024 * 1024)
            .create_with_backend(InMemoryBackend::new())
            .map_err(backend("create in-memory database"))?;
        Self::init(db)
    }

    /// Write transactions committed (or tried) so far: each holds every
    /// write that was waiting when it began (group commit).
    pub fn commits(&self) -> u64 {
        self.writer.commits()
    }

    /// Every item of the table, in key order: a whole-store read for tools
    /// and the stored-shape fixture test, never for a request.
    pub fn scan_all(&self) -> Result<Vec<Item>, StoreError> {
        let txn = self.db.begin_read().map_err(backend("scan: begin read"))?;
        let items = txn.open_table(ITEMS).map_err(backend("scan: open items"))?;
        let mut all = Vec::new();
        for entry in items.iter().map_err(backend("scan: iterate"))? {
            let (_, bytes) = entry.map_err(backend("scan: read"))?;
            all.push(decode(bytes.value())?);
        }
        Ok(all)
    }

    /// Creates the tables so read transactions always find them.
    fn init(db: Database) -> Result<Self, StoreError> {
        let txn = db.begin_write().map_err(backend("init: begin write"))?;
        {
            txn.open_table(ITEMS).map_err(backend("init: open items"))?;
            for index in Index::ALL {
                txn.open_table(index_table(index))
                    .map_err(backend("init: open index"))?;
            }
        }
        txn.commit().map_err(backend("init: commit"))?;
        let db = Arc::new(db);
        Ok(Self {
            writer: Arc::new(Writer::start(Arc::clone(&db))?),
            db,
            instance: super::new_instance(),
        })
    }

    /// Runs `f` in the writer's next transaction ([`Writer`]); answers
    /// once that transaction is committed. `f` must check before it
    /// changes anything: an `Err` other than [`StoreError::Backend`] must
    /// leave the tables as it found them.
    async fn write<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tables<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.writer.send(Job {
            run: Box::new(move |t| f(t).map(|v| Box::new(v) as Box<dyn Any + Send>)),
            reply,
        })?;
        let value = answer
            .await
            .map_err(|_| StoreError::Backend(format!("{what}: the writer dropped the write")))?
            .map_err(|e| match e {
                StoreError::Backend(m) => StoreError::Backend(format!("{what}: {m}")),
                other => other,
            })?;
        value
            .downcast::<T>()
            .map(|v| *v)
            .map_err(|_| StoreError::Backend(format!("{what}: an answer of another type")))
    }

    fn scan(&self, q: &Query, paged: bool, keep: bool) -> Result<Scan, StoreError> {
        validate_query(q, paged)?;
        let limit = if paged { q.limit } else { None };
        let (sk_lo, sk_hi) = sk_bounds(&q.sk)?;
        let mut out = Collector {
            filter: q.filter.as_ref(),
            limit,
            keep,
            examined: 0,
            scan: Scan::default(),
        };
        let txn = self.db.begin_read().map_err(backend("query: begin read"))?;
        let items = txn
            .open_table(ITEMS)
            .map_err(backend("query: open items"))?;
        let needs_item = keep || q.filter.is_some();
        match q.index {
            None => {
                let start = match (&q.start_after, paged) {
                    (Some(start), true) => Some(table_position(q, start)?),
                    _ => None,
                };
                let Some((lo, hi)) = key_range::<2>(&q.pk, sk_lo, sk_hi, start, q.forward) else {
                    return Ok(out.scan);
                };
                let range = items
                    .range((lo.as_ref().map(pair), hi.as_ref().map(pair)))
                    .map_err(backend("query: range"))?;
                let entries: Box<dyn Iterator<Item = MainEntry<'_>>> = if q.forward {
                    Box::new(range)
                } else {
                    Box::new(range.rev())
                };
                for entry in entries {
                    let (key, value) = entry.map_err(backend("query: read"))?;
                    let (pk, sk) = key.value();
                    let item = if needs_item {
                        Some(decode(value.value())?)
                    } else {
                        None
                    };
                    let last = || key_item(pk, sk);
                    if !out.visit(item, last) {
                        break;
                    }
                }
            }
            Some(index) => {
                let table = txn
                    .open_table(index_table(index))
                    .map_err(backend("query: open index"))?;
                let start = match (&q.start_after, paged) {
                    (Some(start), true) => Some(index_position(q, start)?),
                    _ => None,
                };
                let Some((lo, hi)) = key_range::<4>(&q.pk, sk_lo, sk_hi, start, q.forward) else {
                    return Ok(out.scan);
                };
                let range = table
                    .range((lo.as_ref().map(quad), hi.as_ref().map(quad)))
                    .map_err(backend("query: index range"))?;
                let entries: Box<dyn Iterator<Item = IndexEntry<'_>>> = if q.forward {
                    Box::new(range)
                } else {
                    Box::new(range.rev())
                };
                for entry in entries {
                    let (key, _) = entry.map_err(backend("query: read index"))?;
                    let (ipk, isk, pk, sk) = key.value();
                    let item = if needs_item {
                        let guard = items
                            .get((pk, sk))
                            .map_err(backend("query: read indexed item"))?
                            .ok_or_else(|| {
                                StoreError::Backend(format!(
                                    "{} entry for ({pk}, {sk}) has no item",
                                    index.name()
                                ))
                            })?;
                        Some(decode(guard.value())?)
                    } else {
                        None
                    };
                    let last = || {
                        let mut k = key_item(pk, sk);
                        k.insert(index.pk_attr().into(), Value::from(ipk));
                        k.insert(index.sk_attr().into(), Value::from(isk));
                        k
                    };
                    if !out.visit(item, last) {
                        break;
                    }
                }
            }
        }
        Ok(out.scan)
    }
}

type MainEntry<'a> =
    Result<(AccessGuard<'a, MainKey>, AccessGuard<'a, &'static [u8]>), StorageError>;
type IndexEntry<'a> = Result<(AccessGuard<'a, IndexKey>, AccessGuard<'a, ()>), StorageError>;

/// Result of a scan: the kept items, how many matched, where a page stopped.
#[derive(Default)]
struct Scan {
    items: Vec<Item>,
    matched: u64,
    last_key: Option<Item>,
}

struct Collector<'q> {
    filter: Option<&'q Cond>,
    limit: Option<usize>,
    keep: bool,
    examined: usize,
    scan: Scan,
}

impl Collector<'_> {
    /// Examines one item (`None` when neither kept nor filtered, so not
    /// loaded); returns false when the limit stops the scan.
    fn visit(&mut self, item: Option<Item>, key: impl FnOnce() -> Item) -> bool {
        self.examined += 1;
        let matched = match (self.filter, &item) {
            (Some(filter), Some(item)) => cond::eval(filter, Some(item)),
            _ => true,
        };
        if matched {
            self.scan.matched += 1;
            if let (true, Some(item)) = (self.keep, item) {
                self.scan.items.push(item);
            }
        }
        let at_limit = self.limit.is_some_and(|limit| self.examined >= limit);
        if at_limit {
            self.scan.last_key = Some(key());
        }
        !at_limit
    }
}

/// Writes wait here for the store's one writer thread, which runs every
/// write waiting at once in one redb transaction and commits it once
/// (group commit: one durable commit for many requests).
///
/// Each write checks its conditions before it changes anything, so one
/// that is refused leaves the shared transaction as it found it and the
/// others go on; a failure of the database itself while writing aborts
/// the whole batch and every write in it gets the error. A write is
/// answered only after the commit that holds it returned: an `Ok` is as
/// durable as before.
struct Writer {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Transactions committed (or tried) so far.
    commits: Arc<std::sync::atomic::AtomicU64>,
}

/// The most writes one transaction takes.
const MAX_BATCH: usize = 256;

type Answer = Result<Box<dyn Any + Send>, StoreError>;

struct Job {
    run: Box<dyn for<'t> FnOnce(&mut Tables<'t>) -> Answer + Send>,
    reply: tokio::sync::oneshot::Sender<Answer>,
}

impl Writer {
    fn start(db: Arc<Database>) -> Result<Writer, StoreError> {
        let (jobs, waiting) = std::sync::mpsc::channel::<Job>();
        let commits = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = Arc::clone(&commits);
        let thread = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || {
                while let Ok(first) = waiting.recv() {
                    let mut batch = vec![first];
                    while batch.len() < MAX_BATCH {
                        match waiting.try_recv() {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                    commit_batch(&db, batch);
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
            .map_err(backend("start the store's writer"))?;
        Ok(Writer {
            jobs: Some(jobs),
            thread: Some(thread),
            commits,
        })
    }

    /// Transactions committed (or tried) so far: writes per commit is the
    /// batching at work.
    fn commits(&self) -> u64 {
        self.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn send(&self, job: Job) -> Result<(), StoreError> {
        match &self.jobs {
            Some(jobs) => jobs
                .send(job)
                .map_err(|_| StoreError::Backend("the store's writer has stopped".into())),
            None => Err(StoreError::Backend("the store is closed".into())),
        }
    }
}

impl Drop for Writer {
    /// Lets the writer finish what it holds and waits for it, so the
    /// database file is closed when the last store handle is gone.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the store's writer panicked");
            }
        }
    }
}

/// Runs `batch` in one write transaction and commits it once; answers
/// each write after the commit (or with the failure that stopped it).
fn commit_batch(db: &Database, batch: Vec<Job>) {
    let fail_all = |batch: Vec<(tokio::sync::oneshot::Sender<Answer>, Option<Answer>)>,
                    e: &StoreError| {
        for (reply, _) in batch {
            let _ = reply.send(Err(e.clone()));
        }
    };
    let txn = match db.begin_write() {
        Ok(txn) => txn,
        Err(e) => {
            let e = backend("begin write")(e);
            for job in batch {
                let _ = job.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    let mut answers = Vec::with_capacity(batch.len());
    let mut broken: Option<StoreError> = None;
    match Tables::open(&txn) {
        Ok(mut tables) => {
            for job in batch {
                if broken.is_some() {
                    answers.push((job.reply, None));
                    continue;
                }
                // A write that panics fails its batch, not the writer.
                let run = std::panic::AssertUnwindSafe(|| (job.run)(&mut tables));
                let answer = std::panic::catch_unwind(run).unwrap_or_else(|_| {
                    Err(StoreError::Backend(
                        "a write panicked; its batch was aborted".into(),
                    ))
                });
                if let Err(e @ StoreError::Backend(_)) = &answer {
                    // The transaction may hold part of this write.
                    broken = Some(e.clone());
                }
                answers.push((job.reply, Some(answer)));
            }
        }
        Err(e) => {
            broken = Some(e);
            answers.extend(batch.into_iter().map(|job| (job.reply, None)));
        }
    }
    if let Some(e) = broken {
        if let Err(abort) = txn.abort() {
            tracing::warn!(error = %abort, "aborting a store write failed");
        }
        return fail_all(answers, &e);
    }
    if let Err(e) = txn.commit() {
        return fail_all(answers, &backend("commit")(e));
    }
    for (reply, answer) in answers {
        if let Some(answer) = answer {
            let _ = reply.send(answer);
        }
    }
}

/// The open tables of one write transaction.
struct Tables<'t> {
    items: Table<'t, MainKey, &'static [u8]>,
    gsi1: Table<'t, IndexKey, ()>,
    gsi2: Table<'t, IndexKey, ()>,
    gsi3: Table<'t, IndexKey, ()>,
    gsi4: Table<'t, IndexKey, ()>,
    gsi5: Table<'t, IndexKey, ()>,
    gsi6: Table<'t, IndexKey, ()>,
}

impl<'t> Tables<'t> {
    fn open(txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            items: txn.open_table(ITEMS).map_err(backend("open items"))?,
            gsi1: txn.open_table(GSI1).map_err(backend("open gsi1"))?,
            gsi2: txn.open_table(GSI2).map_err(backend("open gsi2"))?,
            gsi3: txn.open_table(GSI3).map_err(backend("open gsi3"))?,
            gsi4: txn.open_table(GSI4).map_err(backend("open gsi4"))?,
            gsi5: txn.open_table(GSI5).map_err(backend("open gsi5"))?,
            gsi6: txn.open_table(GSI6).map_err(backend("open gsi6"))?,
        })
    }

    fn index(&mut self, index: Index) -> &mut Table<'t, IndexKey, ()> {
        match index {
            Index::Gsi1 => &mut self.gsi1,
            Index::Gsi2 => &mut self.gsi2,
            Index::Gsi3 => &mut self.gsi3,
            Index::Gsi4 => &mut self.gsi4,
            Index::Gsi5 => &mut self.gsi5,
            Index::Gsi6 => &mut self.gsi6,
        }
    }

    fn load(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        let guard = self
            .items
            .get((key.pk.as_str(), key.sk.as_str()))
            .map_err(backend("read item"))?;
        guard.map(|g| decode(g.value())).transpose()
    }

    /// Replaces `old` (the stored item at `key`, if any) by `new` (`None`
    /// deletes), keeping both indexes in step.
    fn save(
        &mut self,
        key: &Key,
        old: Option<&Item>,
        new: Option<&Item>,
    ) -> Result<(), StoreError> {
        let (pk, sk) = (key.pk.as_str(), key.sk.as_str());
        for index in Index::ALL {
            let before = index_key(index, old);
            let after = index_key(index, new);
            if before == after {
                continue;
            }
            let table = self.index(index);
            if let Some((ipk, isk)) = before {
                table
                    .remove((ipk, isk, pk, sk))
                    .map_err(backend("remove index entry"))?;
            }
            if let Some((ipk, isk)) = after {
                table
                    .insert((ipk, isk, pk, sk), ())
                    .map_err(backend("insert index entry"))?;
            }
        }
        match new {
            Some(item) => {
                let bytes = serde_json::to_vec(item).map_err(backend("encode item"))?;
                self.items
                    .insert((pk, sk), bytes.as_slice())
                    .map_err(backend("write item"))?;
            }
            None => {
                self.items
                    .remove((pk, sk))
                    .map_err(backend("delete item"))?;
            }
        }
        Ok(())
    }
}

fn decode(bytes: &[u8]) -> Result<Item, StoreError> {
    serde_json::from_slice(bytes).map_err(backend("decode stored item"))
}

fn key_item(pk: &str, sk: &str) -> Item {
    let mut item = Map::new();
    item.insert(PK.into(), Value::from(pk));
    item.insert(SK.into(), Value::from(sk));
    item
}

/// The index key of an item: both attributes present (and, items being
/// validated on write, strings).
fn index_key(index: Index, item: Option<&Item>) -> Option<(&str, &str)> {
    let item = item?;
    let pk = item.get(index.pk_attr())?.as_str()?;
    let sk = item.get(index.sk_attr())?.as_str()?;
    Some((pk, sk))
}

fn check(cond: Option<&Cond>, current: Option<&Item>) -> bool {
    cond.is_none_or(|c| cond::eval(c, current))
}

/// The item after `update` (a missing item starts as its key).
fn apply_update(key: &Key, current: Option<Item>, update: &Update) -> Result<Item, StoreError> {
    let mut item = current.unwrap_or_else(|| key_item(&key.pk, &key.sk));
    for (attr, value) in &update.set {
        item.insert(attr.clone(), value.clone());
    }
    for (attr, delta) in &update.add {
        let base = match item.get(attr) {
            None => 0,
            Some(value) => value.as_i64().ok_or_else(|| {
                StoreError::Invalid(format!("add on {attr}: {value} is not an integer"))
            })?,
        };
        let sum = base
            .checked_add(*delta)
            .ok_or_else(|| StoreError::Invalid(format!("add on {attr} overflows")))?;
        item.insert(attr.clone(), Value::from(sum));
    }
    for attr in &update.remove {
        item.remove(attr);
    }
    validate_item(&item)?;
    Ok(item)
}

/// The sort-key range of a condition: `(lower, upper)` over sort keys.
fn sk_bounds(sk: &SkCond) -> Result<(Bound<String>, Bound<String>), StoreError> {
    use Bound::{Excluded, Included, Unbounded};
    validate_sk(sk)?;
    Ok(match sk {
        SkCond::Any => (Unbounded, Unbounded),
        SkCond::Eq(s) => (Included(s.clone()), Included(s.clone())),
        SkCond::BeginsWith(prefix) => (
            Included(prefix.clone()),
            prefix_end(prefix).map_or(Unbounded, Excluded),
        ),
        SkCond::Between(lo, hi) => (Included(lo.clone()), Included(hi.clone())),
        SkCond::Lt(s) => (Unbounded, Excluded(s.clone())),
        SkCond::Le(s) => (Unbounded, Included(s.clone())),
        SkCond::Gt(s) => (Excluded(s.clone()), Unbounded),
        SkCond::Ge(s) => (Included(s.clone()), Unbounded),
    })
}

/// The smallest string above every string starting with `prefix`, if any.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// The smallest string above `s`.
fn successor(s: &str) -> String {
    format!("{s}\0")
}

/// A key of `N` strings (2 for the table, 4 for an index) starting with
/// `pk, sk` and padded with the smallest string.
fn position<const N: usize>(pk: &str, sk: &str) -> [String; N] {
    std::array::from_fn(|i| match i {
        0 => pk.to_owned(),
        1 => sk.to_owned(),
        _ => String::new(),
    })
}

/// The key range of partition `pk` within the sort-key bounds, continuing
/// strictly after `start` in the scan direction; `None` when empty. The
/// lower bound is inclusive unless it is `start`, the upper one exclusive.
#[allow(clippy::type_complexity)]
fn key_range<const N: usize>(
    pk: &str,
    sk_lo: Bound<String>,
    sk_hi: Bound<String>,
    start: Option<[String; N]>,
    forward: bool,
) -> Option<(Bound<[String; N]>, Bound<[String; N]>)> {
    let mut lo = match sk_lo {
        Bound::Unbounded => position(pk, ""),
        Bound::Included(s) => position(pk, &s),
        Bound::Excluded(s) => position(pk, &successor(&s)),
    };
    let mut lo_inclusive = true;
    let mut hi = match sk_hi {
        Bound::Unbounded => position(&successor(pk), ""),
        Bound::Included(s) => position(pk, &successor(&s)),
        Bound::Excluded(s) => position(pk, &s),
    };
    if let Some(start) = start {
        if forward && start >= lo {
            lo = start;
            lo_inclusive = false;
        } else if !forward && start < hi {
            hi = start;
        }
    }
    if lo >= hi {
        return None;
    }
    let lo = if lo_inclusive {
        Bound::Included(lo)
    } else {
        Bound::Excluded(lo)
    };
    Some((lo, Bound::Excluded(hi)))
}

fn pair([a, b]: &[String; 2]) -> (&str, &str) {
    (a, b)
}

fn quad([a, b, c, d]: &[String; 4]) -> (&str, &str, &str, &str) {
    (a, b, c, d)
}

/// `start_after` of a table query as a table position.
fn table_position(q: &Query, start: &Item) -> Result<[String; 2], StoreError> {
    let start = validate_start_after(q, start)?;
    Ok([start.pk, start.sk].map(str::to_owned))
}

/// `start_after` of an index query as an index position.
fn index_position(q: &Query, start: &Item) -> Result<[String; 4], StoreError> {
    let start = validate_start_after(q, start)?;
    let (ipk, isk) = start
        .index
        .ok_or_else(|| StoreError::Backend("internal: index position for a table query".into()))?;
    Ok([ipk, isk, start.pk, start.sk].map(str::to_owned))
}

impl EmbeddedStore {
    /// The item at `key` through `f`, in one read transaction.
    fn read_item<T>(
        &self,
        key: &Key,
        f: impl FnOnce(&[u8]) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        validate_key(key)?;
        let txn = self.db.begin_read().map_err(backend("get: begin read"))?;
        let items = txn.open_table(ITEMS).map_err(backend("get: open items"))?;
        let guard = items
            .get((key.pk.as_str(), key.sk.as_str()))
            .map_err(backend("get: read"))?;
        guard.map(|g| f(g.value())).transpose()
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn single_process(&self) -> bool {
        true
    }

    fn instance(&self) -> u64 {
        self.instance
    }

    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        self.read_item(key, decode)
    }

    async fn get_stored(&self, key: &Key) -> Result<Option<Stored>, StoreError> {
        self.read_item(key, |bytes| Ok(Stored::json(bytes.to_vec())))
    }

    async fn put(&self, item: Item, cond: Option<Cond>) -> Result<(), StoreError> {
        let key = validate_item(&item)?;
        validate_cond(cond.as_ref())?;
        self.write("put", move |t| {
            let current = t.load(&key)?;
            if !check(cond.as_ref(), current.as_ref()) {
                return Err(StoreError::ConditionFailed);
            }
            t.save(&key, current.as_ref(), Some(&item))
        })
        .await
    }

    async fn update(
        &self,
        key: &Key,
        update: Update,
        cond: Option<Cond>,
    ) -> Result<Item, StoreError> {
        validate_key(key)?;
        validate_update(&update)?;
        validate_cond(cond.as_ref())?;
        let key = key.clone();
        self.write("update", move |t| {
            let current = t.load(&key)?;
            if !check(cond.as_ref(), current.as_ref()) {
                return Err(StoreError::ConditionFailed);
            }
            let new = apply_update(&key, current.clone(), &update)?;
            t.save(&key, current.as_ref(), Some(&new))?;
            Ok(new)
        })
        .await
    }

    async fn delete(&self, key: &Key, cond: Option<Cond>) -> Result<(), StoreError> {
        validate_key(key)?;
        validate_cond(cond.as_ref())?;
        let key = key.clone();
        self.write("delete", move |t| {
            let current = t.load(&key)?;
            if !check(cond.as_ref(), current.as_ref()) {
                return Err(StoreError::ConditionFailed);
            }
            if current.is_some() {
                t.save(&key, current.as_ref(), None)?;
            }
            Ok(())
        })
        .await
    }

    async fn transact(&self, ops: Vec<TxOp>) -> Result<(), StoreError> {
        let keys = validate_transaction(&ops)?;
        let keyed: Vec<(Key, TxOp)> = keys.into_iter().zip(ops).collect();
        self.write("transact", move |t| {
            let mut currents = Vec::with_capacity(keyed.len());
            let mut reasons = Vec::with_capacity(keyed.len());
            for (key, op) in &keyed {
                let current = t.load(key)?;
                let holds = match op {
                    TxOp::Put { cond, .. }
                    | TxOp::Update { cond, .. }
                    | TxOp::Delete { cond, .. } => check(cond.as_ref(), current.as_ref()),
                    TxOp::Check { cond, .. } => cond::eval(cond, current.as_ref()),
                };
                reasons.push(if holds {
                    TxReason::None
                } else {
                    TxReason::ConditionFailed
                });
                currents.push(current);
            }
            if reasons.iter().any(|r| *r != TxReason::None) {
                return Err(StoreError::TransactionCanceled { reasons });
            }
            // Every new item first (an update may be refused), then the
            // writes: a refusal leaves the batch's transaction untouched.
            let mut writes = Vec::with_capacity(keyed.len());
            for ((key, op), current) in keyed.iter().zip(&currents) {
                match op {
                    TxOp::Put { item, .. } => writes.push((key, current, Some(item.clone()))),
                    TxOp::Update { update, .. } => {
                        let new = apply_update(key, current.clone(), update)?;
                        writes.push((key, current, Some(new)));
                    }
                    TxOp::Delete { .. } if current.is_some() => writes.push((key, current, None)),
                    TxOp::Delete { .. } | TxOp::Check { .. } => {}
                }
            }
            for (key, current, new) in writes {
                t.save(key, current.as_ref(), new.as_ref())?;
            }
            Ok(())
        })
        .await
    }

    async fn query(&self, query: &Query) -> Result<QueryPage, StoreError> {
        let scan = self.scan(query, true, true)?;
        Ok(QueryPage {
            items: scan.items,
            last_key: scan.last_key,
        })
    }

    async fn count(&self, query: &Query) -> Result<u64, StoreError> {
        Ok(self.scan(query, false, false)?.matched)
    }
}

#[cfg(test)]
impl EmbeddedStore {
    /// Checks that the indexes hold exactly the entries the items call for.
    fn assert_indexes_consistent(&self) {
        use std::collections::BTreeSet;
        let txn = self.db.begin_read().unwrap();
        let items = txn.open_table(ITEMS).unwrap();
        for index in Index::ALL {
            let mut expected = BTreeSet::new();
            for entry in items.iter().unwrap() {
                let (k, v) = entry.unwrap();
                let item = decode(v.value()).unwrap();
                let (pk, sk) = k.value();
                assert_eq!(Key::of(&item), Some(Key::new(pk, sk)));
                if let Some((ipk, isk)) = index_key(index, Some(&item)) {
                    expected.insert([ipk, isk, pk, sk].map(str::to_owned));
                }
            }
            let table = txn.open_table(index_table(index)).unwrap();
            let actual: BTreeSet<[String; 4]> = table
                .iter()
                .unwrap()
                .map(|e| {
                    let (key, _) = e.unwrap();
                    let (a, b, c, d) = key.value();
                    [a, b, c, d].map(str::to_owned)
                })
                .collect();
            assert_eq!(actual, expected, "{} out of step", index.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Query;
    use serde_json::json;

    async fn memory_store() -> Arc<dyn Store> {
        Arc::new(EmbeddedStore::in_memory().expect("in-memory store"))
    }

    mod conformance {
        crate::store_conformance_tests!(super::memory_store);
    }

    fn obj(v: Value) -> Item {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    /// One job of a hand-made batch, and where its answer arrives.
    fn job(
        f: impl FnOnce(&mut Tables<'_>) -> Result<(), StoreError> + Send + 'static,
    ) -> (Job, tokio::sync::oneshot::Receiver<Answer>) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let run =
            Box::new(move |t: &mut Tables<'_>| f(t).map(|v| Box::new(v) as Box<dyn Any + Send>));
        (Job { run, reply }, answer)
    }

    fn put(
        id: &str,
        cond: Option<Cond>,
    ) -> impl FnOnce(&mut Tables<'_>) -> Result<(), StoreError> + Send + 'static {
        let item = obj(json!({"pk": id, "sk": "X", "n": "text"}));
        move |t| {
            let key = Key::new(item["pk"].as_str().unwrap_or_default(), "X");
            let current = t.load(&key)?;
            if !check(cond.as_ref(), current.as_ref()) {
                return Err(StoreError::ConditionFailed);
            }
            t.save(&key, current.as_ref(), Some(&item))
        }
    }

    /// Writes of one batch run in order in one transaction: a later one
    /// sees an earlier one's write, a refused one (by its condition, or by
    /// an update it cannot apply, after a put of the same transaction)
    /// leaves nothing behind, and the others are committed.
    #[tokio::test]
    async fn a_refused_write_in_a_batch_leaves_the_others_committed() {
        let store = EmbeddedStore::in_memory().expect("store");
        let (first, a) = job(put("A", None));
        let (again, b) = job(put("A", Some(Cond::NotExists)));
        let ops = vec![
            TxOp::Put {
                item: obj(json!({"pk": "T", "sk": "X"})),
                cond: None,
            },
            TxOp::Update {
                key: Key::new("A", "X"),
                update: Update::new().add("n", 1),
                cond: None,
            },
        ];
        let keys = validate_transaction(&ops).expect("valid");
        let keyed: Vec<(Key, TxOp)> = keys.into_iter().zip(ops).collect();
        let (tx, c) = job(move |t| {
            let mut currents = Vec::new();
            for (key, _) in &keyed {
                currents.push(t.load(key)?);
            }
            let mut writes = Vec::new();
            for ((key, op), current) in keyed.iter().zip(&currents) {
                match op {
                    TxOp::Put { item, .. } => writes.push((key, current, Some(item.clone()))),
                    TxOp::Update { update, .. } => writes.push((
                        key,
                        current,
                        Some(apply_update(key, current.clone(), update)?),
                    )),
                    _ => {}
                }
            }
            for (key, current, new) in writes {
                t.save(key, current.as_ref(), new.as_ref())?;
            }
            Ok(())
        });
        let (last, d) = job(put("C", None));
        commit_batch(&store.db, vec![first, again, tx, last]);
        assert!(matches!(a.await, Ok(Ok(_))));
        assert!(matches!(b.await, Ok(Err(StoreError::ConditionFailed))));
        assert!(matches!(c.await, Ok(Err(StoreError::Invalid(_)))));
        assert!(matches!(d.await, Ok(Ok(_))));
        assert!(store.get(&Key::new("A", "X")).await.expect("get").is_some());
        assert!(store.get(&Key::new("C", "X")).await.expect("get").is_some());
        assert!(
            store.get(&Key::new("T", "X")).await.expect("get").is_none(),
            "nothing of the refused one"
        );
        store.assert_indexes_consistent();
    }

    /// A write that panics aborts its batch (none of it committed, every
    /// write in it answered with the failure) and the writer goes on.
    #[tokio::test]
    async fn a_panicking_write_fails_its_batch_and_the_writer_goes_on() {
        let store = EmbeddedStore::in_memory().expect("store");
        let (first, a) = job(put("A", None));
        let (boom, b) = job(|_| panic!("a bug in a write"));
        commit_batch(&store.db, vec![first, boom]);
        assert!(matches!(a.await, Ok(Err(StoreError::Backend(_)))));
        assert!(matches!(b.await, Ok(Err(StoreError::Backend(_)))));
        assert!(store.get(&Key::new("A", "X")).await.expect("get").is_none());
        // Through the writer thread: it answers, and takes the next write.
        let (again, c) = job(|_| panic!("a bug in a write, again"));
        assert!(store.writer.send(again).is_ok());
        assert!(matches!(c.await, Ok(Err(StoreError::Backend(_)))));
        let item = obj(json!({"pk": "B", "sk": "X"}));
        assert!(store.put(item, None).await.is_ok(), "the writer goes on");
    }

    /// Many writers at once on a file store: every acknowledged write is
    /// there after the store is closed and opened again, in fewer commits
    /// than writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writes_share_commits_and_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        let store = Arc::new(EmbeddedStore::open(&path).expect("open"));
        let writes = (0..200).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .put(
                        obj(json!({"pk": format!("K#{i}"), "sk": "X", "i": i})),
                        Some(Cond::NotExists),
                    )
                    .await
            })
        });
        for w in futures::future::join_all(writes).await {
            assert!(matches!(w, Ok(Ok(()))), "{w:?}");
        }
        let commits = store.commits();
        assert!(commits < 200, "{commits} commits for 200 writes");
        drop(store);
        let reopened = EmbeddedStore::open(&path).expect("reopen");
        for i in 0..200 {
            let got = reopened
                .get(&Key::new(format!("K#{i}"), "X"))
                .await
                .expect("get");
            assert!(got.is_some(), "K#{i} lost");
        }
    }

    #[tokio::test]
    async fn file_store_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested").join("dhukuti.redb");
        let item = obj(json!({
            "pk": "acct#1", "sk": "meta", "name": "Sita", "balance": 1200,
            "gsi1pk": "email#sita@example.com", "gsi1sk": "acct#1",
        }));
        {
            let store = EmbeddedStore::open(&path).unwrap();
            store
                .put(item.clone(), Some(Cond::NotExists))
                .await
                .unwrap();
            store
                .update(
                    &Key::new("acct#1", "meta"),
                    Update::new().add("balance", 5),
                    None,
                )
                .await
                .unwrap();
        }
        let store = EmbeddedStore::open(&path).unwrap();
        let mut expected = item.clone();
        expected.insert("balance".into(), json!(1205));
        let got = store.get(&Key::new("acct#1", "meta")).await.unwrap();
        assert_eq!(got, Some(expected.clone()));
        let page = store
            .query(&Query::partition("email#sita@example.com").on(Index::Gsi1))
            .await
            .unwrap();
        assert_eq!(page.items, vec![expected]);
        assert!(matches!(
            store.put(item, Some(Cond::NotExists)).await,
            Err(StoreError::ConditionFailed)
        ));
        store.assert_indexes_consistent();
    }

    #[tokio::test]
    async fn add_on_a_float_is_invalid() {
        let store = EmbeddedStore::in_memory().unwrap();
        let key = Key::new("p", "s");
        store
            .put(
                obj(json!({"pk": "p", "sk": "s", "f": 1.5, "u": u64::MAX})),
                None,
            )
            .await
            .unwrap();
        for attr in ["f", "u"] {
            let res = store.update(&key, Update::new().add(attr, 1), None).await;
            assert!(
                matches!(res, Err(StoreError::Invalid(_))),
                "{attr}: {res:?}"
            );
        }
        let res = store
            .update(&key, Update::new().set("n", i64::MAX).set("m", 1), None)
            .await;
        assert!(res.is_ok());
        let res = store.update(&key, Update::new().add("n", 1), None).await;
        assert!(
            matches!(res, Err(StoreError::Invalid(_))),
            "overflow: {res:?}"
        );
    }

    /// Refused before the condition is read, as on DynamoDB: the check is
    /// the shared `validate_update`, not the item written.
    #[tokio::test]
    async fn an_invalid_index_key_in_an_update_is_refused_before_its_condition() {
        let store = EmbeddedStore::in_memory().unwrap();
        let key = Key::new("p", "s");
        let update = || Update::new().set("gsi1pk", 7);
        let res = store.update(&key, update(), Some(Cond::Exists)).await;
        assert!(matches!(res, Err(StoreError::Invalid(_))), "{res:?}");
        let ops = vec![
            TxOp::Check {
                key: Key::new("p", "other"),
                cond: Cond::Exists,
            },
            TxOp::Update {
                key: key.clone(),
                update: update(),
                cond: None,
            },
        ];
        let res = store.transact(ops).await;
        assert!(matches!(res, Err(StoreError::Invalid(_))), "{res:?}");
        assert_eq!(store.get(&key).await.unwrap(), None);
    }

    #[tokio::test]
    async fn last_key_is_set_when_the_limit_ends_on_the_last_item() {
        let store = EmbeddedStore::in_memory().unwrap();
        for i in 0..4 {
            store
                .put(obj(json!({"pk": "p", "sk": format!("s{i}")})), None)
                .await
                .unwrap();
        }
        let page = store.query(&Query::partition("p").limit(4)).await.unwrap();
        assert_eq!(page.items.len(), 4);
        assert_eq!(page.last_key, Some(obj(json!({"pk": "p", "sk": "s3"}))));
        let mut q = Query::partition("p").limit(4);
        q.start_after = page.last_key;
        let page = store.query(&q).await.unwrap();
        assert_eq!(page, QueryPage::default());
    }

    #[tokio::test]
    async fn indexes_stay_consistent_through_mixed_writes() {
        let store = EmbeddedStore::in_memory().unwrap();
        for i in 0..30u32 {
            let mut item = obj(json!({"pk": format!("p{}", i % 3), "sk": format!("s{i}")}));
            if i % 2 == 0 {
                item.insert("gsi1pk".into(), json!(format!("g{}", i % 4)));
                item.insert("gsi1sk".into(), json!(format!("t{i}")));
            }
            if i % 5 == 0 {
                item.insert("gsi2pk".into(), json!("all"));
                item.insert("gsi2sk".into(), json!(format!("t{}", i / 10)));
            }
            store.put(item, None).await.unwrap();
        }
        for i in (0..30u32).step_by(3) {
            let key = Key::new(format!("p{}", i % 3), format!("s{i}"));
            let update = match i % 4 {
                0 => Update::new().remove("gsi1pk"),
                1 => Update::new().set("gsi1pk", "moved").set("gsi1sk", "x"),
                2 => Update::new().set("gsi2pk", "all").set("gsi2sk", "y"),
                _ => Update::new().set("other", 1),
            };
            store.update(&key, update, None).await.unwrap();
        }
        for i in (1..30u32).step_by(4) {
            let key = Key::new(format!("p{}", i % 3), format!("s{i}"));
            store.delete(&key, None).await.unwrap();
        }
        let ops = (100..110u32)
            .map(|i| TxOp::Put {
                item: obj(
                    json!({"pk": "tx", "sk": format!("s{i}"), "gsi2pk": "all", "gsi2sk": "z"}),
                ),
                cond: None,
            })
            .collect();
        store.transact(ops).await.unwrap();
        store.assert_indexes_consistent();
        let count = store
            .count(&Query::partition("all").on(Index::Gsi2))
            .await
            .unwrap();
        let page = store
            .query(&Query::partition("all").on(Index::Gsi2))
            .await
            .unwrap();
        assert_eq!(count, page.items.len() as u64);
        assert!(page.last_key.is_none());
    }

    #[test]
    fn prefix_end_handles_the_top_of_unicode() {
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("a"), Some("b".into()));
        assert_eq!(prefix_end("a#"), Some("a$".into()));
        assert_eq!(prefix_end("\u{D7FF}"), Some("\u{E000}".into()));
        assert_eq!(prefix_end("a\u{10FFFF}"), Some("b".into()));
        assert_eq!(prefix_end("\u{10FFFF}\u{10FFFF}"), None);
    }

    #[test]
    fn key_range_respects_start_after() {
        let (lo, hi) = sk_bounds(&SkCond::Any).unwrap();
        let start = Some(["p".to_owned(), "m".to_owned()]);
        let (l, h) = key_range::<2>("p", lo.clone(), hi.clone(), start.clone(), true).unwrap();
        assert_eq!(l, Bound::Excluded(["p".to_owned(), "m".to_owned()]));
        assert_eq!(h, Bound::Excluded(["p\0".to_owned(), String::new()]));
        let (l, h) = key_range::<2>("p", lo, hi, start, false).unwrap();
        assert_eq!(l, Bound::Included(["p".to_owned(), String::new()]));
        assert_eq!(h, Bound::Excluded(["p".to_owned(), "m".to_owned()]));
        let (lo, hi) = sk_bounds(&SkCond::Ge("x".into())).unwrap();
        let start = Some(["p".to_owned(), "b".to_owned()]);
        let (l, _) = key_range::<2>("p", lo.clone(), hi.clone(), start.clone(), true).unwrap();
        assert_eq!(l, Bound::Included(["p".to_owned(), "x".to_owned()]));
        assert!(key_range::<2>("p", lo, hi, start, false).is_none());
    }
}
