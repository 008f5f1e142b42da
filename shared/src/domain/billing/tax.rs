//! A tenant's billing settings (issue 40 part 2): VAT on billing invoices
//! (`GET/PATCH /v1/billing/settings/tax`: `enabled`, `rateBps`,
//! `registrationNumber`, `label`, as the SDK's `UpdateTaxSettingsParams`)
//! and our extension `overpaymentHandling` (`refund`, the default, or
//! `credit`: a payment for an invoice already paid becomes customer
//! credit instead of a refund).
//!
//! One record per project and mode at `PROJ#<p>#<mode>` / `BILLING#SETTINGS`,
//! written whole, conditioned on the version read; never written: the
//! defaults (tax off, 13% ready, label "VAT", overpayments refunded).
//!
//! An invoice snapshots the rate, the label and the registration number
//! when it is issued ([`TaxSettings::terms`]): a later change never
//! rewrites one issued before. Also the Nepali fiscal year an invoice
//! belongs to ([`fiscal_year`]).

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use crate::Deps;
use crate::domain::billing::calendar::bs_from_ad;
use crate::domain::billing::compose::TaxTerms;
use crate::domain::billing::customers::{BillingError, invalid};
use crate::domain::record::{self, Record};
use crate::domain::{Mode, Tenant};
use crate::fields::wire::{nullable, present};
use crate::ids::ProjectId;
use crate::store::{Cond, Key, StoreError, TxOp};
use crate::time::Timestamp;

/// The highest rate: 100.00% (above it is refused).
pub const MAX_RATE_BPS: u32 = 10_000;
/// Nepal's VAT, 13.00%: the rate the settings hold before any is set.
pub const NEPAL_VAT_BPS: u32 = 1_300;
pub const DEFAULT_LABEL: &str = "VAT";
pub const MAX_LABEL: usize = 30;
/// A PAN/VAT number in Nepal: 9 digits.
pub const PAN_DIGITS: usize = 9;

/// What an overpayment becomes (our extension).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OverpaymentHandling {
    /// Refunded as that provider's refunds work (the core's behaviour).
    #[default]
    Refund,
    /// Kept as the customer's credit (a ledger entry `overpayment`),
    /// applied to their next invoices.
    Credit,
}

/// The stored settings (stored kind "billing settings").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaxSettings {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub tax_enabled: bool,
    pub tax_rate_bps: u32,
    pub tax_registration_number: Option<String>,
    pub tax_label: String,
    #[serde(default)]
    pub overpayment_handling: OverpaymentHandling,
    /// 0 before the first write (never stored as 0).
    pub version: i64,
    pub updated_at: Option<Timestamp>,
}

crate::attrs! { TaxSettings {
    VERSION: i64 = version,
} }

impl TaxSettings {
    pub fn key(tenant: &Tenant) -> Key {
        Key::new(
            format!("PROJ#{}#{}", tenant.project, tenant.mode.as_str()),
            "BILLING#SETTINGS",
        )
    }

    /// What a tenant that never set anything has.
    pub fn defaults(tenant: &Tenant) -> TaxSettings {
        TaxSettings {
            project_id: tenant.project.clone(),
            mode: tenant.mode,
            tax_enabled: false,
            tax_rate_bps: NEPAL_VAT_BPS,
            tax_registration_number: None,
            tax_label: DEFAULT_LABEL.to_owned(),
            overpayment_handling: OverpaymentHandling::Refund,
            version: 0,
            updated_at: None,
        }
    }

    /// The rate, label and seller's number an invoice issued now
    /// snapshots; `None` when tax is off.
    pub fn terms(&self) -> Option<TaxTerms> {
        self.tax_enabled.then(|| TaxTerms {
            rate_bps: self.tax_rate_bps,
            label: self.tax_label.clone(),
            registration_number: self.tax_registration_number.clone(),
        })
    }
}

impl Record for TaxSettings {
    fn item_key(&self) -> Key {
        TaxSettings::key(&Tenant::new(self.project_id.clone(), self.mode))
    }
}

