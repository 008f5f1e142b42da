//! The hosted pages' HTML: one small mobile-first layout, inline CSS, no
//! external assets, and JavaScript only where the page must act by itself
//! (auto-submitting eSewa's form, polling while a QR waits). Every value
//! shown is escaped; no secret is ever written into a page (eSewa's form
//! carries a signature, never the key).
//!
//! The inline CSS and scripts are constant text (what varies, such as the
//! address a page polls, is read from the page's own markup), so the
//! Content-Security-Policy ([`csp`]) allows exactly them by their SHA-256
//! hashes, computed once at start-up: no `'unsafe-inline'`, no inline
//! event handler, and nothing injected into a page could run.

use shared::domain::Provider;
use shared::domain::checkout::{CheckoutSession, StoredAddress};
use shared::money::Paisa;

pub use edge::html::esc;

const CSS: &str = "\
*{box-sizing:border-box}\
body{margin:0;font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;background:#f3f4f6;color:#111827;line-height:1.45}\
header{background:#1f4e79;color:#fff;padding:.8rem 1rem;font-weight:700}\
header small{font-weight:400;opacity:.85;margin-left:.5rem;font-size:.8rem}\
main{max-width:30rem;margin:0 auto;padding:1rem}\
.card{background:#fff;border-radius:.75rem;padding:1rem 1.1rem;box-shadow:0 1px 3px rgba(0,0,0,.12);margin-bottom:1rem}\
h1{font-size:1.25rem;margin:.2rem 0 .4rem}\
.amount{font-size:2rem;font-weight:700;margin:.2rem 0}\
.muted{color:#6b7280;font-size:.9rem}\
.notice{background:#fef3c7;color:#92400e;padding:.6rem .8rem;border-radius:.5rem;margin-bottom:1rem}\
.error{background:#fee2e2;color:#991b1b;padding:.6rem .8rem;border-radius:.5rem;margin-bottom:1rem}\
fieldset{border:0;padding:0;margin:0}\
.option{display:flex;align-items:center;gap:.7rem;border:1px solid #d1d5db;border-radius:.6rem;padding:.8rem;margin:.5rem 0;cursor:pointer;font-size:1.05rem}\
.option input{width:1.2rem;height:1.2rem}\
label.field{display:block;margin:.6rem 0 .2rem;color:#374151;font-size:.9rem}\
input[type=text]{width:100%;padding:.65rem;border:1px solid #d1d5db;border-radius:.5rem;font-size:1rem}\
button,.button{display:block;width:100%;padding:.9rem;border:0;border-radius:.5rem;font-size:1.05rem;font-weight:600;cursor:pointer;background:#1f4e79;color:#fff;text-align:center;text-decoration:none;margin-top:1rem}\
.secondary{background:#e5e7eb;color:#111827}\
.qr{text-align:center}.qr svg{width:100%;max-width:16rem;height:auto}\
a{color:#1f4e79}";

/// eSewa's hand-off form posts itself.
const HANDOFF: &str = "document.getElementById('handoff').submit();";
/// The picker with one way to pay posts itself (straight to the provider).
pub const PAY_NOW: &str = "document.getElementById('pay-form').submit();";
/// A link's form disables its button once sent (no double sessions).
const LINK_FORM: &str = "(function(){var f=document.getElementById('link-form');\
if(f)f.addEventListener('submit',function(){var b=f.querySelector('button');if(b)b.disabled=true})})();";
/// The polling script: asks the address in `#state`'s `data-status` (the
/// session's `/c/{id}/status`) every 3 seconds, at most 400 times, and
/// follows `next` once the payment is decided.
const POLL: &str = "(function(){var s=document.getElementById('state');\
var u=s&&s.getAttribute('data-status');if(!u)return;var n=0;function t(){n++;if(n>400)return;\
fetch(u,{cache:'no-store'}).then(function(r){return r.json()}).then(function(j){\
if(j.message)s.textContent=j.message;\
if(j.next){window.location.href=j.next;return}setTimeout(t,3000)})\
.catch(function(){setTimeout(t,5000)})}setTimeout(t,2000)})();";

/// Every inline script a hosted page may carry.
const SCRIPTS: [&str; 4] = [HANDOFF, PAY_NOW, LINK_FORM, POLL];

