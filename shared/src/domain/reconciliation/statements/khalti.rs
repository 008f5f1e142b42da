//! Khalti's statement: its merchant transaction list, pulled through the
//! API for one Nepal day (no file to upload).

use chrono::NaiveDate;

use super::table::{Cell, instant};
use super::{LineKind, LineStatus, MAX_LINES, ParseError, Statement, StatementLine, digest};
use crate::app::Deps;
use crate::domain::billing::calendar::nepal_day;
use crate::domain::credentials;
use crate::kinds::{Provider, Tenant};
use crate::providers::ProviderError;
use crate::providers::amount::paisa_from_json;
use crate::providers::hub::HubError;
use crate::providers::khalti::KhaltiTransaction;

/// Why a Khalti statement could not be pulled.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// No Khalti credentials for the project in that mode.
    #[error(transparent)]
    Credentials(#[from] HubError),
    /// Khalti did not answer, refused, or answered something unreadable.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// A record Khalti listed cannot be a statement line.
    #[error("Khalti transaction list: {0}")]
    Records(ParseError),
}

/// The tenant's Khalti statement of Nepal day `day`: every page of the
/// merchant transaction list, the records of other days (if Khalti's
/// filter is wider) left out. `digest` covers the records as pulled, so
/// pulling an unchanged day again gives the same digest.
pub async fn pull(deps: &Deps, tenant: &Tenant, day: NaiveDate) -> Result<Statement, PullError> {
    let creds =
        credentials::for_provider(&*deps.store, &deps.providers, tenant, Provider::Khalti).await?;
    let client = deps.providers.khalti(tenant.mode)?;
    let records = client.transactions(&creds, day, day).await?;
    let lines = from_khalti_records(&records).map_err(PullError::Records)?;
    let lines: Vec<StatementLine> = lines
        .into_iter()
        .filter(|l| nepal_day(l.at) == day)
        .collect();
    let account = records
        .iter()
        .find_map(|r| r.merchant.as_ref().and_then(|m| m.idx.clone()));
    let bytes = serde_json::to_vec(&records).unwrap_or_default();
    Ok(Statement {
        provider: Provider::Khalti,
        account,
        lines,
        digest: digest(&bytes),
    })
}