/// The settings as the API answers them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingTaxSettings)]
pub struct TaxSettingsView {
    pub enabled: bool,
    /// Basis points: 1300 = 13.00%.
    pub rate_bps: u32,
    /// The seller's PAN/VAT number (9 digits), printed on tax invoices.
    pub registration_number: Option<String>,
    /// `VAT` unless set: shown as `VAT (13.00%)`.
    pub label: String,
    /// Ours: what a payment for an invoice already paid becomes.
    pub overpayment_handling: OverpaymentHandling,
    pub livemode: bool,
    /// `null` until first changed.
    pub updated_at: Option<Timestamp>,
}

impl TaxSettingsView {
    pub fn of(s: &TaxSettings) -> Self {
        TaxSettingsView {
            enabled: s.tax_enabled,
            rate_bps: s.tax_rate_bps,
            registration_number: s.tax_registration_number.clone(),
            label: s.tax_label.clone(),
            overpayment_handling: s.overpayment_handling,
            livemode: s.mode.is_live(),
            updated_at: s.updated_at,
        }
    }
}

/// `PATCH /v1/billing/settings/tax`: only the keys sent change; `null`
/// clears `registrationNumber` and puts `label` back to `VAT`.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = UpdateBillingTaxSettings)]
pub struct UpdateTaxSettings {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub enabled: Option<bool>,
    /// 0 to 10000 (100.00%).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, value_type = Option<i64>, minimum = 0, maximum = 10000)]
    pub rate_bps: Option<i64>,
    /// 9 digits (spaces and hyphens between them are dropped).
    #[serde(default, deserialize_with = "nullable")]
    pub registration_number: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub label: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub overpayment_handling: Option<OverpaymentHandling>,
}

/// A rate in basis points, 0..=[`MAX_RATE_BPS`].
pub fn rate(raw: i64) -> Result<u32, BillingError> {
    u32::try_from(raw)
        .ok()
        .filter(|r| *r <= MAX_RATE_BPS)
        .ok_or_else(|| {
            invalid(
                "rateBps",
                format!(
                    "rateBps must be from 0 to {MAX_RATE_BPS} (basis points: 1300 is 13.00%); got {raw}"
                ),
            )
        })
}

/// A PAN/VAT number: 9 digits once spaces and hyphens are dropped.
pub fn registration_number(raw: &str) -> Result<String, BillingError> {
    let digits: String = raw.chars().filter(|c| !matches!(c, ' ' | '-')).collect();
    if digits.len() == PAN_DIGITS && digits.bytes().all(|b| b.is_ascii_digit()) {
        Ok(digits)
    } else {
        Err(invalid(
            "registrationNumber",
            format!("registrationNumber must be a PAN/VAT number: {PAN_DIGITS} digits, or null"),
        ))
    }
}

/// A label: trimmed, 1 to [`MAX_LABEL`] characters, no control characters.
pub fn label(raw: &str) -> Result<String, BillingError> {
    crate::domain::billing::customers::text("label", raw, MAX_LABEL)
}

/// `current` with the keys of `body` applied (checked).
pub fn apply(
    current: &TaxSettings,
    body: UpdateTaxSettings,
    now: Timestamp,
) -> Result<TaxSettings, BillingError> {
    let mut next = current.clone();
    if let Some(e) = body.enabled {
        next.tax_enabled = e;
    }
    if let Some(r) = body.rate_bps {
        next.tax_rate_bps = rate(r)?;
    }
    match body.registration_number {
        Some(Some(n)) => next.tax_registration_number = Some(registration_number(&n)?),
        Some(None) => next.tax_registration_number = None,
        None => {}
    }
    match body.label {
        Some(Some(l)) => next.tax_label = label(&l)?,
        Some(None) => next.tax_label = DEFAULT_LABEL.to_owned(),
        None => {}
    }
    if let Some(h) = body.overpayment_handling {
        next.overpayment_handling = h;
    }
    next.version = current.version + 1;
    next.updated_at = Some(now);
    Ok(next)
}