/// `'sha256-…'` of `text`, as a CSP source.
fn hash_source(text: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The hosted pages' Content-Security-Policy: their one stylesheet and
/// their few scripts by hash, the status poll to ourselves, nothing else.
pub fn csp() -> &'static str {
    static CSP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let scripts: Vec<String> = SCRIPTS.iter().map(|s| hash_source(s)).collect();
        format!(
            "default-src 'none'; style-src {}; script-src {}; \
             img-src data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'",
            hash_source(CSS),
            scripts.join(" ")
        )
    });
    &CSP
}

/// A whole page. `sandbox` adds a visible test-mode marker; `script` is
/// one of the constant scripts above (or empty).
fn layout(title: &str, merchant: &str, sandbox: bool, body: &str, script: &str) -> String {
    let mark = if sandbox {
        "<small>test mode · no real money (fonepay excepted)</small>"
    } else {
        ""
    };
    let script = if script.is_empty() {
        String::new()
    } else {
        format!("<script>{script}</script>")
    };
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content=\"width=device-width,initial-scale=1\">\
         <meta name=robots content=noindex>\
         <title>{title} · {merchant}</title><style>{CSS}</style></head>\
         <body><header>{merchant}{mark}</header><main>{body}</main>{script}</body></html>",
        title = esc(title),
        merchant = esc(merchant),
    )
}

/// The header card: what is being paid.
fn summary(s: &CheckoutSession) -> String {
    let description = s
        .description
        .as_deref()
        .map(|d| format!("<p class=muted>{}</p>", esc(d)))
        .unwrap_or_default();
    format!(
        "<div class=card><div class=muted>Amount to pay</div>\
         <div class=amount id=amount>{}</div>{description}</div>",
        esc(&s.amount.display_npr())
    )
}

/// The picker: one radio per offered provider (the session's own
/// pre-selected), the address form when collected, and one submit button.
pub fn picker(
    s: &CheckoutSession,
    merchant: &str,
    offered: &[Provider],
    notice: Option<&str>,
    error: Option<&str>,
    address: Option<&StoredAddress>,
) -> String {
    let mut body = summary(s);
    if let Some(n) = notice {
        body.push_str(&format!("<div class=notice id=notice>{}</div>", esc(n)));
    }
    if let Some(e) = error {
        body.push_str(&format!("<div class=error id=error>{}</div>", esc(e)));
    }
    body.push_str(&format!(
        "<form id=pay-form class=card method=post action=\"/c/{}/pay\"><h1>Pay with</h1><fieldset>",
        esc(&s.id)
    ));
    if offered.is_empty() {
        body.push_str("<p>This shop cannot take payments right now.</p>");
    }
    let preselected = s
        .current_provider()
        .filter(|p| offered.contains(p))
        .or(offered.first().copied());
    for p in offered {
        let checked = if Some(*p) == preselected {
            " checked"
        } else {
            ""
        };
        body.push_str(&format!(
            "<label class=option for=provider-{v}><input type=radio name=provider value={v} id=provider-{v}{checked}>{name}</label>",
            v = p.as_str(),
            name = p.display_name(),
        ));
    }
    body.push_str("</fieldset>");
    if s.collect_address {
        let a = address.or(s.customer_address.as_ref());
        let val = |f: fn(&StoredAddress) -> &Option<String>| {
            a.and_then(|a| f(a).as_deref()).map(esc).unwrap_or_default()
        };
        body.push_str("<h1>Delivery address</h1>");
        for (name, label, required, value) in [
            ("line1", "Address", true, val(|a| &a.line1)),
            (
                "line2",
                "Address line 2 (optional)",
                false,
                val(|a| &a.line2),
            ),
            ("city", "City", true, val(|a| &a.city)),
            ("state", "Province (optional)", false, val(|a| &a.state)),
            (
                "postalCode",
                "Postal code (optional)",
                false,
                val(|a| &a.postal_code),
            ),
            ("country", "Country", false, val(|a| &a.country)),
        ] {
            let value = if name == "country" && value.is_empty() {
                "Nepal".to_owned()
            } else {
                value
            };
            body.push_str(&format!(
                "<label class=field for=addr-{name}>{label}</label>\
                 <input type=text id=addr-{name} name={name} value=\"{value}\" maxlength=200{req}>",
                req = if required { " required" } else { "" },
            ));
        }
    }
    if !offered.is_empty() {
        body.push_str(&format!(
            "<button id=pay-button type=submit>Pay {}</button>",
            esc(&s.amount.display_npr())
        ));
    }
    body.push_str("</form>");
    if let Some(cancel) = &s.cancel_url {
        body.push_str(&format!(
            "<p class=muted><a id=cancel-link href=\"{}\">Cancel and return to {}</a></p>",
            esc(cancel),
            esc(merchant)
        ));
    }
    layout("Checkout", merchant, !s.mode.is_live(), &body, "")
}

