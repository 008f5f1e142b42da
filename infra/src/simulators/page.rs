//! The simulators' HTML: one mobile-friendly layout, plain HTML and inline
//! CSS, no JavaScript and no external assets. Every button is a plain
//! form POST.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

pub(crate) use edge::html::esc;

/// Percent-encodes one path segment.
pub(crate) fn path_seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whose page it is (the accent colour and the name in the header).
#[derive(Clone, Copy)]
pub(crate) enum Brand {
    Esewa,
    Khalti,
    Fonepay,
    Neutral,
}

impl Brand {
    fn name(self) -> &'static str {
        match self {
            Brand::Esewa => "eSewa",
            Brand::Khalti => "Khalti",
            Brand::Fonepay => "Fonepay",
            Brand::Neutral => "Dhukuti",
        }
    }

    fn colour(self) -> &'static str {
        match self {
            Brand::Esewa => "#41a124",
            Brand::Khalti => "#5c2d91",
            Brand::Fonepay => "#c8102e",
            Brand::Neutral => "#1f4e79",
        }
    }
}

const CSS: &str = "\
*{box-sizing:border-box}\
body{margin:0;font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;background:#f3f4f6;color:#111827;line-height:1.45}\
header{background:var(--brand);color:#fff;padding:.8rem 1rem;font-weight:700;font-size:1.1rem}\
header small{font-weight:400;opacity:.85;margin-left:.5rem;font-size:.8rem}\
main{max-width:34rem;margin:0 auto;padding:1rem}\
.card{background:#fff;border-radius:.75rem;padding:1rem;box-shadow:0 1px 3px rgba(0,0,0,.12);margin-bottom:1rem}\
h1{font-size:1.3rem;margin:.2rem 0 .6rem}h2{font-size:1.05rem;margin:1rem 0 .4rem}\
.amount{font-size:2rem;font-weight:700;margin:.3rem 0}\
dl{display:grid;grid-template-columns:auto 1fr;gap:.25rem .75rem;margin:.5rem 0}dt{color:#6b7280}dd{margin:0;word-break:break-all}\
.muted{color:#6b7280;font-size:.9rem}\
.status{display:inline-block;padding:.15rem .55rem;border-radius:1rem;background:#e5e7eb;font-weight:600;font-size:.85rem}\
form{margin:0}\
label{display:block;margin:.5rem 0 .2rem;color:#374151;font-size:.9rem}\
input,select{width:100%;padding:.6rem;border:1px solid #d1d5db;border-radius:.5rem;font-size:1rem}\
.actions{display:flex;flex-direction:column;gap:.5rem;margin-top:1rem}\
button{width:100%;padding:.85rem;border:0;border-radius:.5rem;font-size:1.05rem;font-weight:600;cursor:pointer}\
.pay{background:var(--brand);color:#fff}.fail{background:#fee2e2;color:#991b1b}.cancel{background:#e5e7eb;color:#111827}.neutral{background:#dbeafe;color:#1e3a8a}\
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85rem;overflow-wrap:anywhere}\
pre{white-space:pre-wrap;word-break:break-all;background:#f9fafb;padding:.6rem;border-radius:.5rem;border:1px solid #e5e7eb}\
.qr{text-align:center}.qr svg{width:100%;max-width:16rem;height:auto}\
table{width:100%;border-collapse:collapse;font-size:.9rem}td,th{text-align:left;padding:.35rem;border-bottom:1px solid #e5e7eb}\
a{color:var(--brand)}";

/// A whole page.
pub(crate) fn layout(title: &str, brand: Brand, body: &str) -> String {
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content=\"width=device-width,initial-scale=1\">\
         <title>{title} · {name} simulator</title><style>:root{{--brand:{colour}}}{CSS}</style></head>\
         <body><header>{name}<small>simulator · no real money</small></header><main>{body}</main></body></html>",
        title = esc(title),
        name = brand.name(),
        colour = brand.colour(),
    )
}

/// An HTML response.
pub(crate) fn html(status: StatusCode, page: String) -> Response {
    let mut resp = (status, page).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// An error page.
pub(crate) fn error_page(status: StatusCode, brand: Brand, message: &str) -> Response {
    html(
        status,
        layout(
            "Error",
            brand,
            &format!(
                "<div class=card><h1>Request rejected</h1><p>{}</p></div>",
                esc(message)
            ),
        ),
    )
}

/// A submit button carrying `action`.
pub(crate) fn button(action: &str, label: &str, class: &str) -> String {
    format!(
        "<button type=submit name=action value=\"{}\" class={}>{}</button>",
        esc(action),
        class,
        esc(label)
    )
}

/// A redirect with the given status (302 Found, 303 See Other).
pub(crate) fn redirect(status: StatusCode, location: &str) -> Response {
    match HeaderValue::from_str(location) {
        Ok(v) => {
            let mut resp = status.into_response();
            resp.headers_mut().insert(header::LOCATION, v);
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            resp
        }
        Err(_) => error_page(
            StatusCode::BAD_REQUEST,
            Brand::Neutral,
            "the redirect target is not a valid URL",
        ),
    }
}

/// The page shown when an attempt is already decided, with a link back to
/// the merchant when there is one.
pub(crate) fn decided(brand: Brand, reference: &str, status: &str, back: Option<&str>) -> String {
    let link = back
        .map(|u| format!("<p><a href=\"{}\">Return to the merchant</a></p>", esc(u)))
        .unwrap_or_default();
    layout(
        "Payment",
        brand,
        &format!(
            "<div class=card><h1>Payment {}</h1><p>Status: <span class=status>{}</span></p>{link}</div>",
            esc(reference),
            esc(status)
        ),
    )
}
