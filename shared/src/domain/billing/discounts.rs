//! A subscription's discount (issue 40 item 1): `POST
//! /v1/billing/subscriptions/{id}/apply-coupon` redeems a coupon, directly
//! or through a promotion code, and `DELETE …/discount` removes it.
//!
//! One record per subscription, beside it (`SUB#<id>` / `DISCOUNT`): the
//! coupon's terms as they were when redeemed, the cycles left, a status and
//! a version. Applying replaces it (from the next invoice): the coupon's
//! and the code's redemption counters are raised, conditioned on being
//! below their caps, in ONE transaction with the record's write
//! (conditioned on the version read) and `subscription.updated`; so racing
//! applies never pass a cap, and exactly one of them takes a last
//! redemption.
//!
//! Issuing an invoice reads the active discount ([`for_invoice`]) and, in
//! the issuing transaction, consumes one cycle ([`Discount::consume_ops`]):
//! `once` ends it, `repeating` counts down and ends at 0, `forever` stays;
//! every one of those ops is conditioned on the version read, so a discount
//! applied or removed meanwhile makes the issue retry and read it again.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::adjust::Hook;
use super::compose::{DiscountTerms, DiscountValue};
use super::coupons::{
    self, Coupon, CouponDuration, CouponError, CouponTerms, DiscountType, PromotionCode, Redeemer,
    Unusable,
};
use super::customers::{BillingError, invalid};
use super::lifecycle::{self, LifecycleError, SubscriptionView};
use super::subscription::{self, Subscription};
use crate::Deps;
use crate::domain::outbox::{Event, EventType};
use crate::domain::record::{Changes, Record};
use crate::domain::{Mode, Tenant};
use crate::fields::wire::or_null;
use crate::ids::{CouponId, ProjectId, PromotionCodeId, SubscriptionId};
use crate::keys;
use crate::refusal::{Kind, Refusal};
use crate::store::fence::Fence;
use crate::store::{Cond, Key, StoreError, TxOp};
use crate::time::Timestamp;

/// Tries of an apply or a remove that lost a race (the counters are hot
/// when a code is raced for).
const TRIES: usize = 16;

/// Why an apply-coupon or a discount removal is refused.
#[derive(Debug, thiserror::Error)]
pub enum DiscountError {
    #[error(transparent)]
    Coupon(#[from] CouponError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("subscription {id} has ended ({status}): it takes no discount")]
    Ended {
        id: SubscriptionId,
        status: &'static str,
    },
    #[error("subscription {0} has no active discount")]
    NoDiscount(SubscriptionId),
    #[error("the discount changed too often while being written; retry")]
    Busy,
}

impl From<StoreError> for DiscountError {
    fn from(e: StoreError) -> Self {
        DiscountError::Coupon(e.into())
    }
}

impl From<BillingError> for DiscountError {
    fn from(e: BillingError) -> Self {
        DiscountError::Coupon(e.into())
    }
}

impl From<DiscountError> for Refusal {
    fn from(err: DiscountError) -> Self {
        match err {
            DiscountError::Coupon(e) => e.into(),
            DiscountError::Lifecycle(e) => e.into(),
            e @ DiscountError::Ended { .. } => {
                Refusal::conflict("subscription_state_conflict", e.to_string())
            }
            e @ DiscountError::NoDiscount(_) => {
                Refusal::new(Kind::NotFound, "not_found", e.to_string())
            }
            e @ DiscountError::Busy => Refusal::unavailable(&e),
        }
    }
}

/// Where a discount is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DiscountStatus {
    /// Applies to the next invoice.
    Active,
    /// Its cycles are used (or its `forever` coupon was deactivated).
    Ended,
    /// Removed by the merchant, or replaced by another.
    Removed,
}