/// eSewa's hand-off: a form the browser posts to eSewa by itself.
pub fn auto_post(
    merchant: &str,
    sandbox: bool,
    action: &str,
    fields: &[(String, String)],
) -> String {
    let mut inputs = String::new();
    for (k, v) in fields {
        inputs.push_str(&format!(
            "<input type=hidden name=\"{}\" value=\"{}\">",
            esc(k),
            esc(v)
        ));
    }
    let body = format!(
        "<form id=handoff class=card method=post action=\"{}\">{inputs}\
         <h1>Taking you to eSewa…</h1><p class=muted>If nothing happens, press the button.</p>\
         <button type=submit>Continue to eSewa</button></form>",
        esc(action)
    );
    layout("Redirecting", merchant, sandbox, &body, HANDOFF)
}

/// The status line the poll script updates, and where it asks.
fn state_line(session_id: &str, text: &str) -> String {
    format!(
        "<p id=state data-status=\"/c/{}/status\">{text}</p>",
        esc(session_id)
    )
}

/// Fonepay's hand-off: the QR to scan, and the page waits for the payment.
pub fn qr_page(s: &CheckoutSession, merchant: &str, svg: &str) -> String {
    let body = format!(
        "{}<div class=card qr><h1>Scan to pay with Fonepay</h1>\
         <div id=qr>{svg}</div><p class=muted>Open any Fonepay-enabled mobile banking or wallet app and scan.</p>\
         {}</div>\
         <form method=post action=\"/c/{id}/pay\"><input type=hidden name=provider value=fonepay><input type=hidden name=fonepay value=web>\
         <button class=secondary type=submit>Pay on Fonepay's website instead</button></form>\
         <p class=muted><a href=\"/c/{id}?choose=1\">Choose another way to pay</a></p>",
        summary(s),
        state_line(&s.id, "Waiting for your payment…"),
        id = esc(&s.id)
    );
    layout("Scan to pay", merchant, !s.mode.is_live(), &body, POLL)
}

/// While the provider's answer is awaited: the page checks by itself.
pub fn confirming(s: &CheckoutSession, merchant: &str, provider: Provider) -> String {
    let body = format!(
        "{}<div class=card><h1>Confirming your payment</h1>\
         {}</div>\
         <p class=muted><a href=\"/c/{}?choose=1\">Choose another way to pay</a></p>",
        summary(s),
        state_line(
            &s.id,
            &format!(
                "We are checking with {} that your payment went through. This page moves on by itself.",
                provider.display_name()
            )
        ),
        esc(&s.id)
    );
    layout("Confirming", merchant, !s.mode.is_live(), &body, POLL)
}

/// A final page: paid, failed or expired, with a way back to the shop.
pub fn final_page(
    s: &CheckoutSession,
    merchant: &str,
    title: &str,
    message: &str,
    back: Option<(&str, &str)>,
) -> String {
    let link = back
        .map(|(href, label)| {
            format!(
                "<a class=button id=back-link href=\"{}\">{}</a>",
                esc(href),
                esc(label)
            )
        })
        .unwrap_or_default();
    let body = format!(
        "{}<div class=card id=final><h1>{}</h1><p>{}</p>{link}</div>",
        summary(s),
        esc(title),
        esc(message)
    );
    layout(title, merchant, !s.mode.is_live(), &body, "")
}

/// A page with no session behind it (unknown id, or trouble).
pub fn plain(title: &str, message: &str) -> String {
    layout(
        title,
        "Dhukuti",
        false,
        &format!(
            "<div class=card><h1>{}</h1><p>{}</p></div>",
            esc(title),
            esc(message)
        ),
        "",
    )
}