/// The tenant's settings; the defaults when never set.
pub async fn get(deps: &Deps, tenant: &Tenant) -> Result<TaxSettings, BillingError> {
    Ok(
        record::get::<TaxSettings>(&*deps.store, &TaxSettings::key(tenant))
            .await?
            .unwrap_or_else(|| TaxSettings::defaults(tenant)),
    )
}

/// The VAT an invoice of the tenant issued now carries (`gather`'s
/// part): `None` when tax is off.
pub async fn invoice_terms(deps: &Deps, tenant: &Tenant) -> Result<Option<TaxTerms>, StoreError> {
    Ok(
        record::get::<TaxSettings>(&*deps.store, &TaxSettings::key(tenant))
            .await?
            .and_then(|s| s.terms()),
    )
}

/// Changes the keys sent, conditioned on the version read (a racing
/// change is read again and applied on top).
pub async fn update(
    deps: &Deps,
    tenant: &Tenant,
    body: UpdateTaxSettings,
) -> Result<TaxSettings, BillingError> {
    for attempt in 0..16 {
        let current = get(deps, tenant).await?;
        let next = apply(&current, body.clone(), deps.clock.now())?;
        let cond = if current.version == 0 {
            Cond::NotExists
        } else {
            TaxSettings::VERSION.eq(&current.version)
        };
        let put = TxOp::Put {
            item: next.to_item()?,
            cond: Some(cond),
        };
        match deps.store.transact(vec![put]).await {
            Ok(()) => return Ok(next),
            Err(e) if e.is_condition_failure() => crate::store::contention_backoff(attempt).await,
            Err(e) => return Err(e.into()),
        }
    }
    Err(BillingError::Store(StoreError::Backend(
        "the billing settings changed too often while being written; retry".into(),
    )))
}

/// The Nepali fiscal year of Nepal day `day` (from 1 Shrawan): `2082/83`;
/// `None` outside the calendar's years.
pub fn fiscal_year(day: NaiveDate) -> Option<String> {
    let bs = bs_from_ad(day)?;
    let date = nepdate::NepaliDate::new(bs.year(), bs.month(), bs.day()).ok()?;
    Some(
        nepdate::FiscalYear::containing(date)
            .label(nepdate::Lang::En)
            .to_string(),
    )
}

/// The buyer's PAN a tax invoice prints: the customer's metadata `pan`,
/// when it is a PAN (9 digits; spaces and hyphens dropped). The SDK's
/// customer has no field for it.
pub fn buyer_pan(customer: &crate::domain::billing::customers::Customer) -> Option<String> {
    let raw = customer.metadata.get("pan")?.as_str()?;
    registration_number(raw).ok()
}

/// `13.00%` for 1300 basis points.
pub fn percent(bps: u32) -> String {
    format!("{}.{:02}%", bps / 100, bps % 100)
}

#[cfg(test)]
mod tests {
    use chrono::NaiveDate;
    use serde_json::json;

    use super::*;
    use crate::domain::billing::calendar::{BsDate, ad_from_bs};
    use crate::refusal::Refusal;
    use crate::time::{Clock, SystemClock};

    fn tenant() -> Tenant {
        Tenant::new(ProjectId::stored("p1"), Mode::Sandbox)
    }