/// A subscription's discount (stored kind "subscription discount").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Discount {
    pub subscription_id: SubscriptionId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub coupon_id: CouponId,
    pub coupon_code: String,
    /// The coupon's name: the invoice line's description.
    pub name: String,
    pub promotion_code_id: Option<PromotionCodeId>,
    pub promotion_code: Option<String>,
    /// The coupon's terms when it was redeemed.
    pub terms: CouponTerms,
    /// Invoices it still discounts: `None` for `forever`.
    pub cycles_left: Option<u32>,
    pub status: DiscountStatus,
    pub version: i64,
    pub applied_at: Timestamp,
    pub ended_at: Option<Timestamp>,
    pub updated_at: Timestamp,
}

crate::attrs! { Discount {
    SUBSCRIPTION_ID: SubscriptionId = subscription_id,
    CYCLES_LEFT: Option<u32> = cycles_left,
    STATUS: DiscountStatus = status,
    VERSION: i64 = version,
    ENDED_AT: Option<Timestamp> = ended_at,
    UPDATED_AT: Timestamp = updated_at,
} }

impl Discount {
    pub fn key(subscription: &SubscriptionId) -> Key {
        keys::subscription_discount(subscription.as_str())
    }

    /// The discount `coupon` (through `promo`) gives `sub` from `now`,
    /// replacing `current` (its version follows on).
    pub fn new(
        sub: &Subscription,
        coupon: &Coupon,
        promo: Option<&PromotionCode>,
        current: Option<&Discount>,
        now: Timestamp,
    ) -> Discount {
        let cycles_left = match coupon.terms.duration {
            CouponDuration::Once => Some(1),
            CouponDuration::Repeating => Some(coupon.terms.duration_in_cycles.unwrap_or(1)),
            CouponDuration::Forever => None,
        };
        Discount {
            subscription_id: sub.id.clone(),
            project_id: sub.project_id.clone(),
            mode: sub.mode,
            coupon_id: coupon.id.clone(),
            coupon_code: coupon.code.clone(),
            name: coupon.name.clone(),
            promotion_code_id: promo.map(|p| p.id.clone()),
            promotion_code: promo.map(|p| p.code.clone()),
            terms: coupon.terms.clone(),
            cycles_left,
            status: DiscountStatus::Active,
            version: current.map_or(1, |d| d.version + 1),
            applied_at: now,
            ended_at: None,
            updated_at: now,
        }
    }

    /// The discount after one invoice used it (pure): `once` ended,
    /// `repeating` one cycle fewer (ended at 0), `forever` unchanged.
    pub fn consumed(&self, now: Timestamp) -> Discount {
        let mut d = self.clone();
        if let Some(left) = self.cycles_left {
            let left = left.saturating_sub(1);
            d.cycles_left = Some(left);
            if left == 0 {
                d.status = DiscountStatus::Ended;
                d.ended_at = Some(now);
            }
            d.version += 1;
            d.updated_at = now;
        }
        d
    }

    /// The ops that consume one cycle in an issuing transaction, each
    /// conditioned on the version read (`forever`: a check of it only).
    pub fn consume_ops(&self, now: Timestamp) -> Vec<TxOp> {
        let key = Discount::key(&self.subscription_id);
        let unchanged = Discount::VERSION.eq(&self.version);
        if self.cycles_left.is_none() {
            return vec![TxOp::Check {
                key,
                cond: unchanged,
            }];
        }
        let after = self.consumed(now);
        let mut c = Changes::<Discount>::new()
            .set(Discount::CYCLES_LEFT, &after.cycles_left)
            .set(Discount::STATUS, &after.status)
            .set(Discount::VERSION, &after.version)
            .set(Discount::UPDATED_AT, &now);
        if let Some(at) = after.ended_at {
            c = c.set_some(Discount::ENDED_AT, &at);
        }
        vec![TxOp::Update {
            key,
            update: c.into(),
            cond: Some(unchanged),
        }]
    }