/// A payment link's page: what is sold, the amount (or a field for it),
/// the customer's details, and one button to go on to checkout.
pub fn link_page(
    link: &shared::domain::links::PaymentLink,
    merchant: &str,
    error: Option<&str>,
    typed_amount: Option<&str>,
) -> String {
    let mut body = String::from("<div class=card>");
    body.push_str(&format!("<h1 id=link-title>{}</h1>", esc(&link.title)));
    if let Some(d) = &link.description {
        body.push_str(&format!("<p class=muted>{}</p>", esc(d)));
    }
    if let Some(a) = link.amount {
        body.push_str(&format!(
            "<div class=amount id=amount>{}</div>",
            esc(&a.display_npr())
        ));
    }
    body.push_str("</div>");
    if let Some(e) = error {
        body.push_str(&format!("<div class=error id=error>{}</div>", esc(e)));
    }
    body.push_str(&format!(
        "<form id=link-form class=card method=post action=\"/l/{}\">",
        esc(&link.id)
    ));
    if link.amount.is_none() {
        let min = Paisa::new(link.min_amount.unwrap_or(1)).unwrap_or_default();
        let max = Paisa::new(link.max_amount.unwrap_or(1)).unwrap_or_default();
        body.push_str(&format!(
            "<label class=field for=link-amount>Amount in NPR ({} to {})</label>\
             <input type=text inputmode=decimal id=link-amount name=amount value=\"{}\" required>",
            esc(&min.display_npr()),
            esc(&max.display_npr()),
            esc(typed_amount.unwrap_or_default())
        ));
    }
    for (name, label, value) in [
        ("name", "Your name", link.customer_name.as_deref()),
        ("email", "Email (optional)", link.customer_email.as_deref()),
        ("phone", "Mobile (optional)", link.customer_phone.as_deref()),
    ] {
        body.push_str(&format!(
            "<label class=field for=link-{name}>{label}</label>\
             <input type=text id=link-{name} name={name} value=\"{}\" maxlength=200>",
            esc(value.unwrap_or_default())
        ));
    }
    body.push_str("<button id=link-continue type=submit>Continue to payment</button></form>");
    layout(
        &link.title,
        merchant,
        !link.mode.is_live(),
        &body,
        LINK_FORM,
    )
}

/// A link that cannot take payments: its own message.
pub fn link_unavailable(merchant: &str, sandbox: bool, message: &str) -> String {
    layout(
        "Unavailable",
        merchant,
        sandbox,
        &format!(
            "<div class=card id=inactive><h1>Not available</h1><p>{}</p></div>",
            esc(message)
        ),
        "",
    )
}

/// Where a link's customer lands when the link has no `redirectUrl`.
pub fn link_thanks(merchant: &str, sandbox: bool) -> String {
    layout(
        "Thank you",
        merchant,
        sandbox,
        "<div class=card id=thanks><h1>Thank you</h1><p>Your payment was received. You can close this page.</p></div>",
        "",
    )
}

/// What a bill page shows of a billing invoice (the handler reads it).
pub struct Bill<'a> {
    pub invoice: &'a shared::domain::billing::invoice::BillingInvoice,
    /// Its first line's description (the plan), if any.
    pub what: &'a str,
    /// `2081 Shrawan 15`, when the calendar covers the day.
    pub due_bs: Option<String>,
    pub period_start_bs: Option<String>,
    pub period_end_bs: Option<String>,
    /// The issue date in Nepal, and its Miti.
    pub issued_on: chrono::NaiveDate,
    pub issued_bs: Option<String>,
    /// `2082/83`.
    pub fiscal_year: Option<String>,
    /// The buyer's PAN (the customer's metadata `pan`).
    pub buyer_pan: Option<String>,
}

