//! Billing plans (`/v1/billing/plans`, issue 39 item 2): what a
//! subscription bills, every how long, and what happens when it is not
//! paid. Stored per project and mode (`PROJ#<p>#<mode>#BPLAN`, by id).
//! A plan's price and interval never change: a new price is a new plan.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::customers::{BillingError, MAX_NAME, PageRequest, invalid, metadata, text};
use super::period::{Calendar, IntervalUnit, validate_interval};
use super::terms::PricingModel;
use crate::Deps;
use crate::domain::checkout::MAX_AMOUNT_PAISA;
use crate::domain::record::{Changes, Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::fields::wire::{nullable, or_null, present};
use crate::ids::{PlanId, ProjectId};
use crate::keys::{self, PerMode};
use crate::kinds::Provider;
use crate::store::fence::Fence;
use crate::store::{Cond, Key, Query};
use crate::time::Timestamp;

/// The most days of `trialDays` (the SDK's bound), `gracePeriodDays`
/// (one interval of the longest day-based plan would be too long to hold
/// a subscription open unpaid: 90), and the reminder spacings (0-30, the
/// API reference's bound).
pub const MAX_TRIAL_DAYS: u32 = 365;
pub const MAX_GRACE_DAYS: u32 = 90;
pub const MAX_REMINDER_DAYS: u32 = 30;
/// Longest `description`.
pub const MAX_DESCRIPTION: usize = 1000;

/// What happens when an invoice's grace period ends unpaid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OverdueAction {
    KeepActive,
    MarkPastDue,
    Pause,
    Cancel,
}

/// A stored plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub id: PlanId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub name: String,
    pub description: Option<String>,
    /// Paisa, 1..=[`MAX_AMOUNT_PAISA`].
    pub amount: i64,
    /// Always `NPR`.
    pub currency: String,
    pub interval_unit: IntervalUnit,
    pub interval_count: u32,
    pub calendar: Calendar,
    pub trial_days: u32,
    pub grace_period_days: u32,
    pub reminder_days_before_due: u32,
    pub overdue_reminder_interval_days: u32,
    pub overdue_action: OverdueAction,
    pub default_provider: Option<Provider>,
    /// Stored before issue 40 without it: flat.
    #[serde(default)]
    pub pricing_model: PricingModel,
    pub active: bool,
    pub metadata: Map<String, Value>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

crate::attrs! { Plan {
    ID: PlanId = id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    NAME: String = name,
    DESCRIPTION: Option<String> = description,
    AMOUNT: i64 = amount,
    CURRENCY: String = currency,
    INTERVAL_UNIT: IntervalUnit = interval_unit,
    INTERVAL_COUNT: u32 = interval_count,
    CALENDAR: Calendar = calendar,
    TRIAL_DAYS: u32 = trial_days,
    GRACE_PERIOD_DAYS: u32 = grace_period_days,
    REMINDER_DAYS_BEFORE_DUE: u32 = reminder_days_before_due,
    OVERDUE_REMINDER_INTERVAL_DAYS: u32 = overdue_reminder_interval_days,
    OVERDUE_ACTION: OverdueAction = overdue_action,
    DEFAULT_PROVIDER: Option<Provider> = default_provider,
    ACTIVE: bool = active,
    METADATA: Map<String, Value> = metadata,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
} }

impl Plan {
    pub fn partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, PerMode::BillingPlans)
    }

    pub fn key(tenant: &Tenant, id: &PlanId) -> Key {
        Key::new(Plan::partition(tenant), id.as_str())
    }
}

impl Record for Plan {
    fn item_key(&self) -> Key {
        Plan::key(&Tenant::new(self.project_id.clone(), self.mode), &self.id)
    }
}

/// A plan's reminders and overdue action, as the API reference nests them.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DunningSettings {
    pub reminder_days_before_due: u32,
    pub overdue_reminder_interval_days: u32,
    pub overdue_action: OverdueAction,
}

