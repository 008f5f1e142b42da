//! The arithmetic of a billing invoice (issue 40): from its base lines
//! (the subscription's price, usage, one-off items, prorations) to what the
//! customer owes, in one pure function.
//!
//! The order is the guide's (and Stripe's) and never varies:
//! 1. `subtotal`: the sum of the base lines;
//! 2. the discount, on the subtotal: a percent rounded half up to the
//!    paisa, an amount capped at the subtotal (an invoice is never
//!    negative);
//! 3. VAT on the discounted amount (`taxable_amount`): `rate_bps` / 10,000,
//!    rounded half up to the paisa, as one-time invoices round it;
//! 4. `total` = taxable amount + VAT;
//! 5. customer credit against the total, at most the total;
//! 6. `amount_due` = total - credit applied.
//!
//! Amounts are paisa in `i64`, worked in `i128` and refused when a result
//! does not fit.

use serde::{Deserialize, Serialize};

use crate::ids::{CouponId, PromotionCodeId};

use super::invoice::{InvoiceLine, LineKind};

/// What a coupon takes off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum DiscountValue {
    /// 1 to 100.
    Percent(u8),
    /// Paisa, more than 0.
    Amount(i64),
}

/// The discount an invoice was issued with (its snapshot: a coupon
/// changed or deactivated later never rewrites it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscountTerms {
    pub coupon_id: CouponId,
    pub promotion_code_id: Option<PromotionCodeId>,
    /// What the discount line says (the coupon's name).
    pub description: String,
    pub value: DiscountValue,
}

/// The tax an invoice was issued with (its snapshot: the legal record of
/// what was charged, whatever the settings say later).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaxTerms {
    /// Basis points: 1300 is 13.00%.
    pub rate_bps: u32,
    /// "VAT" unless the merchant says otherwise.
    pub label: String,
    /// The seller's PAN/VAT number.
    pub registration_number: Option<String>,
}

impl TaxTerms {
    /// "VAT (13.00%)", as the tax line and the bill show it.
    pub fn line_label(&self) -> String {
        format!(
            "{} ({}.{:02}%)",
            self.label,
            self.rate_bps / 100,
            self.rate_bps % 100
        )
    }
}

/// An invoice's lines and totals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Composed {
    /// The base lines, then a `discount` line (negative) and a `tax` line
    /// when they are not zero.
    pub lines: Vec<InvoiceLine>,
    pub subtotal: i64,
    /// Positive: what the discount took off.
    pub discount_total: i64,
    pub taxable_amount: i64,
    pub tax_total: i64,
    pub total: i64,
    /// Positive: the customer's credit this invoice takes.
    pub credit_applied: i64,
    pub amount_due: i64,
}

/// A total that does not fit in paisa as `i64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the invoice's amounts overflow")]
pub struct Overflow;

/// `round_half_up(amount x num / den)` for `amount >= 0`.
fn share(amount: i64, num: i128, den: i128) -> Result<i64, Overflow> {
    let v = (i128::from(amount) * num + den / 2) / den;
    i64::try_from(v).map_err(|_| Overflow)
}

/// The discount `value` takes off `subtotal` (`>= 0`): at most the subtotal.
pub fn discount_of(value: DiscountValue, subtotal: i64) -> Result<i64, Overflow> {
    if subtotal <= 0 {
        return Ok(0);
    }
    let off = match value {
        DiscountValue::Percent(p) => share(subtotal, i128::from(p.min(100)), 100)?,
        DiscountValue::Amount(a) => a.max(0),
    };
    Ok(off.min(subtotal))
}

/// VAT on `taxable` (`>= 0`) at `rate_bps`, rounded half up to the paisa.
pub fn tax_of(taxable: i64, rate_bps: u32) -> Result<i64, Overflow> {
    if taxable <= 0 {
        return Ok(0);
    }
    share(taxable, i128::from(rate_bps), 10_000)
}