/// The bill's amounts: subtotal, discount, taxable amount and VAT (a tax
/// invoice), total, credit applied, amount due.
fn breakdown(inv: &shared::domain::billing::invoice::BillingInvoice) -> String {
    let npr = |p: i64| {
        let s = Paisa::new(p.unsigned_abs().try_into().unwrap_or(i64::MAX))
            .map(|a| a.display_npr())
            .unwrap_or_else(|_| "NPR 0.00".into());
        if p < 0 { format!("-{s}") } else { s }
    };
    let mut rows = vec![("bill-subtotal", "Subtotal".to_owned(), inv.subtotal)];
    if inv.discount_total > 0 {
        rows.push(("bill-discount", "Discount".to_owned(), -inv.discount_total));
    }
    if let Some(t) = &inv.tax {
        rows.push((
            "bill-taxable",
            "Taxable amount".to_owned(),
            inv.taxable_amount(),
        ));
        rows.push(("bill-tax", t.line_label(), inv.tax_total));
    }
    rows.push(("bill-total", "Total".to_owned(), inv.total));
    if inv.credit_applied > 0 {
        rows.push((
            "bill-credit",
            "Credit applied".to_owned(),
            -inv.credit_applied,
        ));
    }
    rows.push(("bill-due", "Amount due".to_owned(), inv.amount_due));
    let mut out = String::from("<table id=bill-breakdown>");
    for (id, name, amount) in rows {
        out.push_str(&format!(
            "<tr id={id}><th scope=row>{}</th><td class=num>{}</td></tr>",
            esc(&name),
            esc(&npr(amount))
        ));
    }
    out.push_str("</table>");
    out
}

/// A billing invoice's pay page: the merchant, the number, the period,
/// the amount and the due date (AD and BS), and one button opening the
/// provider picker; a paid or void invoice shows its state instead.
pub fn bill_page(bill: &Bill<'_>, merchant: &str, error: Option<&str>) -> String {
    use shared::domain::billing::invoice::InvoiceStatus as S;
    let inv = bill.invoice;
    let with_bs = |ad: chrono::NaiveDate, bs: &Option<String>| match bs {
        Some(bs) => format!("{ad} ({bs} BS)"),
        None => ad.to_string(),
    };
    let last_day = inv.period_end.pred_opt().unwrap_or(inv.period_end);
    let amount = Paisa::new(inv.amount_due)
        .map(|a| a.display_npr())
        .unwrap_or_else(|_| "NPR 0.00".into());
    let kind = if inv.tax.is_some() {
        "Tax Invoice"
    } else {
        "Invoice"
    };
    let mut tax_ids = String::new();
    if let Some(pan) = inv
        .tax
        .as_ref()
        .and_then(|t| t.registration_number.as_deref())
    {
        tax_ids.push_str(&format!(
            "<p id=bill-seller-pan>Seller PAN/VAT No. {}</p>",
            esc(pan)
        ));
    }
    if let Some(pan) = &bill.buyer_pan {
        tax_ids.push_str(&format!("<p id=bill-buyer-pan>Buyer PAN {}</p>", esc(pan)));
    }
    let fiscal = bill
        .fiscal_year
        .as_deref()
        .map(|fy| format!(" <span id=bill-fy>FY {}</span>", esc(fy)))
        .unwrap_or_default();
    let mut body = format!(
        "<div class=card><div class=muted><span id=bill-kind>{kind}</span> <span id=bill-number>{}</span>{fiscal}</div>\
         <h1 id=bill-what>{}</h1>\
         <div class=amount id=amount>{}</div>\
         <p class=muted id=bill-issued>Date: {}</p>\
         <p class=muted id=bill-period>Period: {} to {}</p>\
         <p id=bill-due>Due: {}</p>{tax_ids}{}</div>",
        esc(&inv.number),
        esc(bill.what),
        esc(&amount),
        esc(&with_bs(bill.issued_on, &bill.issued_bs)),
        esc(&with_bs(inv.period_start, &bill.period_start_bs)),
        esc(&with_bs(last_day, &bill.period_end_bs)),
        esc(&with_bs(inv.due_date, &bill.due_bs)),
        breakdown(inv),
    );
    if let Some(e) = error {
        body.push_str(&format!("<div class=error id=error>{}</div>", esc(e)));
    }
    if inv.status != S::Draft {
        body.push_str(&format!(
            "<p class=muted><a id=bill-pdf href=\"/b/{}/pdf\">Download the invoice (PDF)</a></p>",
            esc(&inv.id)
        ));
    }
    let state = match inv.status {
        S::Paid => Some(("Paid", "This invoice is paid. Thank you.")),
        S::Void => Some((
            "Void",
            "This invoice was cancelled: there is nothing to pay.",
        )),
        S::Draft => Some(("Not issued", "This invoice is not issued yet.")),
        S::Open | S::Overdue | S::Uncollectible => None,
    };
    match state {
        Some((title, message)) => body.push_str(&format!(
            "<div class=card id=bill-state data-status={}><h1>{}</h1><p>{}</p></div>",
            inv.status.as_str(),
            esc(title),
            esc(message)
        )),
        None => {
            if inv.status == S::Overdue {
                body.push_str("<div class=notice id=bill-overdue>This invoice is overdue.</div>");
            }
            body.push_str(&format!(
                "<form id=link-form class=card method=post action=\"/b/{}\">\
                 <button id=bill-pay type=submit>Pay {}</button></form>",
                esc(&inv.id),
                esc(&amount)
            ));
        }
    }
    layout(
        &format!("Invoice {}", inv.number),
        merchant,
        !inv.mode.is_live(),
        &body,
        LINK_FORM,
    )
}