/// The plan as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingPlan)]
pub struct PlanView {
    /// `bp_…`.
    pub id: String,
    pub livemode: bool,
    pub name: String,
    pub description: Option<String>,
    /// Paisa.
    pub amount: i64,
    pub currency: String,
    #[schema(value_type = String, pattern = "^(day|week|month|quarter|year)$")]
    pub interval_unit: IntervalUnit,
    pub interval_count: u32,
    /// Whose months are counted: `ad` (Gregorian) or `bs` (Bikram Sambat).
    #[schema(value_type = String, pattern = "^(ad|bs)$")]
    pub calendar: Calendar,
    pub trial_days: u32,
    pub grace_period_days: u32,
    pub reminder_days_before_due: u32,
    pub overdue_reminder_interval_days: u32,
    pub overdue_action: OverdueAction,
    pub dunning_settings: DunningSettings,
    pub default_provider: Option<Provider>,
    /// `flat` (the amount), `per_unit` (times the subscription's
    /// `quantity`) or `metered` (per unit of usage reported in a period).
    pub pricing_model: PricingModel,
    /// The guide's name of the same choice: `per_unit` (flat and per-unit
    /// plans: the amount times the quantity) or `metered`.
    #[schema(pattern = "^(per_unit|metered)$")]
    pub billing_scheme: String,
    pub active: bool,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl PlanView {
    pub fn of(p: &Plan) -> Self {
        PlanView {
            id: p.id.to_string(),
            livemode: p.mode.is_live(),
            name: p.name.clone(),
            description: p.description.clone(),
            amount: p.amount,
            currency: p.currency.clone(),
            interval_unit: p.interval_unit,
            interval_count: p.interval_count,
            calendar: p.calendar,
            trial_days: p.trial_days,
            grace_period_days: p.grace_period_days,
            reminder_days_before_due: p.reminder_days_before_due,
            overdue_reminder_interval_days: p.overdue_reminder_interval_days,
            overdue_action: p.overdue_action,
            dunning_settings: DunningSettings {
                reminder_days_before_due: p.reminder_days_before_due,
                overdue_reminder_interval_days: p.overdue_reminder_interval_days,
                overdue_action: p.overdue_action,
            },
            default_provider: p.default_provider,
            pricing_model: p.pricing_model,
            billing_scheme: match p.pricing_model {
                PricingModel::Metered => "metered",
                PricingModel::Flat | PricingModel::PerUnit => "per_unit",
            }
            .into(),
            active: p.active,
            metadata: p.metadata.clone(),
            created_at: p.created_at,
            updated_at: p.updated_at,
        }
    }
}

/// `POST /v1/billing/plans` (the SDK's `CreatePlanParams`, and our
/// `calendar`). Numbers are read wide and checked here, so an out-of-range
/// one is a 400 naming it, not a parse error.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateBillingPlan)]
pub struct CreatePlan {
    pub name: String,
    /// Paisa, 1 to 100,000,000 (NPR 10,00,000).
    pub amount: i64,
    #[schema(value_type = String, pattern = "^(day|week|month|quarter|year)$")]
    pub interval_unit: String,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 1)]
    pub interval_count: Option<i64>,
    /// `NPR` only.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub currency: Option<String>,
    #[serde(default, deserialize_with = "or_null")]
    pub description: Option<String>,
    /// `ad` (default) or `bs`.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, value_type = Option<String>, pattern = "^(ad|bs)$")]
    pub calendar: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 0, maximum = 365)]
    pub trial_days: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 0, maximum = 90)]
    pub grace_period_days: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 0, maximum = 30)]
    pub reminder_days_before_due: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 0, maximum = 30)]
    pub overdue_reminder_interval_days: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub overdue_action: Option<OverdueAction>,
    #[serde(default, deserialize_with = "or_null")]
    #[schema(value_type = Option<String>)]
    pub default_provider: Option<String>,
    /// `flat` (default), `per_unit` or `metered`.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, value_type = Option<String>, pattern = "^(flat|per_unit|metered)$")]
    pub pricing_model: Option<String>,
    /// The guide's name: `per_unit` (taken as `per_unit`) or `metered`.
    /// With `pricingModel` too, they must agree.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, value_type = Option<String>, pattern = "^(per_unit|metered)$")]
    pub billing_scheme: Option<String>,
    #[serde(default, deserialize_with = "or_null")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// `PATCH /v1/billing/plans/{id}` (the SDK's `UpdatePlanParams`). The