/// Khalti's list records as statement lines, in order (`line` is the
/// record's 1-based position). A record with an unreadable amount, fee or
/// time, or listed twice, is an error naming it.
pub fn from_khalti_records(
    records: &[KhaltiTransaction],
) -> Result<Vec<StatementLine>, ParseError> {
    if records.len() > MAX_LINES {
        return Err(ParseError {
            line: None,
            column: None,
            message: format!("more than {MAX_LINES} transactions"),
        });
    }
    let mut seen = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let err = |column: &str, message: String| ParseError {
            line: Some(line),
            column: Some(column.to_owned()),
            message,
        };
        let idx = r.idx.trim();
        if idx.is_empty() || idx.len() > 64 || idx.chars().any(char::is_control) {
            return Err(err("idx", "the transaction idx is not a plain id".into()));
        }
        if let Some(first) = seen.insert(idx.to_owned(), line) {
            return Err(err(
                "idx",
                format!("duplicate transaction '{idx}': already record {first}"),
            ));
        }
        let amount =
            paisa_from_json(&r.amount).map_err(|e| err("amount", format!("the amount: {e}")))?;
        let fee = match &r.fee_amount {
            serde_json::Value::Null => None,
            v => Some(paisa_from_json(v).map_err(|e| err("fee_amount", format!("the fee: {e}")))?),
        };
        let at = instant(&Cell::Text(r.created_on.clone())).map_err(|m| err("created_on", m))?;
        let type_name = r
            .kind
            .name
            .as_deref()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let kind = if type_name.contains("refund") {
            LineKind::Refund
        } else {
            LineKind::Payment
        };
        let state = r
            .state
            .name
            .as_deref()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let status = match state.as_str() {
            "completed" | "complete" if r.refunded => LineStatus::Refunded,
            "completed" | "complete" => LineStatus::Success,
            "pending" | "initiated" => LineStatus::Pending,
            "failed" | "expired" | "user canceled" | "user cancelled" | "canceled"
            | "cancelled" => LineStatus::Failed,
            "refunded" | "partially refunded" => LineStatus::Refunded,
            _ => LineStatus::Other,
        };
        out.push(StatementLine {
            line,
            provider: Provider::Khalti,
            reference: None,
            provider_ref: Some(idx.to_owned()),
            kind,
            status,
            amount,
            fee,
            at,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::Paisa;
    use crate::time::Timestamp;
    use serde_json::json;

    fn record(idx: &str, state: &str, amount: serde_json::Value) -> KhaltiTransaction {
        serde_json::from_value(json!({
            "idx": idx,
            "type": {"idx": "e476BL6jt9kgagEmsakyTL", "name": "Wallet payment"},
            "state": {"idx": "DhvMj9hdRufLqkP8ZY4d8g", "name": state, "template": "is complete"},
            "amount": amount,
            "fee_amount": 30,
            "refunded": false,
            "created_on": "2018-06-20T14:48:08.867125+05:45",
            "ebanker": null,
            "user": {"idx": "cCaPkRPQGn5D8StkiqqMJg", "name": "Test User", "mobile": "98XXXXXXX9"},
            "merchant": {"idx": "UM75Gm2gWmZvA4TPwkwZye", "name": "Test Merchant", "mobile": "testmerchant@khalti.com"}
        }))
        .unwrap_or_else(|e| panic!("the documented record: {e}"))
    }

    #[test]
    fn the_documented_records_become_lines() {
        let mut refunded = record("B", "Completed", json!(500));
        refunded.refunded = true;
        let mut refund = record("C", "Completed", json!(500));
        refund.kind.name = Some("Refund".into());
        refund.fee_amount = serde_json::Value::Null;
        let lines = from_khalti_records(&[
            record("8xmeJnNXfoVjCvGcZiiGe7", "Completed", json!(1000)),
            refunded,
            refund,
            record("D", "Pending", json!("2000")),
            record("E", "Confirmed", json!(1000.0)),
        ])
        .expect("reads");
        let l = &lines[0];
        assert_eq!(l.line, 1);
        assert_eq!(l.provider, Provider::Khalti);
        assert_eq!(l.reference, None);
        assert_eq!(l.provider_ref.as_deref(), Some("8xmeJnNXfoVjCvGcZiiGe7"));
        assert_eq!((l.kind, l.status), (LineKind::Payment, LineStatus::Success));
        assert_eq!(
            (l.amount, l.fee),
            (Paisa::new(1000).unwrap_or_default(), Paisa::new(30).ok())
        );
        assert_eq!(Some(l.at), Timestamp::parse("2018-06-20T09:03:08.867Z"));
        assert_eq!(lines[1].status, LineStatus::Refunded);
        assert_eq!((lines[2].kind, lines[2].fee), (LineKind::Refund, None));
        assert_eq!(lines[3].status, LineStatus::Pending);
        assert_eq!(lines[3].amount, Paisa::new(2000).unwrap_or_default());
        assert_eq!(lines[4].status, LineStatus::Other);
    }

    #[test]
    fn bad_records_are_refused_naming_them() {
        let cases = [
            (vec![record("A", "Completed", json!(-1))], 1, "amount"),
            (vec![record("A", "Completed", json!(10.5))], 1, "amount"),
            (vec![record("A", "Completed", json!("ten"))], 1, "amount"),
            (
                vec![
                    record("A", "Completed", json!(1)),
                    record("A", "Completed", json!(1)),
                ],
                2,
                "idx",
            ),
            (vec![record(" ", "Completed", json!(1))], 1, "idx"),
        ];
        for (records, line, column) in cases {
            let e = from_khalti_records(&records).expect_err("refused");
            assert_eq!(
                (e.line, e.column.as_deref()),
                (Some(line), Some(column)),
                "{e}"
            );
        }
        let mut late = record("A", "Completed", json!(1));
        late.created_on = "yesterday".into();
        let e = from_khalti_records(&[late]).expect_err("refused");
        assert_eq!(e.column.as_deref(), Some("created_on"));
        let mut fee = record("A", "Completed", json!(1));
        fee.fee_amount = json!(-3);
        let e = from_khalti_records(&[fee]).expect_err("refused");
        assert_eq!(e.column.as_deref(), Some("fee_amount"));
    }
}