    /// The op that ends it (a `forever` discount whose coupon was
    /// deactivated), conditioned on the version read.
    pub fn end_op(&self, now: Timestamp) -> TxOp {
        let c = Changes::<Discount>::new()
            .set(Discount::STATUS, &DiscountStatus::Ended)
            .set(Discount::VERSION, &(self.version + 1))
            .set(Discount::UPDATED_AT, &now)
            .set_some(Discount::ENDED_AT, &now);
        TxOp::Update {
            key: Discount::key(&self.subscription_id),
            update: c.into(),
            cond: Some(Discount::VERSION.eq(&self.version)),
        }
    }
}

impl Record for Discount {
    fn item_key(&self) -> Key {
        Discount::key(&self.subscription_id)
    }
}

/// The discount as the API answers it (in the subscription's answer).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingSubscriptionDiscount)]
pub struct DiscountView {
    pub coupon_id: String,
    pub coupon_code: String,
    pub name: String,
    pub promotion_code_id: Option<String>,
    pub promotion_code: Option<String>,
    pub discount_type: DiscountType,
    pub percent_off: Option<u8>,
    /// Paisa.
    pub amount_off: Option<i64>,
    pub duration: CouponDuration,
    pub duration_in_cycles: Option<u32>,
    /// Invoices it still discounts (`null`: forever).
    pub cycles_remaining: Option<u32>,
    pub status: DiscountStatus,
    pub applied_at: Timestamp,
    pub ended_at: Option<Timestamp>,
}

impl DiscountView {
    pub fn of(d: &Discount) -> Self {
        DiscountView {
            coupon_id: d.coupon_id.to_string(),
            coupon_code: d.coupon_code.clone(),
            name: d.name.clone(),
            promotion_code_id: d.promotion_code_id.as_ref().map(ToString::to_string),
            promotion_code: d.promotion_code.clone(),
            discount_type: d.terms.discount_type,
            percent_off: d.terms.percent_off,
            amount_off: d.terms.amount_off,
            duration: d.terms.duration,
            duration_in_cycles: d.terms.duration_in_cycles,
            cycles_remaining: d.cycles_left,
            status: d.status,
            applied_at: d.applied_at,
            ended_at: d.ended_at,
        }
    }
}

/// apply-coupon's and remove-discount's answer: the subscription as its
/// GET answers it, with its `discount` (null when none is active).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = BillingSubscriptionWithDiscount)]
pub struct Discounted {
    #[serde(flatten)]
    pub subscription: SubscriptionView,
    pub discount: Option<DiscountView>,
}

impl Discounted {
    pub fn of(sub: &Subscription, discount: Option<&Discount>) -> Self {
        Discounted {
            subscription: SubscriptionView::of(sub),
            discount: discount
                .filter(|d| d.status == DiscountStatus::Active)
                .map(DiscountView::of),
        }
    }

    pub fn json(sub: &Subscription, discount: Option<&Discount>) -> Value {
        serde_json::to_value(Discounted::of(sub, discount)).unwrap_or(Value::Null)
    }
}

/// `POST /v1/billing/subscriptions/{id}/apply-coupon` (the SDK's
/// `ApplyCouponParams`): one of the two.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = ApplyBillingCoupon)]
pub struct ApplyCoupon {
    /// `cpn_…`: redeem the coupon directly.
    #[serde(default, deserialize_with = "or_null")]
    pub coupon_id: Option<String>,
    /// A promotion code (any case).
    #[serde(default, deserialize_with = "or_null")]
    pub promotion_code: Option<String>,
}

/// What an apply names.
enum Named {
    Coupon(CouponId),
    Code(String),
}