/// price and the interval are not among them: a body carrying `amount`,
/// `currency`, `intervalUnit`, `intervalCount`, `calendar` or `trialDays`
/// is refused naming it (a new price is a new plan).
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = UpdateBillingPlan)]
pub struct UpdatePlan {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub description: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub active: Option<bool>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    pub default_provider: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 0, maximum = 90)]
    pub grace_period_days: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 0, maximum = 30)]
    pub reminder_days_before_due: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 0, maximum = 30)]
    pub overdue_reminder_interval_days: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub overdue_action: Option<OverdueAction>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Option<Map<String, Value>>>,
    // Read only to be refused by name.
    #[serde(default)]
    #[schema(ignore)]
    pub amount: Option<Value>,
    #[serde(default)]
    #[schema(ignore)]
    pub currency: Option<Value>,
    #[serde(default)]
    #[schema(ignore)]
    pub interval_unit: Option<Value>,
    #[serde(default)]
    #[schema(ignore)]
    pub interval_count: Option<Value>,
    #[serde(default)]
    #[schema(ignore)]
    pub calendar: Option<Value>,
    #[serde(default)]
    #[schema(ignore)]
    pub trial_days: Option<Value>,
}

/// `value` within `0..=max` (`min..=max`), else a 400 naming `field`.
fn days(field: &str, value: i64, min: u32, max: u32) -> Result<u32, BillingError> {
    match u32::try_from(value) {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(invalid(
            field,
            format!("{field} must be an integer from {min} to {max}, got {value}"),
        )),
    }
}

fn interval_unit(raw: &str) -> Result<IntervalUnit, BillingError> {
    serde_json::from_value(Value::from(raw)).map_err(|_| {
        invalid(
            "intervalUnit",
            format!("intervalUnit must be day, week, month, quarter or year, got {raw:?}"),
        )
    })
}

fn calendar(raw: &str) -> Result<Calendar, BillingError> {
    serde_json::from_value(Value::from(raw)).map_err(|_| {
        invalid(
            "calendar",
            format!("calendar must be ad or bs, got {raw:?}"),
        )
    })
}

fn provider(raw: &str) -> Result<Provider, BillingError> {
    Provider::parse(raw).ok_or_else(|| {
        invalid(
            "defaultProvider",
            format!("defaultProvider must be esewa, khalti or fonepay, or null, got {raw:?}"),
        )
    })
}

fn pricing_model(raw: &str) -> Result<PricingModel, BillingError> {
    PricingModel::parse(raw).ok_or_else(|| {
        invalid(
            "pricingModel",
            format!("pricingModel must be flat, per_unit or metered, got {raw:?}"),
        )
    })
}

/// `pricingModel`, or the guide's `billingScheme`; both: the same.
fn model_of(model: Option<&str>, scheme: Option<&str>) -> Result<PricingModel, BillingError> {
    let scheme = scheme
        .map(|raw| match raw {
            "per_unit" => Ok(PricingModel::PerUnit),
            "metered" => Ok(PricingModel::Metered),
            _ => Err(invalid(
                "billingScheme",
                format!("billingScheme must be per_unit or metered, got {raw:?}"),
            )),
        })
        .transpose()?;
    match (model.map(pricing_model).transpose()?, scheme) {
        (Some(m), Some(s))
            if m != s && !(m == PricingModel::Flat && s == PricingModel::PerUnit) =>
        {
            Err(invalid(
                "billingScheme",
                format!(
                    "billingScheme {:?} contradicts pricingModel {:?}",
                    s.as_str(),
                    m.as_str()
                ),
            ))
        }
        (Some(m), _) => Ok(m),
        (None, Some(s)) => Ok(s),
        (None, None) => Ok(PricingModel::Flat),
    }
}

fn description(raw: &str) -> Result<String, BillingError> {
    text("description", raw, MAX_DESCRIPTION)
}