    fn body(v: serde_json::Value) -> UpdateTaxSettings {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    fn field_of(e: BillingError) -> String {
        Refusal::from(e).field.unwrap_or_default()
    }

    fn ad(y: u16, m: u8, d: u8) -> NaiveDate {
        let bs = BsDate::new(y, m, d).unwrap_or_else(|| panic!("BS {y}-{m}-{d}"));
        ad_from_bs(bs).unwrap_or_else(|| panic!("BS {y}-{m}-{d} in AD"))
    }

    #[test]
    fn bad_settings_name_their_field() {
        let d = TaxSettings::defaults(&tenant());
        let now = SystemClock.now();
        for (v, field) in [
            (json!({"rateBps": 10_001}), "rateBps"),
            (json!({"rateBps": -1}), "rateBps"),
            (json!({"rateBps": i64::MAX}), "rateBps"),
            (
                json!({"registrationNumber": "12345678"}),
                "registrationNumber",
            ),
            (
                json!({"registrationNumber": "1234567890"}),
                "registrationNumber",
            ),
            (
                json!({"registrationNumber": "30123456X"}),
                "registrationNumber",
            ),
            (
                json!({"registrationNumber": "３０１２３４５６７"}),
                "registrationNumber",
            ),
            (json!({"label": "  "}), "label"),
            (json!({"label": "x".repeat(31)}), "label"),
        ] {
            match apply(&d, body(v.clone()), now) {
                Err(e) => assert_eq!(field_of(e), field, "{v}"),
                Ok(s) => panic!("accepted {v}: {s:?}"),
            }
        }
        assert!(
            serde_json::from_value::<UpdateTaxSettings>(json!({"rate": 1})).is_err(),
            "unknown keys are refused"
        );
    }

    #[test]
    fn a_patch_changes_only_what_it_sends() {
        let d = TaxSettings::defaults(&tenant());
        assert!(!d.tax_enabled && d.tax_rate_bps == 1300 && d.tax_label == "VAT");
        assert_eq!(d.terms(), None, "off by default");
        let now = SystemClock.now();
        let on = apply(
            &d,
            body(json!({"enabled": true, "registrationNumber": "301-234-567"})),
            now,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            on.terms(),
            Some(TaxTerms {
                rate_bps: 1300,
                label: "VAT".to_owned(),
                registration_number: Some("301234567".to_owned()),
            })
        );
        assert_eq!(on.version, 1);
        let relabelled = apply(
            &on,
            body(json!({"label": " GST ", "rateBps": 10_000, "overpaymentHandling": "credit"})),
            now,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(relabelled.tax_label, "GST");
        assert_eq!(relabelled.tax_rate_bps, 10_000);
        assert_eq!(relabelled.overpayment_handling, OverpaymentHandling::Credit);
        assert!(relabelled.tax_enabled, "kept");
        let cleared = apply(
            &relabelled,
            body(json!({"label": null, "registrationNumber": null, "rateBps": 0})),
            now,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cleared.tax_label, "VAT");
        assert_eq!(cleared.tax_registration_number, None);
        assert_eq!(cleared.tax_rate_bps, 0);
        assert_eq!(percent(1300), "13.00%");
        assert_eq!(percent(1325), "13.25%");
        assert_eq!(percent(5), "0.05%");
    }

    /// FY 2082/83 starts on 1 Shrawan 2082 (2025-07-17) and ends on the
    /// last day of Asar 2083; the day before each Shrawan 1 is the year
    /// before.
    #[test]
    fn the_fiscal_year_turns_on_shrawan_first() {
        let shrawan_2082 = ad(2082, 4, 1);
        assert_eq!(shrawan_2082.to_string(), "2025-07-17");
        let eve = shrawan_2082.pred_opt().unwrap_or(shrawan_2082);
        assert_eq!(fiscal_year(eve).as_deref(), Some("2081/82"));
        assert_eq!(fiscal_year(shrawan_2082).as_deref(), Some("2082/83"));
        let shrawan_2083 = ad(2083, 4, 1);
        let eve = shrawan_2083.pred_opt().unwrap_or(shrawan_2083);
        assert_eq!(fiscal_year(eve).as_deref(), Some("2082/83"));
        assert_eq!(fiscal_year(shrawan_2083).as_deref(), Some("2083/84"));
        // Baisakh 2083 is still 2082/83.
        assert_eq!(fiscal_year(ad(2083, 1, 1)).as_deref(), Some("2082/83"));
        assert_eq!(
            fiscal_year(NaiveDate::from_ymd_opt(1800, 1, 1).unwrap_or_default()),
            None
        );
    }
}
