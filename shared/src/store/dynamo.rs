//! The DynamoDB backend of the [`Store`] port: one table shaped as
//! `template.yaml`'s `Table` resource (see [`table_schema`]).
//!
//! Translation:
//! - items are converted with `serde_dynamo` (JSON numbers become `N`,
//!   `null` becomes `NULL`, objects `M`, arrays `L`); a number reads back as
//!   an `i64` when it is an integer in range, else a `u64`, else an `f64`
//!   (so a float with no fraction, such as `2.0`, reads back as `2`:
//!   DynamoDB has one number type and normalises `2.0` to `2`);
//! - a [`Cond`] becomes a condition (or filter) expression whose names and
//!   values are all placeholders (`#n0`, `:v0`, ...), never user text. It
//!   is simplified first: `And([])` is true, `Or([])` false, and a
//!   condition that is always true is left out, while one that is always
//!   false is sent as a contradiction on a non-key attribute so DynamoDB
//!   still reports it (and, in a transaction, the other operations'
//!   reasons). Ordering comparisons are guarded by `attribute_type`, so a
//!   type mismatch is false whatever the server does with mixed types;
//!   inside a filter `Exists` is true and `NotExists` false (every item a
//!   query examines exists, and DynamoDB refuses key attributes in a
//!   filter);
//! - every request DynamoDB would refuse, and every request the embedded
//!   backend refuses before reading the item, is refused here before any
//!   call, with the same [`StoreError`] variant: both backends run the
//!   checks of the store's `validate` module. Refusals that depend on
//!   the stored item (`add` on a non-number) come from DynamoDB's
//!   `ValidationException`, mapped to [`StoreError::Invalid`].
//!
//! Reads: `get`, table queries and counts are strongly consistent
//! (`ConsistentRead`); index queries are not (GSIs cannot be). A query is
//! one `Query` call (`Limit`, `ExclusiveStartKey`, `FilterExpression`); a
//! count follows every page of a `Select: COUNT` query.
//!
//! Errors: `ConditionalCheckFailedException` is
//! [`StoreError::ConditionFailed`]; `TransactionCanceledException` is
//! [`StoreError::TransactionCanceled`] with one reason per operation;
//! `ValidationException` is [`StoreError::Invalid`]; throttling, timeouts,
//! dispatch failures and server faults (5xx) are
//! [`StoreError::Unavailable`]; anything else is [`StoreError::Backend`].
//!
//! Known differences from the embedded backend (none pinned by the
//! conformance suite): `add` on a stored float adds (the embedded store
//! refuses it) and does not fail at `i64` overflow (DynamoDB numbers hold
//! 38 digits); a filter that names a key attribute (`pk`, `sk`, or the
//! queried index's keys) is refused by DynamoDB ([`StoreError::Invalid`]);
//! an attribute named `__dhukuti_noop__` is reserved (see [`Update`]s
//! without changes).

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, ConditionCheck, Delete, Put, ReturnValue, Select,
    TransactWriteItem,
};
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;

use super::validate::{
    validate_cond, validate_item, validate_key, validate_query, validate_sk, validate_start_after,
    validate_transaction, validate_update,
};
use super::{
    CmpOp, Cond, Index, Item, Key, PK, Query, QueryPage, SK, SkCond, Store, StoreError, TTL, TxOp,
    TxReason, Update,
};

type Attrs = HashMap<String, AttributeValue>;

/// An attribute no item holds: `REMOVE` of it is the update expression of
/// an [`Update`] with no changes (DynamoDB needs a non-empty expression in
/// a transaction, and still creates a missing item).
const NOOP_ATTR: &str = "__dhukuti_noop__";

/// [`Store`] on one DynamoDB table. Cheap to clone (the client is shared).
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    instance: u64,
}

impl fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl DynamoStore {
    /// The store on `table` (which must exist, shaped as [`table_schema`]).
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            instance: super::new_instance(),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }
}

/// A client for a DynamoDB-compatible endpoint (moto, DynamoDB Local) with
/// dummy static credentials: for tests and local runs, never for AWS.
pub fn client_for_endpoint(endpoint: &str, region: &str) -> Client {
    let credentials = Credentials::new("test", "test", None, None, "dhukuti-static");
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .credentials_provider(credentials)
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(config)
}

// ------------------------------------------------------------------ schema

/// The table's definition as plain data, the one source both
/// [`create_table`] and the `template.yaml` test read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSchema {
    /// `BillingMode`.
    pub billing_mode: &'static str,
    /// `AttributeDefinitions`: (name, scalar type).
    pub attributes: Vec<(&'static str, &'static str)>,
    /// `KeySchema`: (attribute, `HASH` or `RANGE`).
    pub key_schema: Vec<(&'static str, &'static str)>,
    pub indexes: Vec<IndexSchema>,
    /// `TimeToLiveSpecification.AttributeName` (enabled).
    pub ttl_attribute: &'static str,
    /// `StreamSpecification.StreamViewType`.
    pub stream_view_type: &'static str,
}

/// One global secondary index of [`TableSchema`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexSchema {
    pub name: &'static str,
    pub key_schema: Vec<(&'static str, &'static str)>,
    /// `Projection.ProjectionType`.
    pub projection: &'static str,
}

/// The table as `template.yaml` defines it, built from [`PK`], [`SK`],
/// [`TTL`] and [`Index::ALL`].
pub fn table_schema() -> TableSchema {
    let mut attributes = vec![(PK, "S"), (SK, "S")];
    let mut indexes = Vec::new();
    for index in Index::ALL {
        attributes.push((index.pk_attr(), "S"));
        attributes.push((index.sk_attr(), "S"));
        indexes.push(IndexSchema {
            name: index.name(),
            key_schema: vec![(index.pk_attr(), "HASH"), (index.sk_attr(), "RANGE")],
            projection: "ALL",
        });
    }
    TableSchema {
        billing_mode: "PAY_PER_REQUEST",
        attributes,
        key_schema: vec![(PK, "HASH"), (SK, "RANGE")],
        indexes,
        ttl_attribute: TTL,
        stream_view_type: "NEW_AND_OLD_IMAGES",
    }
}