/// The plan a create makes (checked; not stored yet).
pub fn new_plan(tenant: &Tenant, body: CreatePlan, now: Timestamp) -> Result<Plan, BillingError> {
    let name = text("name", &body.name, MAX_NAME)?;
    if !(1..=MAX_AMOUNT_PAISA).contains(&body.amount) {
        return Err(invalid(
            "amount",
            format!("amount must be from 1 to {MAX_AMOUNT_PAISA} paisa (NPR 10,00,000)"),
        ));
    }
    match body.currency.as_deref() {
        None | Some("NPR") => {}
        Some(other) => {
            return Err(invalid(
                "currency",
                format!("currency must be NPR, got {other:?}"),
            ));
        }
    }
    let unit = interval_unit(&body.interval_unit)?;
    let count = body.interval_count.unwrap_or(1);
    let count = u32::try_from(count)
        .map_err(|_| invalid("intervalCount", "intervalCount must be at least 1"))?;
    validate_interval(unit, count, None).map_err(|e| invalid("intervalCount", e.to_string()))?;
    let dunning = |field, v: Option<i64>, default, max| days(field, v.unwrap_or(default), 0, max);
    Ok(Plan {
        id: PlanId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        name,
        description: body.description.as_deref().map(description).transpose()?,
        amount: body.amount,
        currency: "NPR".into(),
        interval_unit: unit,
        interval_count: count,
        calendar: body
            .calendar
            .as_deref()
            .map(calendar)
            .transpose()?
            .unwrap_or(Calendar::Ad),
        trial_days: dunning("trialDays", body.trial_days, 0, MAX_TRIAL_DAYS)?,
        grace_period_days: dunning("gracePeriodDays", body.grace_period_days, 0, MAX_GRACE_DAYS)?,
        reminder_days_before_due: dunning(
            "reminderDaysBeforeDue",
            body.reminder_days_before_due,
            3,
            MAX_REMINDER_DAYS,
        )?,
        overdue_reminder_interval_days: dunning(
            "overdueReminderIntervalDays",
            body.overdue_reminder_interval_days,
            3,
            MAX_REMINDER_DAYS,
        )?,
        overdue_action: body.overdue_action.unwrap_or(OverdueAction::MarkPastDue),
        default_provider: body.default_provider.as_deref().map(provider).transpose()?,
        pricing_model: model_of(
            body.pricing_model.as_deref(),
            body.billing_scheme.as_deref(),
        )?,
        active: true,
        metadata: metadata(body.metadata.unwrap_or_default())?,
        created_at: now,
        updated_at: now,
    })
}

/// Creates a plan. With the request's idempotency `fence`, a retry after
/// a lost answer finds the first one.
pub async fn create(
    deps: &Deps,
    tenant: &Tenant,
    body: CreatePlan,
    fence: Option<&Fence>,
) -> Result<Plan, BillingError> {
    let plan = new_plan(tenant, body, deps.clock.now())?;
    let put = plan.put_new()?;
    match Fence::put_once(fence, &*deps.store, put, plan.id.as_str()).await? {
        None => Ok(plan),
        Some(first) => get(deps, tenant, &PlanId::stored(first)).await,
    }
}

/// The plan `id` of the tenant (another project's or mode's: not found).
pub async fn get(deps: &Deps, tenant: &Tenant, id: &PlanId) -> Result<Plan, BillingError> {
    match crate::domain::record::get(&*deps.store, &Plan::key(tenant, id)).await? {
        Some(p) => Ok(p),
        None => Err(BillingError::NotFound {
            what: "plan",
            named: id.to_string(),
        }),
    }
}

/// A page of plans, newest first, and the total (of those with `active`
/// as asked, when asked).
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    page: PageRequest,
    active: Option<bool>,
) -> Result<(Vec<Plan>, u64), BillingError> {
    let mut query = Query::partition(Plan::partition(tenant)).backward();
    if let Some(a) = active {
        query = query.filter(Plan::ACTIVE.eq(&a));
    }
    let items = crate::store::query_window(&*deps.store, &query, page.offset(), page.limit).await?;
    let found = items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<Plan>, _>>()?;
    let total = deps.store.count(&query).await?;
    Ok((found, total))
}