fn named(body: &ApplyCoupon) -> Result<Named, BillingError> {
    match (&body.coupon_id, &body.promotion_code) {
        (Some(_), Some(_)) => Err(invalid(
            "promotionCode",
            "send couponId or promotionCode, not both",
        )),
        (None, None) => Err(invalid("couponId", "couponId or promotionCode is required")),
        (Some(raw), None) => CouponId::parse(raw.trim())
            .map(Named::Coupon)
            .ok_or_else(|| {
                invalid(
                    "couponId",
                    format!("couponId must be a coupon id, cpn_…, got {raw:?}"),
                )
            }),
        (None, Some(raw)) if raw.trim().is_empty() => {
            Err(invalid("promotionCode", "promotionCode must not be empty"))
        }
        (None, Some(raw)) => Ok(Named::Code(raw.clone())),
    }
}

/// The subscription's discount record, whatever its status.
pub async fn get(deps: &Deps, id: &SubscriptionId) -> Result<Option<Discount>, StoreError> {
    crate::domain::record::get(&*deps.store, &Discount::key(id)).await
}

/// The subscription's active discount, if any.
pub async fn active(deps: &Deps, id: &SubscriptionId) -> Result<Option<Discount>, StoreError> {
    Ok(get(deps, id)
        .await?
        .filter(|d| d.status == DiscountStatus::Active))
}

/// The tenant's subscription `id` with its active discount.
pub async fn of_subscription(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
) -> Result<Discounted, DiscountError> {
    let sub = lifecycle::get(deps, tenant, id).await?;
    let d = active(deps, id).await?;
    Ok(Discounted::of(&sub, d.as_ref()))
}

fn no_coupon_named(field: &'static str, raw: &str) -> DiscountError {
    DiscountError::Lifecycle(LifecycleError::Missing {
        what: "coupon",
        field,
        named: raw.to_owned(),
    })
}