/// Creating the table (the local gateway's `--init`, `dhukuti-admin`, the
/// tests): feature `tools`. A deployed function only uses the table the
/// template made, and carries none of these operations (issue 21).
#[cfg(feature = "tools")]
mod provision {
    use std::time::{Duration, Instant};

    use aws_sdk_dynamodb::Client;
    use aws_sdk_dynamodb::error::SdkError;
    use aws_sdk_dynamodb::operation::create_table::CreateTableError;
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, GlobalSecondaryIndex, IndexStatus, KeySchemaElement,
        KeyType, Projection, ProjectionType, ScalarAttributeType, StreamSpecification,
        StreamViewType, TableStatus, TimeToLiveSpecification, TimeToLiveStatus,
    };

    use super::{StoreError, TableSchema, build_error, sdk_error, table_schema};

    /// How long [`create_table`] waits for the table and its indexes.
    const ACTIVE_TIMEOUT: Duration = Duration::from_secs(300);

    fn key_elements(schema: &[(&str, &str)]) -> Result<Vec<KeySchemaElement>, StoreError> {
        schema
            .iter()
            .map(|(attr, kind)| {
                KeySchemaElement::builder()
                    .attribute_name(*attr)
                    .key_type(KeyType::from(*kind))
                    .build()
                    .map_err(build_error("key schema"))
            })
            .collect()
    }

    /// Creates `table` as [`table_schema`] describes it (on-demand billing, the
    /// key, both indexes, a stream), waits until it and its indexes are
    /// `ACTIVE` and enables TTL on [`TTL`](super::TTL). Idempotent: an existing table with
    /// the same key schema is only waited on and given TTL. Point-in-time
    /// recovery and KMS encryption stay with the deployment (`template.yaml`).
    pub async fn create_table(client: &Client, table: &str) -> Result<(), StoreError> {
        let schema = table_schema();
        let attributes = schema
            .attributes
            .iter()
            .map(|(name, kind)| {
                AttributeDefinition::builder()
                    .attribute_name(*name)
                    .attribute_type(ScalarAttributeType::from(*kind))
                    .build()
                    .map_err(build_error("attribute definition"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let indexes = schema
            .indexes
            .iter()
            .map(|index| {
                GlobalSecondaryIndex::builder()
                    .index_name(index.name)
                    .set_key_schema(Some(key_elements(&index.key_schema)?))
                    .projection(
                        Projection::builder()
                            .projection_type(ProjectionType::from(index.projection))
                            .build(),
                    )
                    .build()
                    .map_err(build_error("index"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let stream = StreamSpecification::builder()
            .stream_enabled(true)
            .stream_view_type(StreamViewType::from(schema.stream_view_type))
            .build()
            .map_err(build_error("stream specification"))?;
        let created = client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::from(schema.billing_mode))
            .set_attribute_definitions(Some(attributes))
            .set_key_schema(Some(key_elements(&schema.key_schema)?))
            .set_global_secondary_indexes(Some(indexes))
            .stream_specification(stream)
            .send()
            .await;
        match created {
            Ok(_) => {}
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), CreateTableError::ResourceInUseException(_)) => {}
            Err(e) => return Err(sdk_error("create table", e)),
        }
        wait_until_active(client, table, &schema).await?;
        enable_ttl(client, table, schema.ttl_attribute).await
    }

    async fn wait_until_active(
        client: &Client,
        table: &str,
        schema: &TableSchema,
    ) -> Result<(), StoreError> {
        let deadline = Instant::now() + ACTIVE_TIMEOUT;
        let mut pause = Duration::from_millis(100);
        loop {
            let out = client
                .describe_table()
                .table_name(table)
                .send()
                .await
                .map_err(|e| sdk_error("describe table", e))?;
            let description = out
                .table()
                .ok_or_else(|| StoreError::Backend("describe table: no description".into()))?;
            let key: Vec<(&str, &str)> = description
                .key_schema()
                .iter()
                .map(|k| (k.attribute_name(), k.key_type().as_str()))
                .collect();
            if key != schema.key_schema {
                return Err(StoreError::Backend(format!(
                    "table {table} exists with another key schema: {key:?}"
                )));
            }
            let table_active = description.table_status() == Some(&TableStatus::Active);
            let indexes = description.global_secondary_indexes();
            let indexes_active = schema.indexes.iter().all(|want| {
                indexes.iter().any(|have| {
                    have.index_name() == Some(want.name)
                        && have
                            .index_status()
                            .is_none_or(|status| *status == IndexStatus::Active)
                })
            });
            if table_active && indexes_active {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "table {table} not ACTIVE after {ACTIVE_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    async fn enable_ttl(client: &Client, table: &str, attr: &str) -> Result<(), StoreError> {
        let current = client
            .describe_time_to_live()
            .table_name(table)
            .send()
            .await
            .map_err(|e| sdk_error("describe time to live", e))?;
        if let Some(description) = current.time_to_live_description() {
            let on = matches!(
                description.time_to_live_status(),
                Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
            );
            match description.attribute_name() {
                Some(name) if on && name == attr => return Ok(()),
                Some(name) if on => {
                    return Err(StoreError::Backend(format!(
                        "table {table} has TTL on {name}, not {attr}"
                    )));
                }
                _ => {}
            }
        }
        let spec = TimeToLiveSpecification::builder()
            .enabled(true)
            .attribute_name(attr)
            .build()
            .map_err(build_error("time to live specification"))?;
        client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(spec)
            .send()
            .await
            .map_err(|e| sdk_error("update time to live", e))?;
        Ok(())
    }

    /// Deletes `table` on the service at `endpoint` (a test's own table
    /// once the test is over: moto keeps every table in memory for its
    /// whole run). A table already gone is not an error.
    pub async fn drop_table(endpoint: Option<&str>, table: &str) -> Result<(), String> {
        let shared = crate::aws::sdk_config(endpoint)?;
        let client = Client::new(&shared);
        match client.delete_table().table_name(table).send().await {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(e))
                if matches!(
                    e.err(),
                    aws_sdk_dynamodb::operation::delete_table::DeleteTableError::ResourceNotFoundException(_)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(sdk_error("delete table", e).to_string()),
        }
    }
}

#[cfg(feature = "tools")]
pub use provision::{create_table, drop_table};

// ------------------------------------------------------------------ errors

fn build_error<E: fmt::Display>(what: &'static str) -> impl FnOnce(E) -> StoreError {
    move |e| StoreError::Backend(format!("build {what}: {e}"))
}

/// Maps an SDK error: conditions, validation, throttling and transport
/// faults to their variants, anything else to [`StoreError::Backend`]. The
/// text holds the operation, the error code and DynamoDB's message, which
/// name no credentials.
fn sdk_error<E>(what: &str, err: SdkError<E>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match &err {
        SdkError::ServiceError(ctx) => service_error(
            what,
            ctx.raw().status().as_u16(),
            ctx.err().code(),
            ctx.err().message(),
        ),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => {
            StoreError::Unavailable(format!("{what}: {}", DisplayErrorContext(&err)))
        }
        _ => StoreError::Backend(format!("{what}: {}", DisplayErrorContext(&err))),
    }
}

/// An error answer of DynamoDB (HTTP `status`, error `code`).
fn service_error(what: &str, status: u16, code: Option<&str>, message: Option<&str>) -> StoreError {
    let detail = || {
        format!(
            "{what}: HTTP {status} {}: {}",
            code.unwrap_or("(no error code)"),
            message.unwrap_or("no message")
        )
    };
    match code {
        Some("ConditionalCheckFailedException") => StoreError::ConditionFailed,
        Some("ValidationException") => StoreError::Invalid(detail()),
        Some(
            "ProvisionedThroughputExceededException"
            | "RequestLimitExceeded"
            | "ThrottlingException"
            | "Throttling"
            | "TransactionConflictException"
            | "TransactionInProgressException"
            | "InternalServerError"
            | "ServiceUnavailable",
        ) => StoreError::Unavailable(detail()),
        // Any other server fault is transient too (the SDK has already
        // retried it).
        _ if status >= 500 => StoreError::Unavailable(detail()),
        _ => StoreError::Backend(detail()),
    }
}

/// One [`TxReason`] per operation from a `TransactionCanceledException`.
/// A `ValidationError` makes the whole request [`StoreError::Invalid`]; a
/// cancellation whose only causes are throttling is
/// [`StoreError::Unavailable`].
fn cancellation(reasons: &[CancellationReason], ops: usize) -> StoreError {
    let mut out = Vec::with_capacity(reasons.len());
    let mut throttled = false;
    for reason in reasons {
        out.push(match reason.code() {
            None | Some("None") => TxReason::None,
            Some("ConditionalCheckFailed") => TxReason::ConditionFailed,
            Some("TransactionConflict") => TxReason::Conflict,
            Some("ValidationError") => {
                return StoreError::Invalid(format!(
                    "transact: ValidationError: {}",
                    reason.message().unwrap_or("no message")
                ));
            }
            Some(code) => {
                throttled |= matches!(
                    code,
                    "ThrottlingError" | "ProvisionedThroughputExceeded" | "RequestLimitExceeded"
                );
                TxReason::Other(code.to_owned())
            }
        });
    }
    if out.len() != ops {
        return StoreError::Backend(format!(
            "transact: cancelled with {} reasons for {ops} operations: {out:?}",
            out.len()
        ));
    }
    let named_cause = out
        .iter()
        .any(|r| matches!(r, TxReason::ConditionFailed | TxReason::Conflict));
    if throttled && !named_cause {
        return StoreError::Unavailable(format!("transact: throttled: {out:?}"));
    }
    StoreError::TransactionCanceled { reasons: out }
}

// -------------------------------------------------------------- conversion

fn to_attrs(item: &Item) -> Result<Attrs, StoreError> {
    serde_dynamo::to_item(item).map_err(|e| StoreError::Invalid(format!("encode item: {e}")))
}

fn from_attrs(attrs: Attrs) -> Result<Item, StoreError> {
    serde_dynamo::from_item(attrs).map_err(|e| StoreError::Backend(format!("decode item: {e}")))
}

fn to_value(value: &Value) -> Result<AttributeValue, StoreError> {
    serde_dynamo::to_attribute_value(value)
        .map_err(|e| StoreError::Invalid(format!("encode value: {e}")))
}

fn key_attrs(key: &Key) -> Attrs {
    HashMap::from([
        (PK.to_owned(), AttributeValue::S(key.pk.clone())),
        (SK.to_owned(), AttributeValue::S(key.sk.clone())),
    ])
}

// ------------------------------------------------------------- expressions

/// Placeholders of one request: `#n<i>` for names, `:v<i>` for values.
#[derive(Default)]
struct Placeholders {
    names: HashMap<String, String>,
    by_attr: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Placeholders {
    fn name(&mut self, attr: &str) -> String {
        if let Some(p) = self.by_attr.get(attr) {
            return p.clone();
        }
        let p = format!("#n{}", self.by_attr.len());
        self.by_attr.insert(attr.to_owned(), p.clone());
        self.names.insert(p.clone(), attr.to_owned());
        p
    }

    fn value(&mut self, value: AttributeValue) -> String {
        let p = format!(":v{}", self.values.len());
        self.values.insert(p.clone(), value);
        p
    }

    fn json(&mut self, value: &Value) -> Result<String, StoreError> {
        Ok(self.value(to_value(value)?))
    }

    fn string(&mut self, s: &str) -> String {
        self.value(AttributeValue::S(s.to_owned()))
    }

    /// The maps to send (`None` when empty: DynamoDB refuses empty maps).
    fn into_maps(self) -> (Option<HashMap<String, String>>, Option<Attrs>) {
        let names = (!self.names.is_empty()).then_some(self.names);
        let values = (!self.values.is_empty()).then_some(self.values);
        (names, values)
    }
}

/// A condition after simplification.
#[derive(Debug, PartialEq)]
enum Simple<'c> {
    True,
    False,
    Node(Node<'c>),
}

#[derive(Debug, PartialEq)]
enum Node<'c> {
    /// `Exists`, `NotExists`, `AttrExists`, `AttrNotExists` or `Cmp`.
    Leaf(&'c Cond),
    And(Vec<Node<'c>>),
    Or(Vec<Node<'c>>),
    Not(Box<Node<'c>>),
}

/// Folds constants: `And([])` is true, `Or([])` false; in a filter
/// (`in_filter`) `Exists` is true and `NotExists` false.
fn simplify(cond: &Cond, in_filter: bool) -> Simple<'_> {
    match cond {
        Cond::Exists if in_filter => Simple::True,
        Cond::NotExists if in_filter => Simple::False,
        Cond::Exists
        | Cond::NotExists
        | Cond::AttrExists(_)
        | Cond::AttrNotExists(_)
        | Cond::Cmp(..) => Simple::Node(Node::Leaf(cond)),
        Cond::And(conds) => {
            let mut nodes = Vec::new();
            for c in conds {
                match simplify(c, in_filter) {
                    Simple::True => {}
                    Simple::False => return Simple::False,
                    Simple::Node(n) => nodes.push(n),
                }
            }
            match nodes.len() {
                0 => Simple::True,
                1 => Simple::Node(nodes.remove(0)),
                _ => Simple::Node(Node::And(nodes)),
            }
        }
        Cond::Or(conds) => {
            let mut nodes = Vec::new();
            for c in conds {
                match simplify(c, in_filter) {
                    Simple::False => {}
                    Simple::True => return Simple::True,
                    Simple::Node(n) => nodes.push(n),
                }
            }
            match nodes.len() {
                0 => Simple::False,
                1 => Simple::Node(nodes.remove(0)),
                _ => Simple::Node(Node::Or(nodes)),
            }
        }
        Cond::Not(inner) => match simplify(inner, in_filter) {
            Simple::True => Simple::False,
            Simple::False => Simple::True,
            Simple::Node(n) => Simple::Node(Node::Not(Box::new(n))),
        },
    }
}

fn render(node: &Node<'_>, ph: &mut Placeholders) -> Result<String, StoreError> {
    let join = |nodes: &[Node<'_>], op: &str, ph: &mut Placeholders| {
        let parts = nodes
            .iter()
            .map(|n| render(n, ph))
            .collect::<Result<Vec<_>, _>>()?;
        Ok::<_, StoreError>(format!("({})", parts.join(op)))
    };
    match node {
        Node::And(nodes) => join(nodes, " AND ", ph),
        Node::Or(nodes) => join(nodes, " OR ", ph),
        Node::Not(inner) => Ok(format!("(NOT {})", render(inner, ph)?)),
        Node::Leaf(leaf) => render_leaf(leaf, ph),
    }
}

fn render_leaf(cond: &Cond, ph: &mut Placeholders) -> Result<String, StoreError> {
    Ok(match cond {
        Cond::Exists => format!("attribute_exists({})", ph.name(PK)),
        Cond::NotExists => format!("attribute_not_exists({})", ph.name(PK)),
        Cond::AttrExists(attr) => format!("attribute_exists({})", ph.name(attr)),
        Cond::AttrNotExists(attr) => format!("attribute_not_exists({})", ph.name(attr)),
        Cond::Cmp(attr, op, value) => {
            let name = ph.name(attr);
            let symbol = match op {
                CmpOp::Eq => "=",
                CmpOp::Ne => "<>",
                CmpOp::Lt => "<",
                CmpOp::Le => "<=",
                CmpOp::Gt => ">",
                CmpOp::Ge => ">=",
            };
            let type_code = match (op, value) {
                (CmpOp::Eq | CmpOp::Ne, _) => None,
                (_, Value::Number(_)) => Some("N"),
                (_, Value::String(_)) => Some("S"),
                (_, other) => {
                    return Err(StoreError::Invalid(format!(
                        "condition {attr} {op:?} needs a number or a string, got {other}"
                    )));
                }
            };
            let v = ph.json(value)?;
            match type_code {
                // DynamoDB's `<` on mixed types is false; the guard makes
                // that explicit (and keeps any server from comparing
                // across types).
                Some(t) => {
                    let t = ph.string(t);
                    format!("(attribute_type({name}, {t}) AND {name} {symbol} {v})")
                }
                None => format!("{name} {symbol} {v}"),
            }
        }
        Cond::And(_) | Cond::Or(_) | Cond::Not(_) => {
            // `simplify` never leaves these in a leaf.
            return Err(StoreError::Backend(
                "internal: compound condition in a leaf".into(),
            ));
        }
    })
}

/// An expression that is always false (on a non-key attribute, so it is
/// also a valid filter).
fn contradiction(ph: &mut Placeholders) -> String {
    let n = ph.name(TTL);
    format!("(attribute_exists({n}) AND attribute_not_exists({n}))")
}

/// An expression that is always true.
fn tautology(ph: &mut Placeholders) -> String {
    let n = ph.name(TTL);
    format!("(attribute_exists({n}) OR attribute_not_exists({n}))")
}

/// The `ConditionExpression` of a write (`None`: unconditional).
fn condition_expr(
    cond: Option<&Cond>,
    ph: &mut Placeholders,
) -> Result<Option<String>, StoreError> {
    let Some(cond) = cond else { return Ok(None) };
    match simplify(cond, false) {
        Simple::True => Ok(None),
        Simple::False => Ok(Some(contradiction(ph))),
        Simple::Node(node) => render(&node, ph).map(Some),
    }
}

/// The `ConditionExpression` of a transaction's check (always present).
fn check_expr(cond: &Cond, ph: &mut Placeholders) -> Result<String, StoreError> {
    match simplify(cond, false) {
        Simple::True => Ok(tautology(ph)),
        Simple::False => Ok(contradiction(ph)),
        Simple::Node(node) => render(&node, ph),
    }
}

/// The `FilterExpression` of a query (`None`: keep everything).
fn filter_expr(filter: Option<&Cond>, ph: &mut Placeholders) -> Result<Option<String>, StoreError> {
    let Some(filter) = filter else {
        return Ok(None);
    };
    match simplify(filter, true) {
        Simple::True => Ok(None),
        Simple::False => Ok(Some(contradiction(ph))),
        Simple::Node(node) => render(&node, ph).map(Some),
    }
}

/// `SET ... ADD ... REMOVE ...` of a (validated) update.
fn update_expr(update: &Update, ph: &mut Placeholders) -> Result<String, StoreError> {
    let mut clauses = Vec::new();
    if !update.set.is_empty() {
        let parts = update
            .set
            .iter()
            .map(|(attr, value)| Ok(format!("{} = {}", ph.name(attr), ph.json(value)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        clauses.push(format!("SET {}", parts.join(", ")));
    }
    if !update.add.is_empty() {
        let parts: Vec<String> = update
            .add
            .iter()
            .map(|(attr, delta)| {
                let name = ph.name(attr);
                let v = ph.value(AttributeValue::N(delta.to_string()));
                format!("{name} {v}")
            })
            .collect();
        clauses.push(format!("ADD {}", parts.join(", ")));
    }
    let mut removed: Vec<String> = update.remove.iter().map(|a| ph.name(a)).collect();
    if clauses.is_empty() && removed.is_empty() {
        removed.push(ph.name(NOOP_ATTR));
    }
    if !removed.is_empty() {
        clauses.push(format!("REMOVE {}", removed.join(", ")));
    }
    Ok(clauses.join(" "))
}

// ----------------------------------------------------------------- queries

/// The sort-key condition to send, or `None` when no item can match.
/// DynamoDB refuses empty strings in key conditions; stored keys are never
/// empty, so a condition on `""` is either everything or nothing.
fn sk_plan(sk: &SkCond) -> Result<Option<SkCond>, StoreError> {
    validate_sk(sk)?;
    Ok(match sk {
        SkCond::Eq(s) | SkCond::Lt(s) | SkCond::Le(s) if s.is_empty() => None,
        SkCond::BeginsWith(s) | SkCond::Gt(s) | SkCond::Ge(s) if s.is_empty() => Some(SkCond::Any),
        SkCond::Between(_, hi) if hi.is_empty() => None,
        SkCond::Between(lo, hi) if lo.is_empty() => Some(SkCond::Le(hi.clone())),
        other => Some(other.clone()),
    })
}

fn key_condition(q: &Query, sk: &SkCond, ph: &mut Placeholders) -> String {
    let (pk_attr, sk_attr) = match q.index {
        Some(index) => (index.pk_attr(), index.sk_attr()),
        None => (PK, SK),
    };
    let pk_name = ph.name(pk_attr);
    let pk_value = ph.string(&q.pk);
    let mut expr = format!("{pk_name} = {pk_value}");
    let compare = |symbol: &str, s: &str, ph: &mut Placeholders| {
        let (n, v) = (ph.name(sk_attr), ph.string(s));
        format!(" AND {n} {symbol} {v}")
    };
    let tail = match sk {
        SkCond::Any => String::new(),
        SkCond::Eq(s) => compare("=", s, ph),
        SkCond::Lt(s) => compare("<", s, ph),
        SkCond::Le(s) => compare("<=", s, ph),
        SkCond::Gt(s) => compare(">", s, ph),
        SkCond::Ge(s) => compare(">=", s, ph),
        SkCond::BeginsWith(s) => {
            let (n, v) = (ph.name(sk_attr), ph.string(s));
            format!(" AND begins_with({n}, {v})")
        }
        SkCond::Between(lo, hi) => {
            let n = ph.name(sk_attr);
            let (a, b) = (ph.string(lo), ph.string(hi));
            format!(" AND {n} BETWEEN {a} AND {b}")
        }
    };
    expr.push_str(&tail);
    expr
}

/// `ExclusiveStartKey` from `start_after`: exactly the key attributes of the
/// table (and index), which must lie in the queried partition.
fn start_key(q: &Query, start: &Item) -> Result<Attrs, StoreError> {
    let start = validate_start_after(q, start)?;
    let mut attrs = key_attrs(&Key::new(start.pk, start.sk));
    if let (Some(index), Some((ipk, isk))) = (q.index, start.index) {
        attrs.insert(
            index.pk_attr().to_owned(),
            AttributeValue::S(ipk.to_owned()),
        );
        attrs.insert(
            index.sk_attr().to_owned(),
            AttributeValue::S(isk.to_owned()),
        );
    }
    Ok(attrs)
}

/// A query request's parts; `None` when nothing can match.
struct Plan {
    key_condition: String,
    filter: Option<String>,
    names: Option<HashMap<String, String>>,
    values: Option<Attrs>,
}

/// The parts of `q` (validated by the caller with `validate_query`).
fn plan(q: &Query) -> Result<Option<Plan>, StoreError> {
    let Some(sk) = sk_plan(&q.sk)? else {
        return Ok(None);
    };
    let mut ph = Placeholders::default();
    let key_condition = key_condition(q, &sk, &mut ph);
    let filter = filter_expr(q.filter.as_ref(), &mut ph)?;
    let (names, values) = ph.into_maps();
    Ok(Some(Plan {
        key_condition,
        filter,
        names,
        values,
    }))
}

// ------------------------------------------------------------------- store

impl DynamoStore {
    fn put_op(&self, item: &Item, cond: Option<&Cond>) -> Result<Put, StoreError> {
        let mut ph = Placeholders::default();
        let condition = condition_expr(cond, &mut ph)?;
        let (names, values) = ph.into_maps();
        Put::builder()
            .table_name(&self.table)
            .set_item(Some(to_attrs(item)?))
            .set_condition_expression(condition)
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .build()
            .map_err(build_error("put"))
    }

    fn update_op(
        &self,
        key: &Key,
        update: &Update,
        cond: Option<&Cond>,
    ) -> Result<aws_sdk_dynamodb::types::Update, StoreError> {
        let mut ph = Placeholders::default();
        let expression = update_expr(update, &mut ph)?;
        let condition = condition_expr(cond, &mut ph)?;
        let (names, values) = ph.into_maps();
        aws_sdk_dynamodb::types::Update::builder()
            .table_name(&self.table)
            .set_key(Some(key_attrs(key)))
            .update_expression(expression)
            .set_condition_expression(condition)
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .build()
            .map_err(build_error("update"))
    }

    fn delete_op(&self, key: &Key, cond: Option<&Cond>) -> Result<Delete, StoreError> {
        let mut ph = Placeholders::default();
        let condition = condition_expr(cond, &mut ph)?;
        let (names, values) = ph.into_maps();
        Delete::builder()
            .table_name(&self.table)
            .set_key(Some(key_attrs(key)))
            .set_condition_expression(condition)
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .build()
            .map_err(build_error("delete"))
    }

    fn check_op(&self, key: &Key, cond: &Cond) -> Result<ConditionCheck, StoreError> {
        let mut ph = Placeholders::default();
        let condition = check_expr(cond, &mut ph)?;
        let (names, values) = ph.into_maps();
        ConditionCheck::builder()
            .table_name(&self.table)
            .set_key(Some(key_attrs(key)))
            .condition_expression(condition)
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .build()
            .map_err(build_error("condition check"))
    }
}

#[async_trait]
impl Store for DynamoStore {
    fn instance(&self) -> u64 {
        self.instance
    }

    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        validate_key(key)?;
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key_attrs(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("get", e))?;
        out.item.map(from_attrs).transpose()
    }

    async fn put(&self, item: Item, cond: Option<Cond>) -> Result<(), StoreError> {
        validate_item(&item)?;
        validate_cond(cond.as_ref())?;
        let op = self.put_op(&item, cond.as_ref())?;
        self.client
            .put_item()
            .table_name(op.table_name)
            .set_item(Some(op.item))
            .set_condition_expression(op.condition_expression)
            .set_expression_attribute_names(op.expression_attribute_names)
            .set_expression_attribute_values(op.expression_attribute_values)
            .send()
            .await
            .map_err(|e| sdk_error("put", e))?;
        Ok(())
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
        let op = self.update_op(key, &update, cond.as_ref())?;
        let out = self
            .client
            .update_item()
            .table_name(op.table_name)
            .set_key(Some(op.key))
            .update_expression(op.update_expression)
            .set_condition_expression(op.condition_expression)
            .set_expression_attribute_names(op.expression_attribute_names)
            .set_expression_attribute_values(op.expression_attribute_values)
            .return_values(ReturnValue::AllNew)
            .send()
            .await
            .map_err(|e| sdk_error("update", e))?;
        match out.attributes {
            Some(attrs) => from_attrs(attrs),
            None => Err(StoreError::Backend(
                "update: no attributes returned for ALL_NEW".into(),
            )),
        }
    }

    async fn delete(&self, key: &Key, cond: Option<Cond>) -> Result<(), StoreError> {
        validate_key(key)?;
        validate_cond(cond.as_ref())?;
        let op = self.delete_op(key, cond.as_ref())?;
        self.client
            .delete_item()
            .table_name(op.table_name)
            .set_key(Some(op.key))
            .set_condition_expression(op.condition_expression)
            .set_expression_attribute_names(op.expression_attribute_names)
            .set_expression_attribute_values(op.expression_attribute_values)
            .send()
            .await
            .map_err(|e| sdk_error("delete", e))?;
        Ok(())
    }

    async fn transact(&self, ops: Vec<TxOp>) -> Result<(), StoreError> {
        // Validate every operation before building any.
        validate_transaction(&ops)?;
        let mut items = Vec::with_capacity(ops.len());
        for op in &ops {
            let builder = TransactWriteItem::builder();
            items.push(
                match op {
                    TxOp::Put { item, cond } => builder.put(self.put_op(item, cond.as_ref())?),
                    TxOp::Update { key, update, cond } => {
                        builder.update(self.update_op(key, update, cond.as_ref())?)
                    }
                    TxOp::Delete { key, cond } => {
                        builder.delete(self.delete_op(key, cond.as_ref())?)
                    }
                    TxOp::Check { key, cond } => builder.condition_check(self.check_op(key, cond)?),
                }
                .build(),
            );
        }
        let res = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(ctx)) => match ctx.err() {
                TransactWriteItemsError::TransactionCanceledException(e) => {
                    Err(cancellation(e.cancellation_reasons(), ops.len()))
                }
                other => Err(service_error(
                    "transact",
                    ctx.raw().status().as_u16(),
                    other.code(),
                    other.message(),
                )),
            },
            Err(e) => Err(sdk_error("transact", e)),
        }
    }

    async fn query(&self, query: &Query) -> Result<QueryPage, StoreError> {
        validate_query(query, true)?;
        let limit = query.limit.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let plan = plan(query)?;
        let start = query
            .start_after
            .as_ref()
            .map(|s| start_key(query, s))
            .transpose()?;
        let Some(plan) = plan else {
            return Ok(QueryPage::default());
        };
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .set_index_name(query.index.map(|i| i.name().to_owned()))
            .set_consistent_read(query.index.is_none().then_some(true))
            .key_condition_expression(plan.key_condition)
            .set_filter_expression(plan.filter)
            .set_expression_attribute_names(plan.names)
            .set_expression_attribute_values(plan.values)
            .scan_index_forward(query.forward)
            .set_limit(limit)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| sdk_error("query", e))?;
        let items = out
            .items
            .unwrap_or_default()
            .into_iter()
            .map(from_attrs)
            .collect::<Result<Vec<_>, _>>()?;
        let last_key = out
            .last_evaluated_key
            .filter(|k| !k.is_empty())
            .map(from_attrs)
            .transpose()?;
        Ok(QueryPage { items, last_key })
    }

    async fn count(&self, query: &Query) -> Result<u64, StoreError> {
        validate_query(query, false)?;
        let Some(plan) = plan(query)? else {
            return Ok(0);
        };
        let mut total: u64 = 0;
        let mut start: Option<Attrs> = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .set_index_name(query.index.map(|i| i.name().to_owned()))
                .set_consistent_read(query.index.is_none().then_some(true))
                .key_condition_expression(plan.key_condition.clone())
                .set_filter_expression(plan.filter.clone())
                .set_expression_attribute_names(plan.names.clone())
                .set_expression_attribute_values(plan.values.clone())
                .select(Select::Count)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| sdk_error("count", e))?;
            total += u64::try_from(out.count).unwrap_or(0);
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(total),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::types::BillingMode;
    use serde_json::json;
    use std::sync::Arc;

    /// A store on a fresh table of the endpoint in
    /// `DHUKUTI_TEST_AWS_ENDPOINT`; `None` (skip) when it is unset, unless
    /// `DHUKUTI_REQUIRE_AWS=1`.
    async fn aws_store() -> Option<Arc<dyn Store>> {
        let client = test_client()?;
        let table = format!("dhukuti-test-{}", ulid::Ulid::new());
        create_table(&client, &table)
            .await
            .unwrap_or_else(|e| panic!("create table {table}: {e}"));
        Some(Arc::new(DynamoStore::new(client, table)))
    }

    fn test_client() -> Option<Client> {
        let endpoint = crate::queue::testkit::aws_endpoint()?;
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "ap-south-1".into());
        Some(client_for_endpoint(&endpoint, &region))
    }

    mod conformance {
        crate::store_conformance_tests!(@optional super::aws_store);
    }

    fn obj(v: Value) -> Item {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    fn rendered(cond: &Cond) -> (Option<String>, HashMap<String, String>, usize) {
        let mut ph = Placeholders::default();
        let expr = condition_expr(Some(cond), &mut ph).unwrap();
        let (names, values) = ph.into_maps();
        (
            expr,
            names.unwrap_or_default(),
            values.map_or(0, |v| v.len()),
        )
    }

    #[test]
    fn user_strings_never_reach_the_expression() {
        let evil = "x) OR attribute_exists(pk";
        let cond = Cond::And(vec![
            Cond::eq(evil, evil),
            Cond::AttrExists("#n0".into()),
            Cond::lt(":v0", "z"),
        ]);
        let (expr, names, values) = rendered(&cond);
        let expr = expr.unwrap();
        assert_eq!(
            expr,
            "(#n0 = :v0 AND attribute_exists(#n1) AND \
             (attribute_type(#n2, :v2) AND #n2 < :v1))"
        );
        assert_eq!(names.get("#n0").map(String::as_str), Some(evil));
        assert_eq!(names.get("#n1").map(String::as_str), Some("#n0"));
        assert_eq!(names.get("#n2").map(String::as_str), Some(":v0"));
        assert_eq!(values, 3);
    }

    #[test]
    fn constants_are_folded() {
        let t = Cond::And(vec![]);
        let f = Cond::Or(vec![]);
        assert_eq!(rendered(&t), (None, HashMap::new(), 0));
        assert_eq!(rendered(&Cond::Not(Box::new(f.clone()))).0, None);
        let (expr, names, values) = rendered(&f);
        assert_eq!(
            expr.as_deref(),
            Some("(attribute_exists(#n0) AND attribute_not_exists(#n0))")
        );
        assert_eq!(names.get("#n0").map(String::as_str), Some(TTL));
        assert_eq!(values, 0);
        // Dropped branches leave no unused placeholders behind.
        let cond = Cond::Or(vec![
            Cond::And(vec![Cond::eq("a", 1), f.clone()]),
            Cond::eq("b", 2),
        ]);
        let (expr, names, values) = rendered(&cond);
        assert_eq!(expr.as_deref(), Some("#n0 = :v0"));
        assert_eq!(names.get("#n0").map(String::as_str), Some("b"));
        assert_eq!(values, 1);
        let cond = Cond::And(vec![
            Cond::eq("a", 1),
            Cond::Or(vec![t.clone(), Cond::eq("b", 2)]),
        ]);
        assert_eq!(rendered(&cond).0.as_deref(), Some("#n0 = :v0"));
        let mut ph = Placeholders::default();
        assert_eq!(
            check_expr(&t, &mut ph).unwrap(),
            "(attribute_exists(#n0) OR attribute_not_exists(#n0))"
        );
    }

    #[test]
    fn existence_in_a_filter_is_constant() {
        let mut ph = Placeholders::default();
        assert_eq!(filter_expr(Some(&Cond::Exists), &mut ph).unwrap(), None);
        let f = filter_expr(Some(&Cond::NotExists), &mut ph)
            .unwrap()
            .unwrap();
        assert!(!f.contains(PK), "{f}");
        let mut ph = Placeholders::default();
        assert_eq!(
            condition_expr(Some(&Cond::Exists), &mut ph)
                .unwrap()
                .as_deref(),
            Some("attribute_exists(#n0)")
        );
        assert_eq!(ph.names.get("#n0").map(String::as_str), Some(PK));
    }

    #[test]
    fn update_expressions() {
        let mut ph = Placeholders::default();
        let update = Update::new()
            .set("a", 1)
            .set("b", "x")
            .add("c", -2)
            .remove("d");
        assert_eq!(
            update_expr(&update, &mut ph).unwrap(),
            "SET #n0 = :v0, #n1 = :v1 ADD #n2 :v2 REMOVE #n3"
        );
        assert_eq!(ph.values.get(":v2"), Some(&AttributeValue::N("-2".into())));
        let mut ph = Placeholders::default();
        assert_eq!(update_expr(&Update::new(), &mut ph).unwrap(), "REMOVE #n0");
        assert_eq!(ph.names.get("#n0").map(String::as_str), Some(NOOP_ATTR));
    }

    // The checks shared with the embedded store are tested in `validate`.
    #[test]
    fn ordering_against_a_non_scalar_is_refused() {
        let mut ph = Placeholders::default();
        assert!(matches!(
            condition_expr(Some(&Cond::lt("b", true)), &mut ph),
            Err(StoreError::Invalid(_))
        ));
    }

    #[test]
    fn sort_key_plans() {
        let s = String::from;
        assert!(sk_plan(&SkCond::Between(s("b"), s("a"))).is_err());
        assert_eq!(sk_plan(&SkCond::Eq(s(""))).unwrap(), None);
        assert_eq!(sk_plan(&SkCond::Le(s(""))).unwrap(), None);
        assert_eq!(
            sk_plan(&SkCond::BeginsWith(s(""))).unwrap(),
            Some(SkCond::Any)
        );
        assert_eq!(sk_plan(&SkCond::Ge(s(""))).unwrap(), Some(SkCond::Any));
        assert_eq!(
            sk_plan(&SkCond::Between(s(""), s("m"))).unwrap(),
            Some(SkCond::Le(s("m")))
        );
        assert_eq!(sk_plan(&SkCond::Between(s(""), s(""))).unwrap(), None);
        let q = Query::partition("p").on(Index::Gsi1);
        let mut ph = Placeholders::default();
        let k = key_condition(&q, &SkCond::Between(s("a"), s("b")), &mut ph);
        assert_eq!(k, "#n0 = :v0 AND #n1 BETWEEN :v1 AND :v2");
        assert_eq!(ph.names.get("#n1").map(String::as_str), Some("gsi1sk"));
    }

    #[test]
    fn start_after_must_be_in_the_partition() {
        let q = Query::partition("p").on(Index::Gsi2);
        let good = obj(json!({"gsi2pk": "p", "gsi2sk": "t", "pk": "a", "sk": "b", "x": 1}));
        let key = start_key(&q, &good).unwrap();
        assert_eq!(key.len(), 4, "only key attributes");
        let bad = obj(json!({"gsi2pk": "q", "gsi2sk": "t", "pk": "a", "sk": "b"}));
        assert!(matches!(start_key(&q, &bad), Err(StoreError::Invalid(_))));
        let table = Query::partition("p");
        let bad = obj(json!({"pk": "q", "sk": "b"}));
        assert!(matches!(
            start_key(&table, &bad),
            Err(StoreError::Invalid(_))
        ));
    }

    fn reason(code: &str) -> CancellationReason {
        CancellationReason::builder().code(code).build()
    }

    #[test]
    fn cancellation_reasons_map_one_per_operation() {
        let res = cancellation(
            &[
                reason("None"),
                reason("ConditionalCheckFailed"),
                reason("TransactionConflict"),
            ],
            3,
        );
        assert_eq!(
            res,
            StoreError::TransactionCanceled {
                reasons: vec![
                    TxReason::None,
                    TxReason::ConditionFailed,
                    TxReason::Conflict
                ]
            }
        );
        assert!(matches!(
            cancellation(&[reason("None"), reason("ValidationError")], 2),
            StoreError::Invalid(_)
        ));
        assert!(matches!(
            cancellation(&[reason("ThrottlingError"), reason("None")], 2),
            StoreError::Unavailable(_)
        ));
        assert_eq!(
            cancellation(&[reason("ItemCollectionSizeLimitExceeded")], 1),
            StoreError::TransactionCanceled {
                reasons: vec![TxReason::Other("ItemCollectionSizeLimitExceeded".into())]
            }
        );
        assert!(matches!(
            cancellation(&[reason("None")], 2),
            StoreError::Backend(_)
        ));
    }

    #[test]
    fn service_errors_map_to_variants() {
        let e = |code| service_error("op", 400, Some(code), Some("msg"));
        assert_eq!(
            e("ConditionalCheckFailedException"),
            StoreError::ConditionFailed
        );
        assert!(matches!(e("ValidationException"), StoreError::Invalid(_)));
        for code in [
            "ProvisionedThroughputExceededException",
            "RequestLimitExceeded",
            "ThrottlingException",
            "InternalServerError",
        ] {
            assert!(matches!(e(code), StoreError::Unavailable(_)), "{code}");
        }
        assert_eq!(
            e("ResourceNotFoundException"),
            StoreError::Backend("op: HTTP 400 ResourceNotFoundException: msg".into())
        );
        assert!(matches!(
            service_error("op", 500, None, None),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            service_error("op", 400, None, None),
            StoreError::Backend(_)
        ));
    }

    #[test]
    fn numbers_convert_exactly() {
        let item = obj(json!({
            "pk": "p", "sk": "s", "i": -7, "big": u64::MAX, "min": i64::MIN, "f": 1.25,
            "tiny": 1e-7, "nested": [{"x": 2.5}],
        }));
        let attrs = to_attrs(&item).unwrap();
        assert_eq!(attrs.get("f"), Some(&AttributeValue::N("1.25".into())));
        assert_eq!(from_attrs(attrs).unwrap(), item);
        // One number type: a float without a fraction reads back as an
        // integer (DynamoDB itself normalises `2.0` to `2`); equal by
        // `cond::values_equal`.
        let attrs = to_attrs(&obj(json!({"x": 2.0}))).unwrap();
        assert_eq!(attrs.get("x"), Some(&AttributeValue::N("2".into())));
        assert_eq!(from_attrs(attrs).unwrap().get("x"), Some(&json!(2)));
    }

    #[test]
    fn schema_matches_the_store_constants() {
        let schema = table_schema();
        assert_eq!(schema.key_schema, vec![(PK, "HASH"), (SK, "RANGE")]);
        assert_eq!(schema.indexes.len(), Index::ALL.len());
        assert_eq!(schema.attributes.len(), 2 + 2 * Index::ALL.len());
        assert_eq!(schema.ttl_attribute, TTL);
    }

    #[tokio::test]
    async fn create_table_is_idempotent_and_enables_ttl() {
        let Some(client) = test_client() else { return };
        let table = format!("dhukuti-test-{}", ulid::Ulid::new());
        create_table(&client, &table).await.expect("create");
        create_table(&client, &table).await.expect("create again");
        let ttl = client
            .describe_time_to_live()
            .table_name(&table)
            .send()
            .await
            .expect("describe ttl");
        let ttl = ttl.time_to_live_description().expect("ttl description");
        assert_eq!(ttl.attribute_name(), Some(TTL));
        let out = client
            .describe_table()
            .table_name(&table)
            .send()
            .await
            .expect("describe");
        let t = out.table().expect("table");
        let mut names: Vec<&str> = t
            .global_secondary_indexes()
            .iter()
            .filter_map(|g| g.index_name())
            .collect();
        names.sort_unstable();
        assert_eq!(names, ["gsi1", "gsi2", "gsi3", "gsi4", "gsi5", "gsi6"]);
        assert_eq!(
            t.billing_mode_summary().and_then(|b| b.billing_mode()),
            Some(&BillingMode::PayPerRequest)
        );
    }
}