/// The changes a PATCH makes (checked; `updated_at` included). A price
/// or interval field is refused by name.
pub fn changes(body: UpdatePlan, now: Timestamp) -> Result<Changes<Plan>, BillingError> {
    for (field, sent) in [
        ("amount", &body.amount),
        ("currency", &body.currency),
        ("intervalUnit", &body.interval_unit),
        ("intervalCount", &body.interval_count),
        ("calendar", &body.calendar),
        ("trialDays", &body.trial_days),
    ] {
        if sent.is_some() {
            return Err(invalid(
                field,
                format!(
                    "{field} cannot change on a plan: a new price or interval is a new plan (create one and move subscribers to it)"
                ),
            ));
        }
    }
    let mut c = Changes::<Plan>::new();
    if let Some(name) = &body.name {
        c = c.set(Plan::NAME, &text("name", name, MAX_NAME)?);
    }
    c = match body.description {
        Some(Some(d)) => c.set_some(Plan::DESCRIPTION, &description(&d)?),
        Some(None) => c.remove(Plan::DESCRIPTION),
        None => c,
    };
    if let Some(a) = body.active {
        c = c.set(Plan::ACTIVE, &a);
    }
    c = match body.default_provider {
        Some(Some(p)) => c.set_some(Plan::DEFAULT_PROVIDER, &provider(&p)?),
        Some(None) => c.remove(Plan::DEFAULT_PROVIDER),
        None => c,
    };
    if let Some(v) = body.grace_period_days {
        let v = days("gracePeriodDays", v, 0, MAX_GRACE_DAYS)?;
        c = c.set(Plan::GRACE_PERIOD_DAYS, &v);
    }
    if let Some(v) = body.reminder_days_before_due {
        let v = days("reminderDaysBeforeDue", v, 0, MAX_REMINDER_DAYS)?;
        c = c.set(Plan::REMINDER_DAYS_BEFORE_DUE, &v);
    }
    if let Some(v) = body.overdue_reminder_interval_days {
        let v = days("overdueReminderIntervalDays", v, 0, MAX_REMINDER_DAYS)?;
        c = c.set(Plan::OVERDUE_REMINDER_INTERVAL_DAYS, &v);
    }
    if let Some(a) = body.overdue_action {
        c = c.set(Plan::OVERDUE_ACTION, &a);
    }
    if let Some(m) = body.metadata {
        c = c.set(Plan::METADATA, &metadata(m.unwrap_or_default())?);
    }
    Ok(c.set(Plan::UPDATED_AT, &now))
}

