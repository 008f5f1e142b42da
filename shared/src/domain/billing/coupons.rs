//! Coupons and promotion codes (`/v1/billing/coupons`,
//! `/v1/billing/promotion-codes`, issue 40 item 1). A coupon is a reusable
//! discount (percent or amount; once, repeating or forever); a promotion
//! code is a customer-facing string that redeems one, with limits of its
//! own. Both are stored per project and mode (`PROJ#<p>#<mode>#COUPON` and
//! `#PROMO`, by id); each code is claimed, upper-cased, in its own
//! partition (`#COUPONCODE`, `#PROMOCODE`) in the transaction that creates
//! the record, so a code is unique per tenant. The redemption counters are
//! raised by `discounts::apply`, conditioned on `redeemedCount` being below
//! `maxRedemptions`, in the transaction that writes the discount.
//!
//! [`validate`] answers whether a code applies for a customer, plan and
//! amount, and the discount it would give; it writes nothing.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::customers::{BillingError, MAX_NAME, PageRequest, invalid, metadata, text};
use super::invoice::BillingInvoice;
use super::plans;
use crate::Deps;
use crate::domain::checkout::MAX_AMOUNT_PAISA;
use crate::domain::outbox::{Event, EventType};
use crate::domain::record::{Changes, Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::fields::wire::{or_null, present};
use crate::ids::{CouponId, CustomerId, PlanId, ProjectId, PromotionCodeId};
use crate::keys::{self, PerMode};
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Key, Query, StoreError, TxReason};
use crate::time::Timestamp;

/// Longest code, and most `appliesToPlanIds` / `customerIds`.
pub const MAX_CODE: usize = 64;
pub const MAX_LIST_IDS: usize = 100;
/// The most `durationInCycles` (ten years of monthly cycles).
pub const MAX_CYCLES: i64 = 120;

/// Why a coupon or promotion code request is refused.
#[derive(Debug, thiserror::Error)]
pub enum CouponError {
    #[error(transparent)]
    Billing(#[from] BillingError),
    /// The tenant already has a coupon with this code (any case).
    #[error("a coupon with code {0:?} already exists in this project and mode")]
    CouponCodeTaken(String),
    /// The tenant already has a promotion code with this code.
    #[error("a promotion code with code {0:?} already exists in this project and mode")]
    PromotionCodeTaken(String),
    /// The coupon or code cannot be redeemed now: `field` is what the
    /// caller sent, `reason` why.
    #[error("{}", reason.message())]
    Unusable {
        field: &'static str,
        reason: Unusable,
    },
}

impl From<StoreError> for CouponError {
    fn from(e: StoreError) -> Self {
        CouponError::Billing(BillingError::Store(e))
    }
}

impl From<CouponError> for Refusal {
    fn from(err: CouponError) -> Self {
        match err {
            CouponError::Billing(e) => e.into(),
            e @ CouponError::CouponCodeTaken(_) => {
                Refusal::conflict("coupon_code_taken", e.to_string()).at("code")
            }
            e @ CouponError::PromotionCodeTaken(_) => {
                Refusal::conflict("promotion_code_taken", e.to_string()).at("code")
            }
            CouponError::Unusable { field, reason } => Refusal::invalid(field, reason.message())
                .with_extra("reason", Value::from(reason.code())),
        }
    }
}

/// Why a coupon or promotion code does not apply (validate's `reason`,
/// apply-coupon's 400).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unusable {
    NoSuchCode,
    CouponInactive,
    CodeInactive,
    CouponExpired,
    CodeExpired,
    CouponExhausted,
    CodeExhausted,
    OtherPlan,
    OtherCustomer,
    NotFirstTime,
    BelowMinimum { minimum: i64 },
    NeedsCustomer,
    NeedsAmount,
}

impl Unusable {
    pub fn code(&self) -> &'static str {
        match self {
            Unusable::NoSuchCode => "no_such_code",
            Unusable::CouponInactive => "coupon_inactive",
            Unusable::CodeInactive => "promotion_code_inactive",
            Unusable::CouponExpired => "coupon_expired",
            Unusable::CodeExpired => "promotion_code_expired",
            Unusable::CouponExhausted => "coupon_redemption_limit_reached",
            Unusable::CodeExhausted => "promotion_code_redemption_limit_reached",
            Unusable::OtherPlan => "plan_not_eligible",
            Unusable::OtherCustomer => "customer_not_eligible",
            Unusable::NotFirstTime => "not_first_time_transaction",
            Unusable::BelowMinimum { .. } => "below_minimum_amount",
            Unusable::NeedsCustomer => "customer_required",
            Unusable::NeedsAmount => "amount_required",
        }
    }

    pub fn message(&self) -> String {
        match self {
            Unusable::NoSuchCode => "No such promotion code".into(),
            Unusable::CouponInactive => "The coupon is no longer active".into(),
            Unusable::CodeInactive => "The promotion code is no longer active".into(),
            Unusable::CouponExpired => "The coupon's redeemBy date has passed".into(),
            Unusable::CodeExpired => "The promotion code has expired".into(),
            Unusable::CouponExhausted => "Coupon redemption limit reached".into(),
            Unusable::CodeExhausted => "Promotion code redemption limit reached".into(),
            Unusable::OtherPlan => "The coupon does not apply to this plan".into(),
            Unusable::OtherCustomer => "The promotion code is not for this customer".into(),
            Unusable::NotFirstTime => {
                "The promotion code is for customers who have not paid an invoice yet".into()
            }
            Unusable::BelowMinimum { minimum } => {
                format!("The promotion code needs an amount of at least {minimum} paisa")
            }
            Unusable::NeedsCustomer => {
                "The promotion code is for some customers only: send customerId".into()
            }
            Unusable::NeedsAmount => {
                "The promotion code has a minimum amount: send amount or planId".into()
            }
        }
    }
}