/// A subscription's short link: the merchant, the plan, the amount each
/// period, and when its trial ends (AD and BS); the bill comes then.
pub fn trial_page(view: &shared::domain::short_links::TrialView) -> String {
    let amount = Paisa::new(view.amount)
        .map(|a| a.display_npr())
        .unwrap_or_else(|_| "NPR 0.00".into());
    let ends = match (view.trial_ends_on, &view.trial_ends_bs) {
        (Some(ad), Some(bs)) => Some(format!("{ad} ({bs} BS)")),
        (Some(ad), None) => Some(ad.to_string()),
        _ => None,
    };
    let mut body = format!(
        "<div class=card><div class=muted>Subscription</div>\
         <h1 id=trial-plan>{}</h1>\
         <div class=amount id=amount>{}</div>\
         <p class=muted>each billing period</p></div>",
        esc(&view.plan),
        esc(&amount),
    );
    let (title, message) = match (&ends, view.ended) {
        (_, true) => (
            "Subscription ended",
            "This subscription has ended: nothing more will be billed.".to_owned(),
        ),
        (Some(ends), false) => (
            "Free trial",
            format!(
                "Your trial ends on {ends}. You will receive a bill with a pay link when the trial ends."
            ),
        ),
        (None, false) => (
            "Subscription",
            "You will receive a bill with a pay link for each billing period.".to_owned(),
        ),
    };
    body.push_str(&format!(
        "<div class=card id=trial-state><h1>{}</h1><p id=trial-ends>{}</p></div>",
        esc(title),
        esc(&message)
    ));
    layout(title, &view.merchant, view.sandbox, &body, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn the_policy_allows_each_inline_script_and_style_by_hash_only() {
        let csp = csp();
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        for text in SCRIPTS.iter().chain([&CSS]) {
            assert!(csp.contains(&hash_source(text)), "{text}");
        }
        // The known digest of an empty text, so the encoding is CSP's.
        assert_eq!(
            hash_source(""),
            "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
        );
    }

    #[test]
    fn a_trial_page_shows_the_plan_the_amount_and_the_end_in_ad_and_bs() {
        use shared::domain::short_links::TrialView;
        let view = TrialView {
            merchant: "Asan <Bazaar>".into(),
            sandbox: true,
            plan: "Fibre & TV".into(),
            amount: 150_000,
            currency: shared::money::Currency::Npr,
            trial_ends_on: chrono::NaiveDate::from_ymd_opt(2024, 7, 30),
            trial_ends_bs: Some("2081 Shrawan 15".into()),
            ended: false,
        };
        let page = trial_page(&view);
        assert!(page.contains("Asan &lt;Bazaar&gt;"), "{page}");
        assert!(page.contains("Fibre &amp; TV"), "{page}");
        assert!(page.contains("1,500.00"), "{page}");
        assert!(page.contains("2024-07-30 (2081 Shrawan 15 BS)"), "{page}");
        assert!(page.contains("receive a bill with a pay link when the trial ends"));
        assert!(!page.contains("<script"), "no script");
        let ended = trial_page(&TrialView {
            ended: true,
            ..view
        });
        assert!(ended.contains("has ended"), "{ended}");
        assert!(!ended.contains("trial ends on"), "{ended}");
    }

    #[test]
    fn the_hand_off_form_escapes_its_fields() {
        let page = auto_post(
            "Shop",
            true,
            "https://e.example/form",
            &[("signature".into(), "a\"b<c".into())],
        );
        assert!(page.contains("value=\"a&quot;b&lt;c\""));
        assert!(page.contains("action=\"https://e.example/form\""));
    }
}
