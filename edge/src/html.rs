//! HTML escaping and the headers of the pages we serve (hosted checkout,
//! the demo counter, simulators).

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

/// An HTML page with `status`.
pub fn html(status: StatusCode, page: String) -> Response {
    let mut res = (status, page).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    res
}

/// A page's own answer, as every page we serve sends it: in its own shape
/// (the edge leaves it out of the API's error envelope), never cached,
/// never framed, sniffed as nothing but its type, no referrer to other
/// sites, and held to `csp`.
pub fn page_answer(mut res: Response, csp: &'static str) -> Response {
    res.extensions_mut().insert(crate::error::Enveloped);
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    res
}

/// Escapes text for HTML content and double- or single-quoted attribute
/// values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(
            super::esc("<a href=\"x\">&'ü"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;ü"
        );
    }
}
