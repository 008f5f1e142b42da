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

/// Which host of a split deployment a router's routes belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// The dashboard: its own host when `DashboardBaseUrl` is set.
    Dashboard,
    /// The hosted pages (checkout, links): every other host.
    Public,
}

/// With a dashboard host configured, a route asked for on the other
/// site's host is 404: the dashboard is not served beside the hosted
/// pages (their origin may not script it, nor their cookies reach it) and
/// the hosted pages are not served on the dashboard's origin. 404, not a
/// redirect: nothing on either host points at the other, and a form
/// posted to the wrong host is not replayed elsewhere. Without one, every
/// route is served on every host, as before.
pub fn off_site(
    config: &shared::app::Config,
    headers: &http::HeaderMap,
    site: Site,
) -> Option<Response> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let dashboard = config.on_dashboard_host(host)?;
    match (site, dashboard) {
        (Site::Dashboard, true) | (Site::Public, false) => None,
        _ => Some(html(
            StatusCode::NOT_FOUND,
            "<!doctype html><html lang=en><head><meta charset=utf-8><title>Not found</title></head>\
             <body><h1>Not found</h1><p>There is no such page here.</p></body></html>"
                .to_owned(),
        )),
    }
}

/// Middleware: the dashboard's routes only on its host ([`off_site`]).
pub async fn dashboard_site(
    axum::extract::State(state): axum::extract::State<shared::app::AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match off_site(&state.config, req.headers(), Site::Dashboard) {
        Some(refused) => refused,
        None => next.run(req).await,
    }
}

/// Middleware: the hosted pages' routes never on the dashboard's host
/// ([`off_site`]).
pub async fn public_site(
    axum::extract::State(state): axum::extract::State<shared::app::AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match off_site(&state.config, req.headers(), Site::Public) {
        Some(refused) => refused,
        None => next.run(req).await,
    }
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
