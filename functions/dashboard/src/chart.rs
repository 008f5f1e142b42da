//! The overview's chart: each day's collected amount as bars, drawn as
//! inline SVG by us (no script, no image, no external asset). Colours are
//! presentation attributes, which the pages' CSP allows.

use maud::{Markup, html};
use shared::domain::analytics::DayFigures;

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 200.0;
/// Room for the axis labels.
const LEFT: f64 = 8.0;
const BOTTOM: f64 = 22.0;
const TOP: f64 = 18.0;

/// The bars of `series` (oldest first), scaled to the largest day; every
/// bar has a `<title>` with its day and amount, and the whole an
/// accessible name saying what it shows.
pub fn bars(series: &[DayFigures]) -> Markup {
    let max = series
        .iter()
        .map(|d| d.success_volume_paisa)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let total: i64 = series.iter().map(|d| d.success_volume_paisa).sum();
    let n = series.len().max(1) as f64;
    let slot = (WIDTH - LEFT) / n;
    let bar = (slot * 0.7).max(1.0);
    let plot = HEIGHT - BOTTOM - TOP;
    let name = format!(
        "Bar chart of the amount collected each day, {} days, {} in all{}",
        series.len(),
        crate::pages::rupees(total),
        series
            .iter()
            .max_by_key(|d| d.success_volume_paisa)
            .filter(|d| d.success_volume_paisa > 0)
            .map(|d| format!(
                "; the most on {} ({})",
                d.day,
                crate::pages::rupees(d.success_volume_paisa)
            ))
            .unwrap_or_default()
    );
    let first = series.first().map(|d| d.day.as_str()).unwrap_or("");
    let last = series.last().map(|d| d.day.as_str()).unwrap_or("");
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
            role="img" aria-label=(name) {
            title { (name) }
            line x1=(LEFT) y1=(HEIGHT - BOTTOM) x2=(WIDTH) y2=(HEIGHT - BOTTOM)
                stroke="#4b5563" stroke-width="1" {}
            text x=(LEFT) y="12" font-size="12" fill="#374151" {
                @if total > 0 {
                    "max " (crate::pages::rupees(max as i64))
                } @else {
                    "Nothing collected in these days yet"
                }
            }
            @for (i, d) in series.iter().enumerate() {
                @let h = (d.success_volume_paisa.max(0) as f64 / max * plot).round();
                @let x = LEFT + i as f64 * slot + (slot - bar) / 2.0;
                rect x=(format!("{x:.1}")) y=(format!("{:.1}", HEIGHT - BOTTOM - h))
                    width=(format!("{bar:.1}")) height=(format!("{h:.1}")) fill="#1f4e79" {
                    title { (d.day) ": " (crate::pages::rupees(d.success_volume_paisa)) }
                }
            }
            text x=(LEFT) y=(HEIGHT - 6.0) font-size="12" fill="#374151" { (first) }
            text x=(WIDTH) y=(HEIGHT - 6.0) font-size="12" fill="#374151" text-anchor="end" { (last) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: &str, v: i64) -> DayFigures {
        DayFigures {
            day: d.into(),
            success: i64::from(v > 0),
            success_volume_paisa: v,
        }
    }

    #[test]
    fn bars_scale_to_the_largest_day_and_say_what_they_show() {
        let svg = bars(&[
            day("2026-11-24", 50_000),
            day("2026-11-25", 0),
            day("2026-11-26", 100_000),
        ])
        .into_string();
        // The largest bar fills the plot (200 - 22 - 18 = 160), half is 80.
        assert!(svg.contains("height=\"160.0\""), "{svg}");
        assert!(svg.contains("height=\"80.0\""), "{svg}");
        assert!(svg.contains("height=\"0.0\""), "{svg}");
        assert!(svg.contains("role=\"img\""));
        assert!(svg.contains("3 days, NPR 1,500.00 in all; the most on 2026-11-26 (NPR 1,000.00)"));
        assert!(svg.contains("<title>2026-11-25: NPR 0.00</title>"));
        assert_eq!(svg.matches("<rect").count(), 3);
    }

    #[test]
    fn an_empty_window_draws_no_bar_and_no_division_by_zero() {
        let svg = bars(&[]).into_string();
        assert_eq!(svg.matches("<rect").count(), 0);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        let zeros = bars(&[day("2026-11-26", 0)]).into_string();
        assert!(zeros.contains("height=\"0.0\"") && !zeros.contains("NaN"));
        assert!(zeros.contains("Nothing collected") && !zeros.contains("max NPR"));
    }
}