/// The coupon (and code) an apply names, as stored now.
async fn resolve(
    deps: &Deps,
    tenant: &Tenant,
    named: &Named,
) -> Result<(Coupon, Option<PromotionCode>, &'static str), DiscountError> {
    match named {
        Named::Coupon(id) => match coupons::get_coupon(deps, tenant, id).await {
            Ok(c) => Ok((c, None, "couponId")),
            Err(CouponError::Billing(BillingError::NotFound { .. })) => {
                Err(no_coupon_named("couponId", id.as_str()))
            }
            Err(e) => Err(e.into()),
        },
        Named::Code(raw) => {
            let field = "promotionCode";
            let Some(promo) = coupons::find_promotion_code(deps, tenant, raw).await? else {
                return Err(CouponError::Unusable {
                    field,
                    reason: Unusable::NoSuchCode,
                }
                .into());
            };
            match coupons::get_coupon(deps, tenant, &promo.coupon_id).await {
                Ok(c) => Ok((c, Some(promo), field)),
                Err(CouponError::Billing(BillingError::NotFound { .. })) => {
                    Err(CouponError::Unusable {
                        field,
                        reason: Unusable::NoSuchCode,
                    }
                    .into())
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// The redemption's counter raise of `coupon` (and `promo`): conditioned
/// on each being active and below its cap.
fn redemption_ops(coupon: &Coupon, promo: Option<&PromotionCode>, now: Timestamp) -> Vec<TxOp> {
    let mut ops = vec![TxOp::Update {
        key: Coupon::key(&coupon.tenant(), &coupon.id),
        update: Changes::<Coupon>::new()
            .add(Coupon::REDEEMED_COUNT, 1u32)
            .set(Coupon::UPDATED_AT, &now)
            .into(),
        cond: Some(coupon.redeemable()),
    }];
    if let Some(p) = promo {
        ops.push(TxOp::Update {
            key: PromotionCode::key(&p.tenant(), &p.id),
            update: Changes::<PromotionCode>::new()
                .add(PromotionCode::REDEEMED_COUNT, 1u32)
                .set(PromotionCode::UPDATED_AT, &now)
                .into(),
            cond: Some(p.redeemable()),
        });
    }
    ops
}

/// The condition of replacing `current` (none yet: nothing there).
fn replaces(current: Option<&Discount>) -> Cond {
    match current {
        None => Cond::NotExists,
        Some(d) => Discount::VERSION.eq(&d.version),
    }
}

/// Applies a coupon or promotion code to the tenant's subscription `id`:
/// checks it (active, not expired or exhausted, for this plan, customer and
/// amount), then in one transaction raises the counters (conditioned on
/// their caps), replaces the subscription's discount (conditioned on the
/// version read) and writes `subscription.updated`. A lost race is read
/// and decided again; a cap reached meanwhile is a 400 naming the field.
pub async fn apply(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    body: ApplyCoupon,
    fence: Option<&Fence>,
) -> Result<Discounted, DiscountError> {
    let named = named(&body)?;
    let now = lifecycle::time_for(deps, tenant, id, deps.clock.now()).await?;
    for attempt in 0..TRIES {
        let sub = lifecycle::get(deps, tenant, id).await?;
        if sub.status.is_ended() {
            return Err(DiscountError::Ended {
                id: id.clone(),
                status: sub.status.as_str(),
            });
        }
        let (coupon, promo, field) = resolve(deps, tenant, &named).await?;
        let amount = sub.terms.amount.saturating_mul(i64::from(sub.quantity));
        let who = Redeemer {
            customer: Some(&sub.customer_id),
            plan: Some(&sub.plan_id),
            amount: Some(amount),
        };
        if let Some(reason) = coupons::check(deps, &coupon, promo.as_ref(), &who, now).await? {
            return Err(CouponError::Unusable { field, reason }.into());
        }
        let current = get(deps, id).await?;
        let discount = Discount::new(&sub, &coupon, promo.as_ref(), current.as_ref(), now);
        let mut ops = redemption_ops(&coupon, promo.as_ref(), now);
        ops.push(TxOp::Put {
            item: discount.to_item()?,
            cond: Some(replaces(current.as_ref())),
        });
        let fence_at = ops.len();
        if let Some(f) = fence {
            ops.push(f.op(id.as_str()));
        }
        let event = Event::new(
            EventType::SubscriptionUpdated,
            tenant,
            Discounted::json(&sub, Some(&discount)),
            now,
        );
        ops.extend(event.put_ops()?);
        match deps.store.transact(ops).await {
            Ok(()) => return Ok(Discounted::of(&sub, Some(&discount))),
            Err(e) if fence.is_some() && Fence::tripped(&e, fence_at) => {
                // This request already applied it: answer as it is now.
                return of_subscription(deps, tenant, id).await;
            }
            Err(e) if e.is_condition_failure() || subscription::is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(DiscountError::Busy)
}

/// Removes the subscription's active discount (future invoices are not
/// discounted) and writes `subscription.updated`; none active: 404.
pub async fn remove(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
) -> Result<Discounted, DiscountError> {
    let now = lifecycle::time_for(deps, tenant, id, deps.clock.now()).await?;
    for attempt in 0..TRIES {
        let sub = lifecycle::get(deps, tenant, id).await?;
        let Some(current) = active(deps, id).await? else {
            return Err(DiscountError::NoDiscount(id.clone()));
        };
        let mut removed = current.clone();
        removed.status = DiscountStatus::Removed;
        removed.ended_at = Some(now);
        removed.version += 1;
        removed.updated_at = now;
        let update = Changes::<Discount>::new()
            .set(Discount::STATUS, &removed.status)
            .set_some(Discount::ENDED_AT, &now)
            .set(Discount::VERSION, &removed.version)
            .set(Discount::UPDATED_AT, &now);
        let event = Event::new(
            EventType::SubscriptionUpdated,
            tenant,
            Discounted::json(&sub, None),
            now,
        );
        let mut ops = vec![TxOp::Update {
            key: Discount::key(id),
            update: update.into(),
            cond: Some(Discount::VERSION.eq(&current.version)),
        }];
        ops.extend(event.put_ops()?);
        match deps.store.transact(ops).await {
            Ok(()) => return Ok(Discounted::of(&sub, None)),
            Err(e) if e.is_condition_failure() || subscription::is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(DiscountError::Busy)
}

/// What issuing an invoice for `sub` takes of its discount.
pub enum ForInvoice {
    /// No discount, nothing to write.
    None,
    /// The discount applies: its terms go on the invoice, its
    /// [`Discount::consume_ops`] into the issuing transaction.
    Applies(Discount),
    /// A discount that does not apply to this invoice (another plan now):
    /// the issue checks its version only, so an apply racing it retries.
    Skipped(Discount),
    /// A `forever` discount whose coupon was deactivated: it ends with
    /// this issue ([`Discount::end_op`]).
    Ends(Discount),
}

/// The subscription's discount as an invoice issued now would take it.
/// A coupon deactivated after its redemption leaves `once` and `repeating`
/// discounts as they are (redemptions remain valid); it ends a `forever`
/// one (the guide: "until the coupon is deactivated").
pub async fn for_invoice(deps: &Deps, sub: &Subscription) -> Result<ForInvoice, StoreError> {
    let Some(d) = active(deps, &sub.id).await? else {
        return Ok(ForInvoice::None);
    };
    if d.cycles_left.is_none() {
        let coupon: Option<Coupon> =
            crate::domain::record::get(&*deps.store, &Coupon::key(&sub.tenant(), &d.coupon_id))
                .await?;
        if coupon.is_none_or(|c| !c.active) {
            return Ok(ForInvoice::Ends(d));
        }
    }
    if !d.terms.applies_to(&sub.plan_id) {
        return Ok(ForInvoice::Skipped(d));
    }
    Ok(ForInvoice::Applies(d))
}

/// The discount an invoice of `sub` issued at `now` takes, and the hook
/// whose ops (conditioned on the discount's version) consume its cycle in
/// the issuing transaction (`adjust::gather`'s part of coupons).
pub async fn for_issue(
    deps: &Deps,
    sub: &Subscription,
    now: Timestamp,
) -> Result<(Option<DiscountTerms>, Option<Hook>), StoreError> {
    let unchanged = |d: &Discount| {
        vec![TxOp::Check {
            key: Discount::key(&d.subscription_id),
            cond: Discount::VERSION.eq(&d.version),
        }]
    };
    let hook: Hook = match for_invoice(deps, sub).await? {
        ForInvoice::None => return Ok((None, None)),
        ForInvoice::Applies(d) => {
            let terms = d.invoice_terms();
            let (consume, kept) = (d.consume_ops(now), unchanged(&d));
            // A cycle is spent only on an invoice it took something off
            // (a metered period with no usage leaves it for the next).
            let hook: Hook = Box::new(move |inv| {
                Ok(if inv.discount_total > 0 {
                    consume
                } else {
                    kept
                })
            });
            return Ok((Some(terms), Some(hook)));
        }
        ForInvoice::Skipped(d) => {
            let ops = unchanged(&d);
            Box::new(move |_| Ok(ops))
        }
        ForInvoice::Ends(d) => {
            let ops = vec![d.end_op(now)];
            Box::new(move |_| Ok(ops))
        }
    };
    Ok((None, Some(hook)))
}

impl Discount {
    /// What the invoice's composition takes of it.
    pub fn invoice_terms(&self) -> DiscountTerms {
        let value = match (
            self.terms.discount_type,
            self.terms.percent_off,
            self.terms.amount_off,
        ) {
            (DiscountType::Percent, Some(p), _) => DiscountValue::Percent(p),
            (_, _, Some(a)) => DiscountValue::Amount(a),
            // A percent coupon always has its percent; read as nothing off.
            _ => DiscountValue::Amount(0),
        };
        DiscountTerms {
            coupon_id: self.coupon_id.clone(),
            promotion_code_id: self.promotion_code_id.clone(),
            description: self.name.clone(),
            value,
        }
    }
}

#[cfg(test)]
mod tests;