fn unusable(field: &'static str, reason: Unusable) -> CouponError {
    CouponError::Unusable { field, reason }
}

// ---------------------------------------------------------------------------
// Records.

/// Percent or fixed amount off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DiscountType {
    Percent,
    Amount,
}

/// How many invoices a redemption discounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CouponDuration {
    /// The next invoice only.
    Once,
    /// The next `durationInCycles` invoices.
    Repeating,
    /// Every invoice until the coupon is deactivated.
    Forever,
}

/// What a coupon takes off: the terms a discount keeps a copy of.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CouponTerms {
    pub discount_type: DiscountType,
    /// 1..=100 for percent coupons.
    pub percent_off: Option<u8>,
    /// Paisa, for amount coupons.
    pub amount_off: Option<i64>,
    pub duration: CouponDuration,
    /// Repeating coupons only.
    pub duration_in_cycles: Option<u32>,
    /// `None`: every plan.
    pub applies_to_plan_ids: Option<Vec<PlanId>>,
}

impl CouponTerms {
    /// The discount these terms give on `amount` paisa: a percent rounded
    /// half up, an amount capped at `amount` (never negative).
    pub fn discount_on(&self, amount: i64) -> i64 {
        let amount = amount.max(0);
        match (self.discount_type, self.percent_off, self.amount_off) {
            (DiscountType::Percent, Some(p), _) => {
                let p = i128::from(p);
                let d = (i128::from(amount) * p * 2 + 100) / 200;
                i64::try_from(d).unwrap_or(amount).min(amount)
            }
            (DiscountType::Amount, _, Some(a)) => a.clamp(0, amount),
            _ => 0,
        }
    }

    /// Whether the terms apply to plan `plan`.
    pub fn applies_to(&self, plan: &PlanId) -> bool {
        self.applies_to_plan_ids
            .as_ref()
            .is_none_or(|ids| ids.contains(plan))
    }
}

/// A stored coupon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Coupon {
    pub id: CouponId,
    pub project_id: ProjectId,
    pub mode: Mode,
    /// As sent (trimmed); unique per tenant ignoring case.
    pub code: String,
    pub name: String,
    pub terms: CouponTerms,
    /// Always `NPR`.
    pub currency: String,
    pub max_redemptions: Option<u32>,
    pub redeemed_count: u32,
    pub redeem_by: Option<Timestamp>,
    pub active: bool,
    pub metadata: Map<String, Value>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

crate::attrs! { Coupon {
    ID: CouponId = id,
    CODE: String = code,
    NAME: String = name,
    MAX_REDEMPTIONS: Option<u32> = max_redemptions,
    REDEEMED_COUNT: u32 = redeemed_count,
    REDEEM_BY: Option<Timestamp> = redeem_by,
    ACTIVE: bool = active,
    METADATA: Map<String, Value> = metadata,
    UPDATED_AT: Timestamp = updated_at,
} }

impl Coupon {
    pub fn partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, PerMode::Coupons)
    }

    pub fn key(tenant: &Tenant, id: &CouponId) -> Key {
        Key::new(Coupon::partition(tenant), id.as_str())
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// Why it cannot be redeemed at `now`, if it cannot (the field the
    /// caller named it by: `field`).
    pub fn unusable(&self, now: Timestamp) -> Option<Unusable> {
        if !self.active {
            return Some(Unusable::CouponInactive);
        }
        if self.redeem_by.is_some_and(|t| t <= now) {
            return Some(Unusable::CouponExpired);
        }
        if self
            .max_redemptions
            .is_some_and(|m| self.redeemed_count >= m)
        {
            return Some(Unusable::CouponExhausted);
        }
        None
    }

    /// The condition of a redemption's counter raise: active, and below
    /// the cap (as read: the cap never changes).
    pub fn redeemable(&self) -> Cond {
        let active = Coupon::ACTIVE.eq(&true);
        match self.max_redemptions {
            Some(m) => Cond::And(vec![active, Coupon::REDEEMED_COUNT.lt(&m)]),
            None => Cond::And(vec![Cond::Exists, active]),
        }
    }
}

impl Record for Coupon {
    fn item_key(&self) -> Key {
        Coupon::key(&self.tenant(), &self.id)
    }
}

/// The claim of a code in its tenant: one record per code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CodeClaim {
    pub project_id: ProjectId,
    pub mode: Mode,
    /// Upper-cased.
    pub code: String,
    /// The coupon's id, for a coupon's code.
    pub coupon_id: Option<CouponId>,
    /// The promotion code's id, for a promotion code's.
    pub promotion_code_id: Option<PromotionCodeId>,
}

impl CodeClaim {
    pub fn coupon_key(tenant: &Tenant, code: &str) -> Key {
        Key::new(
            keys::per_mode(&tenant.project, tenant.mode, PerMode::CouponCodes),
            code,
        )
    }

    pub fn promotion_key(tenant: &Tenant, code: &str) -> Key {
        Key::new(
            keys::per_mode(&tenant.project, tenant.mode, PerMode::PromotionCodeNames),
            code,
        )
    }
}

impl Record for CodeClaim {
    fn item_key(&self) -> Key {
        let t = Tenant::new(self.project_id.clone(), self.mode);
        if self.coupon_id.is_some() {
            CodeClaim::coupon_key(&t, &self.code)
        } else {
            CodeClaim::promotion_key(&t, &self.code)
        }
    }
}

/// A stored promotion code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromotionCode {
    pub id: PromotionCodeId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub coupon_id: CouponId,
    /// Upper-cased; unique per tenant.
    pub code: String,
    pub max_redemptions: Option<u32>,
    pub redeemed_count: u32,
    pub expires_at: Option<Timestamp>,
    pub first_time_transaction: bool,
    /// Paisa.
    pub minimum_amount: Option<i64>,
    /// `None`: any customer.
    pub customer_ids: Option<Vec<CustomerId>>,
    pub active: bool,
    pub metadata: Map<String, Value>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