/// Changes the keys sent; answers the plan as written.
pub async fn update(
    deps: &Deps,
    tenant: &Tenant,
    id: &PlanId,
    body: UpdatePlan,
) -> Result<Plan, BillingError> {
    let update = changes(body, deps.clock.now())?;
    match deps
        .store
        .update(&Plan::key(tenant, id), update.into(), Some(Cond::Exists))
        .await
    {
        Ok(item) => Ok(from_item(item)?),
        Err(e) if e.is_condition_failure() => Err(BillingError::NotFound {
            what: "plan",
            named: id.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::{CreatePlan, OverdueAction, UpdatePlan, create, get, list, new_plan, update};
    use crate::domain::billing::customers::{BillingError, PageRequest};
    use crate::domain::billing::period::{Calendar, IntervalUnit};
    use crate::domain::{Mode, Tenant};
    use crate::ids::ProjectId;
    use crate::refusal::Refusal;
    use crate::store::Store;
    use crate::testenv::memory_store;
    use crate::time::{Clock, SystemClock};

    fn deps(store: &Arc<dyn Store>) -> crate::AppState {
        crate::AppState::new(
            store.clone(),
            Arc::new(SystemClock),
            crate::Config {
                public_base_url: "https://pay.example".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
    }

    fn tenant() -> Tenant {
        Tenant::new(ProjectId::stored("p1"), Mode::Sandbox)
    }

    fn plan(extra: serde_json::Value) -> serde_json::Value {
        let mut v = json!({"name": "Pro Monthly", "amount": 99_900, "intervalUnit": "month"});
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        v
    }

    fn field_of(e: BillingError) -> String {
        Refusal::from(e).field.unwrap_or_default()
    }

    #[test]
    fn the_validation_table() {
        let now = SystemClock.now();
        for (extra, field) in [
            (json!({"amount": 0}), "amount"),
            (json!({"amount": -5}), "amount"),
            (json!({"amount": 100_000_001}), "amount"),
            (json!({"currency": "USD"}), "currency"),
            (json!({"intervalUnit": "fortnight"}), "intervalUnit"),
            (json!({"intervalCount": 0}), "intervalCount"),
            (json!({"intervalCount": -1}), "intervalCount"),
            (json!({"intervalCount": 13}), "intervalCount"),
            (json!({"calendar": "lunar"}), "calendar"),
            (json!({"trialDays": 366}), "trialDays"),
            (json!({"trialDays": -1}), "trialDays"),
            (json!({"gracePeriodDays": 91}), "gracePeriodDays"),
            (
                json!({"reminderDaysBeforeDue": 31}),
                "reminderDaysBeforeDue",
            ),
            (
                json!({"overdueReminderIntervalDays": 31}),
                "overdueReminderIntervalDays",
            ),
            (json!({"defaultProvider": "paypal"}), "defaultProvider"),
            (json!({"name": ""}), "name"),
            (json!({"metadata": {"k": [1]}}), "metadata.k"),
        ] {
            let body: CreatePlan =
                serde_json::from_value(plan(extra.clone())).unwrap_or_else(|e| panic!("{e}"));
            match new_plan(&tenant(), body, now) {
                Err(e) => assert_eq!(field_of(e), field, "{extra}"),
                Ok(_) => panic!("accepted {extra}"),
            }
        }
        let body: CreatePlan = serde_json::from_value(plan(
            json!({"calendar": "bs", "trialDays": 365, "intervalCount": 12}),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let p = new_plan(&tenant(), body, now).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.id.as_str().starts_with("bp_"));
        assert_eq!(p.calendar, Calendar::Bs);
        assert_eq!(p.interval_unit, IntervalUnit::Month);
        assert_eq!(p.currency, "NPR");
        assert_eq!(p.overdue_action, OverdueAction::MarkPastDue);
        assert!(p.active);
    }

    #[test]
    fn a_new_price_is_a_new_plan() {
        let now = SystemClock.now();
        for field in [
            "amount",
            "currency",
            "intervalUnit",
            "intervalCount",
            "calendar",
            "trialDays",
        ] {
            let body: UpdatePlan =
                serde_json::from_value(json!({ field: 1 })).unwrap_or_else(|e| panic!("{e}"));
            match super::changes(body, now) {
                Err(e) => assert_eq!(field_of(e), field),
                Ok(_) => panic!("{field} changed"),
            }
        }
        assert!(serde_json::from_value::<UpdatePlan>(json!({"price": 1})).is_err());
    }

    #[tokio::test]
    async fn create_list_by_active_update() {
        let store = memory_store();
        let d = deps(&store);
        let t = tenant();
        let mut ids = Vec::new();
        for name in ["A", "B", "C"] {
            let body: CreatePlan = serde_json::from_value(plan(json!({"name": name})))
                .unwrap_or_else(|e| panic!("{e}"));
            ids.push(
                create(&d, &t, body, None)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .id,
            );
        }
        let patch: UpdatePlan = serde_json::from_value(
            json!({"active": false, "description": "old", "overdueAction": "cancel", "defaultProvider": "khalti"}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let p = update(&d, &t, &ids[1], patch)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.active);
        assert_eq!(p.overdue_action, OverdueAction::Cancel);
        assert_eq!(p.amount, 99_900);
        let page = PageRequest { page: 1, limit: 50 };
        let (active, n) = list(&d, &t, page, Some(true))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n, 2);
        assert!(active.iter().all(|p| p.active));
        let (_, all) = list(&d, &t, page, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(all, 3);
        let other = Tenant::new(ProjectId::stored("p2"), Mode::Sandbox);
        assert!(matches!(
            get(&d, &other, &ids[0]).await,
            Err(BillingError::NotFound { .. })
        ));
        let clear: UpdatePlan =
            serde_json::from_value(json!({"description": null, "defaultProvider": null}))
                .unwrap_or_else(|e| panic!("{e}"));
        let p = update(&d, &t, &ids[1], clear)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.description, None);
        assert_eq!(p.default_provider, None);
    }
}