/// Composes an invoice from its `base` lines (period bounds of the discount
/// and tax lines are `period`'s), the discount and tax it is issued with,
/// and the customer's `credit_available` (`<= 0`: none).
pub fn compose(
    base: Vec<InvoiceLine>,
    period: (chrono::NaiveDate, chrono::NaiveDate),
    discount: Option<&DiscountTerms>,
    tax: Option<&TaxTerms>,
    credit_available: i64,
) -> Result<Composed, Overflow> {
    let mut subtotal: i64 = 0;
    for l in &base {
        subtotal = subtotal.checked_add(l.amount).ok_or(Overflow)?;
    }
    let mut lines = base;
    // Prorations may net below zero: nothing is billed then, and nothing
    // is discounted or taxed (the caller turns a net credit into credit).
    let positive = subtotal.max(0);
    let discount_total = match discount {
        Some(d) => discount_of(d.value, positive)?,
        None => 0,
    };
    let line = |kind, description: String, amount| InvoiceLine {
        kind,
        description,
        quantity: 1,
        amount,
        period_start: period.0,
        period_end: period.1,
    };
    if let (Some(d), true) = (discount, discount_total > 0) {
        lines.push(line(
            LineKind::Discount,
            d.description.clone(),
            -discount_total,
        ));
    }
    let taxable_amount = positive - discount_total;
    let tax_total = match tax {
        Some(t) => tax_of(taxable_amount, t.rate_bps)?,
        None => 0,
    };
    if let (Some(t), true) = (tax, tax_total > 0) {
        lines.push(line(LineKind::Tax, t.line_label(), tax_total));
    }
    let total = taxable_amount.checked_add(tax_total).ok_or(Overflow)?;
    let credit_applied = credit_available.clamp(0, total);
    Ok(Composed {
        lines,
        subtotal,
        discount_total,
        taxable_amount,
        tax_total,
        total,
        credit_applied,
        amount_due: total - credit_applied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 12, d).unwrap()
    }

    fn base(amounts: &[i64]) -> Vec<InvoiceLine> {
        amounts
            .iter()
            .map(|&amount| InvoiceLine {
                kind: LineKind::Subscription,
                description: "Pro".into(),
                quantity: 1,
                amount,
                period_start: day(1),
                period_end: day(31),
            })
            .collect()
    }

    fn vat() -> TaxTerms {
        TaxTerms {
            rate_bps: 1300,
            label: "VAT".into(),
            registration_number: Some("301234567".into()),
        }
    }

    fn coupon(value: DiscountValue) -> DiscountTerms {
        DiscountTerms {
            coupon_id: CouponId::new(),
            promotion_code_id: None,
            description: "Launch".into(),
            value,
        }
    }

    fn compose_(
        amounts: &[i64],
        d: Option<DiscountValue>,
        t: Option<TaxTerms>,
        credit: i64,
    ) -> Composed {
        compose(
            base(amounts),
            (day(1), day(31)),
            d.map(coupon).as_ref(),
            t.as_ref(),
            credit,
        )
        .unwrap()
    }

    #[test]
    fn the_guides_example_discount_before_tax() {
        // NPR 500 plan, NPR 50 off, 13% VAT: 58.50 VAT, 508.50 due.
        let c = compose_(
            &[50_000],
            Some(DiscountValue::Amount(5_000)),
            Some(vat()),
            0,
        );
        assert_eq!(
            (c.subtotal, c.discount_total, c.taxable_amount, c.tax_total),
            (50_000, 5_000, 45_000, 5_850)
        );
        assert_eq!((c.total, c.amount_due), (50_850, 50_850));
        let kinds: Vec<_> = c.lines.iter().map(|l| l.kind).collect();
        assert_eq!(
            kinds,
            [LineKind::Subscription, LineKind::Discount, LineKind::Tax]
        );
        assert_eq!(c.lines[1].amount, -5_000);
        assert_eq!(c.lines[2].description, "VAT (13.00%)");
        assert_eq!(c.lines.iter().map(|l| l.amount).sum::<i64>(), c.total);
    }

    #[test]
    fn percent_and_vat_round_half_up_to_the_paisa() {
        // 33% of 1,001 paisa is 330.33: 330. 15% of 1,010 is 151.5: 152.
        assert_eq!(discount_of(DiscountValue::Percent(33), 1_001), Ok(330));
        assert_eq!(discount_of(DiscountValue::Percent(15), 1_010), Ok(152));
        // 13% of 4,550 is 591.5: 592; of 4,549 is 591.37: 591.
        assert_eq!(tax_of(4_550, 1300), Ok(592));
        assert_eq!(tax_of(4_549, 1300), Ok(591));
        assert_eq!(tax_of(0, 1300), Ok(0));
        assert_eq!(tax_of(1_000, 0), Ok(0));
    }

    #[test]
    fn a_discount_never_makes_an_invoice_negative() {
        let c = compose_(
            &[10_000],
            Some(DiscountValue::Amount(25_000)),
            Some(vat()),
            0,
        );
        assert_eq!(
            (c.discount_total, c.taxable_amount, c.tax_total, c.total),
            (10_000, 0, 0, 0)
        );
        assert_eq!(c.amount_due, 0);
        // A 100% coupon too, and no zero tax line.
        let c = compose_(&[10_000], Some(DiscountValue::Percent(100)), Some(vat()), 0);
        assert_eq!(c.total, 0);
        assert!(c.lines.iter().all(|l| l.kind != LineKind::Tax));
    }

    #[test]
    fn credit_comes_last_against_the_total_and_at_most_it() {
        let c = compose_(&[10_000], None, Some(vat()), 4_000);
        assert_eq!(
            (c.total, c.credit_applied, c.amount_due),
            (11_300, 4_000, 7_300)
        );
        let c = compose_(&[10_000], None, Some(vat()), 50_000);
        assert_eq!((c.credit_applied, c.amount_due), (11_300, 0));
        let c = compose_(&[10_000], None, None, -5);
        assert_eq!((c.credit_applied, c.amount_due), (0, 10_000));
        // Credit does not lower the VAT: it is a payment, not a discount.
        assert_eq!(
            compose_(&[10_000], None, Some(vat()), 4_000).tax_total,
            1_300
        );
    }

    #[test]
    fn a_net_credit_of_prorations_bills_nothing_and_takes_no_discount() {
        let c = compose_(
            &[-6_000, 2_000],
            Some(DiscountValue::Percent(50)),
            Some(vat()),
            1_000,
        );
        assert_eq!(c.subtotal, -4_000);
        assert_eq!(
            (
                c.discount_total,
                c.tax_total,
                c.total,
                c.credit_applied,
                c.amount_due
            ),
            (0, 0, 0, 0, 0)
        );
    }

    #[test]
    fn overflow_is_refused_not_wrapped() {
        assert_eq!(
            compose(base(&[i64::MAX, 1]), (day(1), day(31)), None, None, 0),
            Err(Overflow)
        );
        assert!(compose(base(&[i64::MAX]), (day(1), day(31)), None, Some(&vat()), 0).is_err());
    }

    #[test]
    fn every_combination_adds_up() {
        // Lines sum to the total; total - credit is due; nothing negative.
        for amount in [0, 1, 99, 10_000, 99_999] {
            for d in [
                None,
                Some(DiscountValue::Percent(1)),
                Some(DiscountValue::Percent(37)),
                Some(DiscountValue::Percent(100)),
                Some(DiscountValue::Amount(1)),
                Some(DiscountValue::Amount(50_000)),
            ] {
                for t in [None, Some(vat())] {
                    for credit in [0, 7, 200_000] {
                        let c = compose_(&[amount, 150], d, t.clone(), credit);
                        assert_eq!(c.lines.iter().map(|l| l.amount).sum::<i64>(), c.total);
                        assert_eq!(c.total - c.credit_applied, c.amount_due);
                        assert!(c.amount_due >= 0 && c.discount_total >= 0);
                        assert!(c.discount_total <= c.subtotal.max(0));
                    }
                }
            }
        }
    }
}