crate::attrs! { PromotionCode {
    ID: PromotionCodeId = id,
    COUPON_ID: CouponId = coupon_id,
    CODE: String = code,
    MAX_REDEMPTIONS: Option<u32> = max_redemptions,
    REDEEMED_COUNT: u32 = redeemed_count,
    ACTIVE: bool = active,
    METADATA: Map<String, Value> = metadata,
    UPDATED_AT: Timestamp = updated_at,
} }

impl PromotionCode {
    pub fn partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, PerMode::PromotionCodes)
    }

    pub fn key(tenant: &Tenant, id: &PromotionCodeId) -> Key {
        Key::new(PromotionCode::partition(tenant), id.as_str())
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// Why the code itself cannot be redeemed at `now`, if it cannot.
    pub fn unusable(&self, now: Timestamp) -> Option<Unusable> {
        if !self.active {
            return Some(Unusable::CodeInactive);
        }
        if self.expires_at.is_some_and(|t| t <= now) {
            return Some(Unusable::CodeExpired);
        }
        if self
            .max_redemptions
            .is_some_and(|m| self.redeemed_count >= m)
        {
            return Some(Unusable::CodeExhausted);
        }
        None
    }

    /// As [`Coupon::redeemable`].
    pub fn redeemable(&self) -> Cond {
        let active = PromotionCode::ACTIVE.eq(&true);
        match self.max_redemptions {
            Some(m) => Cond::And(vec![active, PromotionCode::REDEEMED_COUNT.lt(&m)]),
            None => Cond::And(vec![Cond::Exists, active]),
        }
    }
}

impl Record for PromotionCode {
    fn item_key(&self) -> Key {
        PromotionCode::key(&self.tenant(), &self.id)
    }
}

// ---------------------------------------------------------------------------
// Views.

