//! A subscription page's usage and pending items (issue 40 part 8): each
//! period's metered usage as bars (inline SVG, no script), and the
//! invoice items, pending and invoiced. The rules are in
//! `shared::domain::billing::{usage, items}`.

use maud::{Markup, html};
use shared::AppState;
use shared::domain::billing::items::{self, InvoiceItem, ItemStatus};
use shared::domain::billing::subscription::Subscription;
use shared::domain::billing::usage::{self, PeriodUsage};
use shared::store::StoreError;

use crate::pages::rupees;

/// Periods charted.
const PERIODS: u32 = 6;
/// Items listed, newest first.
const ITEMS: usize = 20;

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 160.0;
const BOTTOM: f64 = 22.0;
const TOP: f64 = 18.0;

/// The usage chart (metered plans) and the items of `sub`.
pub(crate) async fn panels(state: &AppState, sub: &Subscription) -> Result<Markup, StoreError> {
    let periods = if usage::metered(sub) {
        Some(usage::recent_periods(state, sub, PERIODS).await?)
    } else {
        None
    };
    let found = items::all(state, &sub.id, ITEMS).await?;
    Ok(html! {
        @if let Some(periods) = &periods {
            h2 { "Usage" }
            p.muted { "Units reported each period (billed on the next period's invoice at " (rupees(sub.terms.amount)) " a unit)." }
            div.panel { (bars(periods)) }
        }
        h2 { "Invoice items" }
        p.muted { "One-off charges: pending ones go on the next invoice." }
        div.panel {
            @if found.is_empty() { p { "No invoice items." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Item" } th scope="col" { "Description" } th scope="col" { "Quantity" }
                        th scope="col" { "Total" } th scope="col" { "Status" } th scope="col" { "Invoice" }
                    } }
                    tbody { @for i in &found { (item_row(i)) } }
                }
            }
        }
    })
}

fn item_row(i: &InvoiceItem) -> Markup {
    html! {
        tr {
            td { (i.id) }
            td { (i.description) }
            td { (i.quantity) " × " (rupees(i.unit_amount)) }
            td { (rupees(i.total())) }
            td { @match i.status { ItemStatus::Pending => "pending", ItemStatus::Invoiced => "invoiced" } }
            td {
                @if let Some(inv) = &i.invoice_id {
                    a href={ "/dashboard/billing/invoices/" (inv) } { (inv) }
                } @else { "—" }
            }
        }
    }
}

/// Each period's quantity as a bar, scaled to the largest; each bar has a
/// `<title>`, the whole an accessible name.
pub(crate) fn bars(periods: &[PeriodUsage]) -> Markup {
    let max = periods.iter().map(|p| p.quantity).max().unwrap_or(0).max(1) as f64;
    let n = periods.len().max(1) as f64;
    let slot = WIDTH / n;
    let bar = (slot * 0.6).max(1.0);
    let plot = HEIGHT - BOTTOM - TOP;
    let name = format!(
        "Bar chart of the units used in each of the last {} periods: {}",
        periods.len(),
        periods
            .iter()
            .map(|p| format!("{} {}", p.period.start, p.quantity))
            .collect::<Vec<_>>()
            .join(", ")
    );
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
            role="img" aria-label=(name) {
            title { (name) }
            line x1="0" y1=(HEIGHT - BOTTOM) x2=(WIDTH) y2=(HEIGHT - BOTTOM) stroke="#4b5563" stroke-width="1" {}
            @for (i, p) in periods.iter().enumerate() {
                @let h = (p.quantity as f64 / max * plot).round();
                @let x = i as f64 * slot + (slot - bar) / 2.0;
                rect x=(format!("{x:.1}")) y=(format!("{:.1}", HEIGHT - BOTTOM - h))
                    width=(format!("{bar:.1}")) height=(format!("{h:.1}")) fill="#1f4e79" {
                    title {
                        (p.period.start) " to " (p.period.end_exclusive) ": " (p.quantity) " units, "
                        (p.records) " records" @if p.partial { " (the first only)" }
                    }
                }
                text x=(format!("{:.1}", x + bar / 2.0)) y=(format!("{:.1}", HEIGHT - BOTTOM - h - 4.0))
                    font-size="11" fill="#374151" text-anchor="middle" { (p.quantity) }
                text x=(format!("{:.1}", x + bar / 2.0)) y=(HEIGHT - 6.0) font-size="11" fill="#374151"
                    text-anchor="middle" { (p.period.start) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::NaiveDate;
    use shared::domain::billing::period::Period;

    use super::*;

    fn p(m: u32, q: u64) -> PeriodUsage {
        let d = |m| NaiveDate::from_ymd_opt(2026, m, 10).unwrap_or_default();
        PeriodUsage {
            period: Period {
                start: d(m),
                end_exclusive: d(m + 1),
            },
            quantity: q,
            records: 3,
            partial: false,
        }
    }

    #[test]
    fn bars_scale_to_the_largest_period_and_name_each() {
        let svg = bars(&[p(1, 50), p(2, 0), p(3, 100)]).into_string();
        // The plot is 160 - 22 - 18 = 120 high.
        assert!(svg.contains("height=\"120.0\""), "{svg}");
        assert!(svg.contains("height=\"60.0\""), "{svg}");
        assert!(svg.contains("2026-03-10 to 2026-04-10: 100 units, 3 records"));
        assert!(svg.contains("2026-01-10 50, 2026-02-10 0, 2026-03-10 100"));
        assert_eq!(svg.matches("<rect").count(), 3);
        let none = bars(&[]).into_string();
        assert!(!none.contains("NaN") && none.matches("<rect").count() == 0);
    }
}