/// The coupon as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingCoupon)]
pub struct CouponView {
    /// `cpn_…`.
    pub id: String,
    pub livemode: bool,
    pub code: String,
    pub name: String,
    pub discount_type: DiscountType,
    pub percent_off: Option<u8>,
    /// Paisa.
    pub amount_off: Option<i64>,
    pub currency: String,
    pub duration: CouponDuration,
    pub duration_in_cycles: Option<u32>,
    pub max_redemptions: Option<u32>,
    /// Redemptions so far (subscriptions it was applied to).
    pub redeemed_count: u32,
    pub redeem_by: Option<Timestamp>,
    /// `null`: every plan.
    pub applies_to_plan_ids: Option<Vec<String>>,
    pub active: bool,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl CouponView {
    pub fn of(c: &Coupon) -> Self {
        CouponView {
            id: c.id.to_string(),
            livemode: c.mode.is_live(),
            code: c.code.clone(),
            name: c.name.clone(),
            discount_type: c.terms.discount_type,
            percent_off: c.terms.percent_off,
            amount_off: c.terms.amount_off,
            currency: c.currency.clone(),
            duration: c.terms.duration,
            duration_in_cycles: c.terms.duration_in_cycles,
            max_redemptions: c.max_redemptions,
            redeemed_count: c.redeemed_count,
            redeem_by: c.redeem_by,
            applies_to_plan_ids: c
                .terms
                .applies_to_plan_ids
                .as_ref()
                .map(|ids| ids.iter().map(ToString::to_string).collect()),
            active: c.active,
            metadata: c.metadata.clone(),
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }

    pub fn json(c: &Coupon) -> Value {
        serde_json::to_value(CouponView::of(c)).unwrap_or(Value::Null)
    }
}

/// The promotion code as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingPromotionCode)]
pub struct PromotionCodeView {
    /// `promo_…`.
    pub id: String,
    pub livemode: bool,
    /// Upper-case.
    pub code: String,
    pub coupon_id: String,
    pub max_redemptions: Option<u32>,
    pub redeemed_count: u32,
    pub expires_at: Option<Timestamp>,
    pub first_time_transaction: bool,
    /// Paisa.
    pub minimum_amount: Option<i64>,
    /// `null`: any customer.
    pub customer_ids: Option<Vec<String>>,
    pub active: bool,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl PromotionCodeView {
    pub fn of(p: &PromotionCode) -> Self {
        PromotionCodeView {
            id: p.id.to_string(),
            livemode: p.mode.is_live(),
            code: p.code.clone(),
            coupon_id: p.coupon_id.to_string(),
            max_redemptions: p.max_redemptions,
            redeemed_count: p.redeemed_count,
            expires_at: p.expires_at,
            first_time_transaction: p.first_time_transaction,
            minimum_amount: p.minimum_amount,
            customer_ids: p
                .customer_ids
                .as_ref()
                .map(|ids| ids.iter().map(ToString::to_string).collect()),
            active: p.active,
            metadata: p.metadata.clone(),
            created_at: p.created_at,
            updated_at: p.updated_at,
        }
    }

    pub fn json(p: &PromotionCode) -> Value {
        serde_json::to_value(PromotionCodeView::of(p)).unwrap_or(Value::Null)
    }
}

// ---------------------------------------------------------------------------
// Wire shapes (the SDK's, camelCase). Numbers are read wide and checked
// here, so an out-of-range one is a 400 naming it.

/// `POST /v1/billing/coupons` (the SDK's `CreateCouponParams`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateBillingCoupon)]
pub struct CreateCoupon {
    /// Letters, digits, `-` and `_`; unique per project and mode, any case.
    pub code: String,
    pub name: String,
    #[schema(value_type = String, pattern = "^(percent|amount)$")]
    pub discount_type: String,
    #[schema(value_type = String, pattern = "^(once|repeating|forever)$")]
    pub duration: String,
    /// 1 to 100, percent coupons only.
    #[serde(default, deserialize_with = "or_null")]
    pub percent_off: Option<i64>,
    /// Paisa, above 0, amount coupons only.
    #[serde(default, deserialize_with = "or_null")]
    pub amount_off: Option<i64>,
    /// `NPR` only.
    #[serde(default, deserialize_with = "or_null")]
    pub currency: Option<String>,
    /// 1 to 120; required for `repeating`, refused otherwise.
    #[serde(default, deserialize_with = "or_null")]
    pub duration_in_cycles: Option<i64>,
    #[serde(default, deserialize_with = "or_null")]
    pub max_redemptions: Option<i64>,
    /// In the future.
    #[serde(default, deserialize_with = "or_null")]
    pub redeem_by: Option<Timestamp>,
    /// Plans of this project and mode (`bp_…`); null: every plan.
    #[serde(default, deserialize_with = "or_null")]
    pub applies_to_plan_ids: Option<Vec<String>>,
    /// Not supported: a coupon belongs to the key's project.
    #[serde(default)]
    #[schema(ignore)]
    pub project_ids: Option<Value>,
    #[serde(default, deserialize_with = "or_null")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// `POST /v1/billing/promotion-codes` (the SDK's
/// `CreatePromotionCodeParams`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateBillingPromotionCode)]
pub struct CreatePromotionCode {
    /// `cpn_…`, the tenant's.
    pub coupon_id: String,
    /// Case-insensitive: stored upper-case.
    pub code: String,
    #[serde(default, deserialize_with = "or_null")]
    pub max_redemptions: Option<i64>,
    /// In the future.
    #[serde(default, deserialize_with = "or_null")]
    pub expires_at: Option<Timestamp>,
    /// Only for customers who have never paid a billing invoice.
    #[serde(default, deserialize_with = "or_null")]
    pub first_time_transaction: Option<bool>,
    /// Paisa: the least amount the code applies to.
    #[serde(default, deserialize_with = "or_null")]
    pub minimum_amount: Option<i64>,
    /// Only these customers (`cus_…`, the tenant's).
    #[serde(default, deserialize_with = "or_null")]
    pub customer_ids: Option<Vec<String>>,
    #[serde(default, deserialize_with = "or_null")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// `PATCH /v1/billing/promotion-codes/{id}`: `{active: false}` deactivates
/// (for good: existing redemptions remain valid); `metadata` replaces it.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = UpdateBillingPromotionCode)]
pub struct UpdatePromotionCode {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub active: Option<bool>,
    #[serde(default, deserialize_with = "or_null")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// `POST /v1/billing/promotion-codes/validate` (the SDK's
/// `ValidatePromotionCodeParams`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = ValidateBillingPromotionCode)]
pub struct ValidatePromotionCode {
    pub code: String,
    #[serde(default, deserialize_with = "or_null")]
    pub customer_id: Option<String>,
    #[serde(default, deserialize_with = "or_null")]
    pub plan_id: Option<String>,
    /// Paisa: the amount the discount is previewed on (and the minimum
    /// checked against); absent: the plan's amount.
    #[serde(default, deserialize_with = "or_null")]
    pub amount: Option<i64>,
}

/// The discount a code would give on an amount.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DiscountPreview {
    /// Paisa before the discount (`amount`, else the plan's); null when
    /// neither was sent.
    pub amount: Option<i64>,
    /// Paisa off (null when no amount is known).
    pub discount: Option<i64>,
    /// `amount - discount`.
    pub total: Option<i64>,
    pub duration: CouponDuration,
}

/// validate's answer, keyed as the guide shows it: `{valid: true, coupon,
/// promotion_code, discount_preview}` or `{valid: false, reason}`.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = BillingPromotionCodeValidation)]
pub struct Validation {
    pub valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coupon: Option<CouponView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promotion_code: Option<PromotionCodeView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discount_preview: Option<DiscountPreview>,
    /// Why not, when not valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The reason as a word (`promotion_code_expired`, …), when not valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<String>,
}

// ---------------------------------------------------------------------------
// Rules.

/// A code as stored for lookups: trimmed, upper-case; letters, digits,
/// `-` and `_`, 1 to [`MAX_CODE`] characters.
pub fn code(field: &str, raw: &str) -> Result<String, BillingError> {
    let c = raw.trim();
    let ok = !c.is_empty()
        && c.chars().count() <= MAX_CODE
        && c.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_');
    if !ok {
        return Err(invalid(
            field,
            format!("{field} must be 1 to {MAX_CODE} letters, digits, '-' or '_', got {raw:?}"),
        ));
    }
    Ok(c.to_owned())
}

fn positive_count(field: &str, v: i64, max: i64) -> Result<u32, BillingError> {
    match u32::try_from(v) {
        Ok(n) if n >= 1 && v <= max => Ok(n),
        _ => Err(invalid(
            field,
            format!("{field} must be an integer from 1 to {max}, got {v}"),
        )),
    }
}

fn future(field: &str, t: Timestamp, now: Timestamp) -> Result<Timestamp, BillingError> {
    if t <= now {
        return Err(invalid(field, format!("{field} must be in the future")));
    }
    Ok(t)
}

fn id_list<T>(
    field: &str,
    raw: &[String],
    parse: impl Fn(&str) -> Option<T>,
    what: &str,
) -> Result<Vec<T>, BillingError> {
    if raw.is_empty() || raw.len() > MAX_LIST_IDS {
        return Err(invalid(
            field,
            format!("{field} must list 1 to {MAX_LIST_IDS} {what} ids, or be null"),
        ));
    }
    raw.iter()
        .map(|r| {
            parse(r.trim())
                .ok_or_else(|| invalid(field, format!("{field}: not a {what} id: {r:?}")))
        })
        .collect()
}

/// `percentOff` or `amountOff`, as `discount_type` asks (the other refused).
fn discount_value(
    discount_type: DiscountType,
    body: &CreateCoupon,
) -> Result<(Option<u8>, Option<i64>), BillingError> {
    Ok(match discount_type {
        DiscountType::Percent => {
            if body.amount_off.is_some() {
                return Err(invalid(
                    "amountOff",
                    "amountOff is for amount coupons: a percent coupon takes percentOff",
                ));
            }
            let p = body.percent_off.ok_or_else(|| {
                invalid("percentOff", "percentOff is required for a percent coupon")
            })?;
            match u8::try_from(p) {
                Ok(p) if (1..=100).contains(&p) => (Some(p), None),
                _ => {
                    return Err(invalid(
                        "percentOff",
                        format!("percentOff must be an integer from 1 to 100, got {p}"),
                    ));
                }
            }
        }
        DiscountType::Amount => {
            if body.percent_off.is_some() {
                return Err(invalid(
                    "percentOff",
                    "percentOff is for percent coupons: an amount coupon takes amountOff",
                ));
            }
            let a = body.amount_off.ok_or_else(|| {
                invalid("amountOff", "amountOff is required for an amount coupon")
            })?;
            if !(1..=MAX_AMOUNT_PAISA).contains(&a) {
                return Err(invalid(
                    "amountOff",
                    format!("amountOff must be from 1 to {MAX_AMOUNT_PAISA} paisa, got {a}"),
                ));
            }
            (None, Some(a))
        }
    })
}

/// `duration` and its `durationInCycles` (required for `repeating` only).
fn duration_of(body: &CreateCoupon) -> Result<(CouponDuration, Option<u32>), BillingError> {
    let duration = match body.duration.as_str() {
        "once" => CouponDuration::Once,
        "repeating" => CouponDuration::Repeating,
        "forever" => CouponDuration::Forever,
        other => {
            return Err(invalid(
                "duration",
                format!("duration must be once, repeating or forever, got {other:?}"),
            ));
        }
    };
    let duration_in_cycles = match (duration, body.duration_in_cycles) {
        (CouponDuration::Repeating, Some(n)) => {
            Some(positive_count("durationInCycles", n, MAX_CYCLES)?)
        }
        (CouponDuration::Repeating, None) => {
            return Err(invalid(
                "durationInCycles",
                "durationInCycles is required when duration is repeating",
            ));
        }
        (_, Some(_)) => {
            return Err(invalid(
                "durationInCycles",
                "durationInCycles is only for duration repeating",
            ));
        }
        (_, None) => None,
    };
    Ok((duration, duration_in_cycles))
}

/// The coupon a create makes (checked, but for its plans' existence; not
/// stored yet).
pub fn new_coupon(
    tenant: &Tenant,
    body: CreateCoupon,
    now: Timestamp,
) -> Result<Coupon, BillingError> {
    if body.project_ids.is_some() {
        return Err(invalid(
            "projectIds",
            "projectIds is not supported: a coupon belongs to the project of the key that creates it",
        ));
    }
    let code = code("code", &body.code)?;
    let name = text("name", &body.name, MAX_NAME)?;
    let discount_type = match body.discount_type.as_str() {
        "percent" => DiscountType::Percent,
        "amount" => DiscountType::Amount,
        other => {
            return Err(invalid(
                "discountType",
                format!("discountType must be percent or amount, got {other:?}"),
            ));
        }
    };
    let (percent_off, amount_off) = discount_value(discount_type, &body)?;
    match body.currency.as_deref().map(str::trim) {
        None | Some("NPR") => {}
        Some(other) => {
            return Err(invalid(
                "currency",
                format!("currency must be NPR, got {other:?}"),
            ));
        }
    }
    let (duration, duration_in_cycles) = duration_of(&body)?;
    let max_redemptions = body
        .max_redemptions
        .map(|m| positive_count("maxRedemptions", m, i64::from(u32::MAX)))
        .transpose()?;
    let redeem_by = body
        .redeem_by
        .map(|t| future("redeemBy", t, now))
        .transpose()?;
    let applies_to_plan_ids = body
        .applies_to_plan_ids
        .as_deref()
        .map(|ids| id_list("appliesToPlanIds", ids, PlanId::parse, "plan"))
        .transpose()?;
    Ok(Coupon {
        id: CouponId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        code,
        name,
        terms: CouponTerms {
            discount_type,
            percent_off,
            amount_off,
            duration,
            duration_in_cycles,
            applies_to_plan_ids,
        },
        currency: "NPR".into(),
        max_redemptions,
        redeemed_count: 0,
        redeem_by,
        active: true,
        metadata: metadata(body.metadata.unwrap_or_default())?,
        created_at: now,
        updated_at: now,
    })
}

/// Whether the transaction failed on its op at `index`.
fn failed_at(e: &StoreError, index: usize) -> bool {
    matches!(e, StoreError::TransactionCanceled { reasons }
        if matches!(reasons.get(index), Some(TxReason::ConditionFailed)))
}

/// Creates a coupon with its code's claim and `coupon.created`, in one
/// transaction. With the request's idempotency `fence`, a retry after a
/// lost answer finds the first one.
pub async fn create_coupon(
    deps: &Deps,
    tenant: &Tenant,
    body: CreateCoupon,
    fence: Option<&Fence>,
) -> Result<Coupon, CouponError> {
    let now = deps.clock.now();
    let coupon = new_coupon(tenant, body, now)?;
    if let Some(ids) = &coupon.terms.applies_to_plan_ids {
        for id in ids {
            if plans::get(deps, tenant, id).await.is_err() {
                return Err(invalid(
                    "appliesToPlanIds",
                    format!("No such plan: '{id}' (appliesToPlanIds)"),
                )
                .into());
            }
        }
    }
    let claim = CodeClaim {
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        code: coupon.code.to_uppercase(),
        coupon_id: Some(coupon.id.clone()),
        promotion_code_id: None,
    };
    let event = Event::new(
        EventType::CouponCreated,
        tenant,
        CouponView::json(&coupon),
        now,
    );
    let mut also = vec![claim.put_new()?];
    let claim_at = if fence.is_some() { 2 } else { 1 };
    also.extend(event.put_ops()?);
    match Fence::put_once_with(
        fence,
        &*deps.store,
        coupon.put_new()?,
        coupon.id.as_str(),
        also,
    )
    .await
    {
        Ok(None) => Ok(coupon),
        Ok(Some(first)) => get_coupon(deps, tenant, &CouponId::stored(first)).await,
        Err(e) if failed_at(&e, claim_at) => Err(CouponError::CouponCodeTaken(coupon.code)),
        Err(e) => Err(e.into()),
    }
}

fn no_coupon(id: &impl std::fmt::Display) -> CouponError {
    CouponError::Billing(BillingError::NotFound {
        what: "coupon",
        named: id.to_string(),
    })
}

fn no_promotion_code(id: &impl std::fmt::Display) -> CouponError {
    CouponError::Billing(BillingError::NotFound {
        what: "promotion code",
        named: id.to_string(),
    })
}

/// The tenant's coupon `id`.
pub async fn get_coupon(
    deps: &Deps,
    tenant: &Tenant,
    id: &CouponId,
) -> Result<Coupon, CouponError> {
    crate::domain::record::get(&*deps.store, &Coupon::key(tenant, id))
        .await?
        .ok_or_else(|| no_coupon(id))
}

/// A page of coupons, newest first, and the total (of those with `active`
/// as asked, when asked).
pub async fn list_coupons(
    deps: &Deps,
    tenant: &Tenant,
    page: PageRequest,
    active: Option<bool>,
) -> Result<(Vec<Coupon>, u64), CouponError> {
    let mut query = Query::partition(Coupon::partition(tenant)).backward();
    if let Some(a) = active {
        query = query.filter(Coupon::ACTIVE.eq(&a));
    }
    let items = crate::store::query_window(&*deps.store, &query, page.offset(), page.limit).await?;
    let found = items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<Coupon>, _>>()?;
    let total = deps.store.count(&query).await?;
    Ok((found, total))
}

/// Deactivates the coupon (soft: it stays, listed as inactive); answers
/// it. The first deactivation writes `coupon.deactivated`; another is a
/// no-op. Its redemptions so far keep their discounts, but a `forever`
/// discount ends with its coupon (the guide: "until the coupon is
/// deactivated").
pub async fn deactivate_coupon(
    deps: &Deps,
    tenant: &Tenant,
    id: &CouponId,
) -> Result<Coupon, CouponError> {
    let current = get_coupon(deps, tenant, id).await?;
    if !current.active {
        return Ok(current);
    }
    let now = deps.clock.now();
    let mut changed = current.clone();
    changed.active = false;
    changed.updated_at = now;
    let update = Changes::<Coupon>::new()
        .set(Coupon::ACTIVE, &false)
        .set(Coupon::UPDATED_AT, &now);
    let event = Event::new(
        EventType::CouponDeactivated,
        tenant,
        CouponView::json(&changed),
        now,
    );
    let res = crate::store::update_with(
        &*deps.store,
        &Coupon::key(tenant, id),
        update.into(),
        Some(Coupon::ACTIVE.eq(&true)),
        event.put_ops()?,
    )
    .await;
    match res {
        Ok(item) => Ok(from_item(item)?),
        // Deactivated meanwhile: as it is now.
        Err(e) if e.is_condition_failure() => get_coupon(deps, tenant, id).await,
        Err(e) => Err(e.into()),
    }
}

/// The promotion code a create makes for `coupon` (checked; not stored).
pub fn new_promotion_code(
    tenant: &Tenant,
    coupon: &Coupon,
    body: CreatePromotionCode,
    now: Timestamp,
) -> Result<PromotionCode, BillingError> {
    let code = code("code", &body.code)?.to_uppercase();
    let max_redemptions = body
        .max_redemptions
        .map(|m| positive_count("maxRedemptions", m, i64::from(u32::MAX)))
        .transpose()?;
    let expires_at = body
        .expires_at
        .map(|t| future("expiresAt", t, now))
        .transpose()?;
    let minimum_amount = match body.minimum_amount {
        None => None,
        Some(m) if (1..=MAX_AMOUNT_PAISA).contains(&m) => Some(m),
        Some(m) => {
            return Err(invalid(
                "minimumAmount",
                format!("minimumAmount must be from 1 to {MAX_AMOUNT_PAISA} paisa, got {m}"),
            ));
        }
    };
    let customer_ids = body
        .customer_ids
        .as_deref()
        .map(|ids| id_list("customerIds", ids, CustomerId::parse, "customer"))
        .transpose()?;
    Ok(PromotionCode {
        id: PromotionCodeId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        coupon_id: coupon.id.clone(),
        code,
        max_redemptions,
        redeemed_count: 0,
        expires_at,
        first_time_transaction: body.first_time_transaction.unwrap_or(false),
        minimum_amount,
        customer_ids,
        active: true,
        metadata: metadata(body.metadata.unwrap_or_default())?,
        created_at: now,
        updated_at: now,
    })
}

/// Creates a promotion code for an active coupon of the tenant, with its
/// code's claim and `promotion_code.created`, in one transaction.
pub async fn create_promotion_code(
    deps: &Deps,
    tenant: &Tenant,
    body: CreatePromotionCode,
    fence: Option<&Fence>,
) -> Result<PromotionCode, CouponError> {
    let now = deps.clock.now();
    let coupon_id = CouponId::parse(body.coupon_id.trim()).ok_or_else(|| {
        invalid(
            "couponId",
            format!(
                "couponId must be a coupon id, cpn_…, got {:?}",
                body.coupon_id
            ),
        )
    })?;
    let coupon = match get_coupon(deps, tenant, &coupon_id).await {
        Ok(c) => c,
        Err(CouponError::Billing(BillingError::NotFound { .. })) => {
            return Err(invalid("couponId", format!("No such coupon: '{coupon_id}'")).into());
        }
        Err(e) => return Err(e),
    };
    if !coupon.active {
        return Err(unusable("couponId", Unusable::CouponInactive));
    }
    let promo = new_promotion_code(tenant, &coupon, body, now)?;
    if let Some(ids) = &promo.customer_ids {
        for id in ids {
            if super::customers::get(deps, tenant, id).await.is_err() {
                return Err(invalid(
                    "customerIds",
                    format!("No such customer: '{id}' (customerIds)"),
                )
                .into());
            }
        }
    }
    let claim = CodeClaim {
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        code: promo.code.clone(),
        coupon_id: None,
        promotion_code_id: Some(promo.id.clone()),
    };
    let event = Event::new(
        EventType::PromotionCodeCreated,
        tenant,
        PromotionCodeView::json(&promo),
        now,
    );
    let mut also = vec![claim.put_new()?];
    let claim_at = if fence.is_some() { 2 } else { 1 };
    also.extend(event.put_ops()?);
    match Fence::put_once_with(
        fence,
        &*deps.store,
        promo.put_new()?,
        promo.id.as_str(),
        also,
    )
    .await
    {
        Ok(None) => Ok(promo),
        Ok(Some(first)) => get_promotion_code(deps, tenant, &PromotionCodeId::stored(first)).await,
        Err(e) if failed_at(&e, claim_at) => Err(CouponError::PromotionCodeTaken(promo.code)),
        Err(e) => Err(e.into()),
    }
}

/// The tenant's promotion code `id`.
pub async fn get_promotion_code(
    deps: &Deps,
    tenant: &Tenant,
    id: &PromotionCodeId,
) -> Result<PromotionCode, CouponError> {
    crate::domain::record::get(&*deps.store, &PromotionCode::key(tenant, id))
        .await?
        .ok_or_else(|| no_promotion_code(id))
}

/// The tenant's promotion code whose code is `raw` (any case), if any.
pub async fn find_promotion_code(
    deps: &Deps,
    tenant: &Tenant,
    raw: &str,
) -> Result<Option<PromotionCode>, CouponError> {
    let upper = raw.trim().to_uppercase();
    if upper.is_empty() || upper.chars().count() > MAX_CODE {
        return Ok(None);
    }
    let claim: Option<CodeClaim> =
        crate::domain::record::get(&*deps.store, &CodeClaim::promotion_key(tenant, &upper)).await?;
    let Some(id) = claim.and_then(|c| c.promotion_code_id) else {
        return Ok(None);
    };
    Ok(crate::domain::record::get(&*deps.store, &PromotionCode::key(tenant, &id)).await?)
}

/// What a promotion code list keeps (each `None`: any).
#[derive(Clone, Debug, Default)]
pub struct PromotionFilter {
    pub coupon_id: Option<CouponId>,
    pub active: Option<bool>,
}

/// A page of promotion codes, newest first, and the total matching.
pub async fn list_promotion_codes(
    deps: &Deps,
    tenant: &Tenant,
    page: PageRequest,
    filter: &PromotionFilter,
) -> Result<(Vec<PromotionCode>, u64), CouponError> {
    let mut query = Query::partition(PromotionCode::partition(tenant)).backward();
    let mut all = Vec::new();
    if let Some(c) = &filter.coupon_id {
        all.push(PromotionCode::COUPON_ID.eq(c));
    }
    if let Some(a) = &filter.active {
        all.push(PromotionCode::ACTIVE.eq(a));
    }
    match all.len() {
        0 => {}
        1 => query = query.filter(all.remove(0)),
        _ => query = query.filter(Cond::And(all)),
    }
    let items = crate::store::query_window(&*deps.store, &query, page.offset(), page.limit).await?;
    let found = items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<PromotionCode>, _>>()?;
    let total = deps.store.count(&query).await?;
    Ok((found, total))
}

/// Changes a promotion code: `active: false` deactivates it (writing
/// `promotion_code.deactivated` the first time), `metadata` replaces its
/// metadata. `active: true` is refused: a deactivated code stays so.
pub async fn update_promotion_code(
    deps: &Deps,
    tenant: &Tenant,
    id: &PromotionCodeId,
    body: UpdatePromotionCode,
) -> Result<PromotionCode, CouponError> {
    if body.active == Some(true) {
        return Err(invalid(
            "active",
            "a promotion code can only be deactivated (active: false); create a new code instead",
        )
        .into());
    }
    let metadata = body.metadata.map(metadata).transpose()?;
    let current = get_promotion_code(deps, tenant, id).await?;
    let now = deps.clock.now();
    let deactivating = body.active == Some(false) && current.active;
    if !deactivating && metadata.is_none() {
        return Ok(current);
    }
    let mut update = Changes::<PromotionCode>::new().set(PromotionCode::UPDATED_AT, &now);
    let mut changed = current.clone();
    changed.updated_at = now;
    if deactivating {
        update = update.set(PromotionCode::ACTIVE, &false);
        changed.active = false;
    }
    if let Some(m) = &metadata {
        update = update.set(PromotionCode::METADATA, m);
        changed.metadata = m.clone();
    }
    let mut also = Vec::new();
    let cond = if deactivating {
        let event = Event::new(
            EventType::PromotionCodeDeactivated,
            tenant,
            PromotionCodeView::json(&changed),
            now,
        );
        also.extend(event.put_ops()?);
        PromotionCode::ACTIVE.eq(&true)
    } else {
        Cond::Exists
    };
    let key = PromotionCode::key(tenant, id);
    match crate::store::update_with(&*deps.store, &key, update.into(), Some(cond), also).await {
        Ok(item) => Ok(from_item(item)?),
        // Deactivated meanwhile: as it is now.
        Err(e) if e.is_condition_failure() => get_promotion_code(deps, tenant, id).await,
        Err(e) => Err(e.into()),
    }
}

/// Whether the customer has paid any billing invoice (a positive amount).
pub async fn has_paid(
    deps: &Deps,
    tenant: &Tenant,
    customer: &CustomerId,
) -> Result<bool, StoreError> {
    let query = Query::partition(BillingInvoice::list_partition(tenant))
        .on(Index::Gsi1)
        .filter(Cond::And(vec![
            BillingInvoice::CUSTOMER_ID.eq(customer),
            BillingInvoice::AMOUNT_PAID.gt(&0i64),
        ]));
    Ok(deps.store.count(&query).await? > 0)
}

/// Who and what a redemption is for: the checks of a promotion code's own
/// limits.
pub struct Redeemer<'a> {
    pub customer: Option<&'a CustomerId>,
    pub plan: Option<&'a PlanId>,
    /// The amount the minimum is checked against.
    pub amount: Option<i64>,
}

/// Why `coupon` (through `promo`, if any) cannot be redeemed by `who` at
/// `now`, if it cannot: the coupon's state, the code's own limits, the
/// plan, the customer, the minimum and the first-time rule.
pub async fn check(
    deps: &Deps,
    coupon: &Coupon,
    promo: Option<&PromotionCode>,
    who: &Redeemer<'_>,
    now: Timestamp,
) -> Result<Option<Unusable>, StoreError> {
    if let Some(p) = promo
        && let Some(why) = p.unusable(now)
    {
        return Ok(Some(why));
    }
    if let Some(why) = coupon.unusable(now) {
        return Ok(Some(why));
    }
    if let Some(plan) = who.plan
        && !coupon.terms.applies_to(plan)
    {
        return Ok(Some(Unusable::OtherPlan));
    }
    let Some(p) = promo else {
        return Ok(None);
    };
    if let Some(ids) = &p.customer_ids {
        match who.customer {
            None => return Ok(Some(Unusable::NeedsCustomer)),
            Some(c) if !ids.contains(c) => return Ok(Some(Unusable::OtherCustomer)),
            Some(_) => {}
        }
    }
    if let Some(minimum) = p.minimum_amount {
        match who.amount {
            None => return Ok(Some(Unusable::NeedsAmount)),
            Some(a) if a < minimum => return Ok(Some(Unusable::BelowMinimum { minimum })),
            Some(_) => {}
        }
    }
    if p.first_time_transaction {
        match who.customer {
            None => return Ok(Some(Unusable::NeedsCustomer)),
            Some(c) => {
                if has_paid(deps, &p.tenant(), c).await? {
                    return Ok(Some(Unusable::NotFirstTime));
                }
            }
        }
    }
    Ok(None)
}

/// Whether `code` applies for the customer, plan and amount sent, and the
/// discount it would give. Reads only.
pub async fn validate(
    deps: &Deps,
    tenant: &Tenant,
    body: ValidatePromotionCode,
) -> Result<Validation, CouponError> {
    let now = deps.clock.now();
    if body.code.trim().is_empty() {
        return Err(invalid("code", "code must not be empty").into());
    }
    let customer = body
        .customer_id
        .as_deref()
        .map(|raw| {
            CustomerId::parse(raw.trim())
                .ok_or_else(|| invalid("customerId", "customerId must be a customer id, cus_…"))
        })
        .transpose()?;
    let plan_id = body
        .plan_id
        .as_deref()
        .map(|raw| {
            PlanId::parse(raw.trim())
                .ok_or_else(|| invalid("planId", "planId must be a plan id, bp_…"))
        })
        .transpose()?;
    if let Some(a) = body.amount
        && !(0..=MAX_AMOUNT_PAISA).contains(&a)
    {
        return Err(invalid(
            "amount",
            format!("amount must be from 0 to {MAX_AMOUNT_PAISA} paisa, got {a}"),
        )
        .into());
    }
    let plan = match &plan_id {
        Some(id) => match plans::get(deps, tenant, id).await {
            Ok(p) => Some(p),
            Err(BillingError::NotFound { .. }) => {
                return Err(invalid("planId", format!("No such plan: '{id}'")).into());
            }
            Err(e) => return Err(e.into()),
        },
        None => None,
    };
    if let Some(c) = &customer
        && let Err(e) = super::customers::get(deps, tenant, c).await
    {
        return Err(match e {
            BillingError::NotFound { .. } => {
                invalid("customerId", format!("No such customer: '{c}'")).into()
            }
            other => other.into(),
        });
    }
    let not_valid = |why: Unusable| Validation {
        valid: false,
        coupon: None,
        promotion_code: None,
        discount_preview: None,
        reason: Some(why.message()),
        reason_code: Some(why.code().to_owned()),
    };
    let Some(promo) = find_promotion_code(deps, tenant, &body.code).await? else {
        return Ok(not_valid(Unusable::NoSuchCode));
    };
    let coupon = match get_coupon(deps, tenant, &promo.coupon_id).await {
        Ok(c) => c,
        Err(CouponError::Billing(BillingError::NotFound { .. })) => {
            return Ok(not_valid(Unusable::NoSuchCode));
        }
        Err(e) => return Err(e),
    };
    let amount = body.amount.or(plan.as_ref().map(|p| p.amount));
    let who = Redeemer {
        customer: customer.as_ref(),
        plan: plan_id.as_ref(),
        amount,
    };
    if let Some(why) = check(deps, &coupon, Some(&promo), &who, now).await? {
        return Ok(not_valid(why));
    }
    let discount = amount.map(|a| coupon.terms.discount_on(a));
    Ok(Validation {
        valid: true,
        coupon: Some(CouponView::of(&coupon)),
        promotion_code: Some(PromotionCodeView::of(&promo)),
        discount_preview: Some(DiscountPreview {
            amount,
            discount,
            total: amount.zip(discount).map(|(a, d)| a - d),
            duration: coupon.terms.duration,
        }),
        reason: None,
        reason_code: None,
    })
}

#[cfg(test)]
mod tests;
