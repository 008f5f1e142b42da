//! The API reference, offline. `GET /openapi.json` answers the OpenAPI
//! document, readable from any origin (client generators, Postman);
//! `GET /docs` is a page that renders it with Swagger UI. Swagger UI's
//! files are vendored under `assets/` (`assets/VENDORED.md` names the
//! package, version and digests; `vendor.sh` refreshes them) and embedded
//! in the binary, served from `/docs/assets/{file}` out of a fixed list:
//! a Lambda has no filesystem to read them from, and no request path ever
//! becomes a file path. The page loads nothing from another origin and
//! runs no inline script; its Content-Security-Policy holds it to that.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::map_response;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// What the browser may do on the page: scripts and stylesheets from this
/// origin only (inline styles allowed: Swagger UI's React sets them),
/// images also as `data:` URLs (the stylesheet's icons), requests only to
/// this origin (the document; "Try it out" against this gateway), never
/// framed, no `<base>`, no form posts.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
     font-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The document and the page may change with a deployment: five minutes.
const SHORT_CACHE: &str = "public, max-age=300";
/// Swagger UI's files change only with a refresh of `assets/`: a day.
const ASSET_CACHE: &str = "public, max-age=86400";

const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// The page at `/docs`: Swagger UI's stylesheet and bundle, then our
/// `init.js`, which starts it on `/openapi.json`.
const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Dhukuti API reference</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
<noscript><p>The API reference needs JavaScript. The OpenAPI document itself is at <a href="/openapi.json">/openapi.json</a>.</p></noscript>
<div id="ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/assets/init.js"></script>
</body>
</html>
"#;

/// Every file under `/docs/assets/`: (name, content type, bytes). A name
/// not listed here is a 404, whatever else the path holds.
static ASSETS: [(&str, &str, &str); 4] = [
    (
        "swagger-ui-bundle.js",
        JAVASCRIPT,
        include_str!("../assets/swagger-ui-bundle.js"),
    ),
    (
        "swagger-ui.css",
        "text/css; charset=utf-8",
        include_str!("../assets/swagger-ui.css"),
    ),
    ("init.js", JAVASCRIPT, include_str!("../assets/init.js")),
    (
        "LICENSE",
        "text/plain; charset=utf-8",
        include_str!("../assets/LICENSE"),
    ),
];

/// `GET` (and `HEAD`) `/openapi.json`, `/docs` and `/docs/assets/{file}`;
/// `openapi_json` is answered byte for byte.
pub fn router(openapi_json: Arc<str>) -> Router {
    // One copy now; each answer then shares it.
    let document = Bytes::copy_from_slice(openapi_json.as_bytes());
    Router::new()
        .route(
            "/openapi.json",
            get(move || {
                let document = document.clone();
                async move { openapi(document) }
            }),
        )
        .route("/docs", get(page))
        .route("/docs/assets/{file}", get(asset))
        .layer(map_response(secure))
}

fn openapi(document: Bytes) -> Response {
    let mut res = Body::from(document).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(SHORT_CACHE));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    res
}

async fn page() -> Response {
    let mut res = PAGE.into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(SHORT_CACHE));
    res
}

async fn asset(Path(file): Path<String>) -> Response {
    let found = ASSETS.iter().find(|(name, ..)| *name == file);
    let Some(&(_, content_type, text)) = found else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut res = Body::from(text.as_bytes()).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(ASSET_CACHE));
    res
}

/// Every answer of this router: sniffed as nothing but its content type,
/// never framed, no referrer to other sites, and the page's policy.
async fn secure(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::http::{HeaderMap, Method, Request};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    /// Not ASCII, odd spacing, no trailing newline: must come back as is.
    const DOC: &str = "{\"openapi\":\"3.1.0\",\n  \"info\":{\"title\":\"Dhukuti API \u{2014} \u{0928}\u{0947}\u{092a}\u{093e}\u{0932}\",\"version\":\"1\"},\"paths\":{ }}";

    struct Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    }

    impl Answer {
        fn header(&self, name: &str) -> &str {
            self.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        }

        fn text(&self) -> &str {
            std::str::from_utf8(&self.body).unwrap()
        }

        /// The headers every answer of the router carries.
        fn assert_secure(&self, what: &str) {
            assert_eq!(
                self.header("content-security-policy"),
                "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                 img-src 'self' data:; connect-src 'self'; font-src 'self'; \
                 frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
                "{what}"
            );
            assert_eq!(self.header("x-content-type-options"), "nosniff", "{what}");
            assert_eq!(self.header("referrer-policy"), "same-origin", "{what}");
            assert_eq!(self.header("x-frame-options"), "DENY", "{what}");
        }
    }

    async fn call(method: Method, uri: &str) -> Answer {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap();
        let res = router(Arc::from(DOC)).oneshot(req).await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn fetch(uri: &str) -> Answer {
        call(Method::GET, uri).await
    }

    /// The values of every `name="..."` attribute in `html`.
    fn attribute_values<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
        let open = format!(" {name}=\"");
        html.match_indices(&open)
            .map(|(i, m)| {
                let rest = &html[i + m.len()..];
                &rest[..rest.find('"').unwrap()]
            })
            .collect()
    }

    #[tokio::test]
    async fn the_document_is_passed_through_unchanged() {
        let a = fetch("/openapi.json").await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body.as_ref(), DOC.as_bytes());
        assert_eq!(a.header("content-type"), "application/json");
        assert_eq!(a.header("cache-control"), "public, max-age=300");
        assert_eq!(a.header("access-control-allow-origin"), "*");
        assert_eq!(a.header("content-length"), DOC.len().to_string());
        a.assert_secure("/openapi.json");
    }

    #[tokio::test]
    async fn head_answers_the_headers_without_a_body() {
        let a = call(Method::HEAD, "/openapi.json").await;
        assert_eq!(a.status, StatusCode::OK);
        assert!(a.body.is_empty());
        assert_eq!(a.header("content-type"), "application/json");
        assert_eq!(a.header("content-length"), DOC.len().to_string());
        assert_eq!(a.header("access-control-allow-origin"), "*");
        a.assert_secure("HEAD /openapi.json");
        for (uri, content_type) in [
            ("/docs", "text/html; charset=utf-8"),
            ("/docs/assets/swagger-ui.css", "text/css; charset=utf-8"),
        ] {
            let a = call(Method::HEAD, uri).await;
            assert_eq!(a.status, StatusCode::OK, "HEAD {uri}");
            assert!(a.body.is_empty(), "HEAD {uri}");
            assert_eq!(a.header("content-type"), content_type, "HEAD {uri}");
            a.assert_secure(uri);
        }
    }

    #[tokio::test]
    async fn the_page_is_html_with_the_security_headers() {
        let a = fetch("/docs").await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.header("content-type"), "text/html; charset=utf-8");
        assert_eq!(a.header("cache-control"), "public, max-age=300");
        assert_eq!(a.header("access-control-allow-origin"), "");
        a.assert_secure("/docs");
        assert!(a.text().contains("<div id=\"ui\"></div>"), "{}", a.text());
    }

    #[tokio::test]
    async fn the_page_runs_no_inline_script_and_loads_only_our_files() {
        let page = fetch("/docs").await;
        let html = page.text();
        // Every <script> has a src and nothing between its tags.
        let scripts: Vec<&str> = html
            .match_indices("<script")
            .map(|(i, _)| &html[i..])
            .collect();
        assert_eq!(scripts.len(), 2, "{html}");
        for s in &scripts {
            let tag = &s[..s.find('>').unwrap() + 1];
            assert!(tag.contains(" src=\"/docs/assets/"), "{tag}");
            assert!(
                s[tag.len()..].starts_with("</script>"),
                "inline script: {s}"
            );
        }
        assert_eq!(html.matches("</script>").count(), 2, "{html}");
        // No inline event handler, and nothing that runs, embeds, frames
        // or points to another host.
        for tag in html.split('<').skip(1) {
            let tag = &tag[..tag.find('>').unwrap()];
            for attr in tag.split_whitespace().skip(1) {
                assert!(!attr.starts_with("on"), "an inline handler: <{tag}>");
            }
        }
        for banned in [
            "javascript:",
            "<style",
            "<base",
            "<iframe",
            "<object",
            "<embed",
            "//",
        ] {
            assert!(!html.contains(banned), "the page holds {banned:?}: {html}");
        }
        // Every reference is one of ours, and each of them answers.
        let mut refs = attribute_values(html, "src");
        refs.extend(attribute_values(html, "href"));
        assert_eq!(refs.len(), 4, "{refs:?}");
        assert_eq!(
            html.matches("src=").count() + html.matches("href=").count(),
            4,
            "an attribute the count above missed: {html}"
        );
        for r in refs {
            assert!(
                r == "/openapi.json" || r.starts_with("/docs/assets/"),
                "the page references {r}"
            );
            assert_eq!(fetch(r).await.status, StatusCode::OK, "{r}");
        }
        for wanted in [
            "/docs/assets/swagger-ui.css",
            "/docs/assets/swagger-ui-bundle.js",
            "/docs/assets/init.js",
        ] {
            assert!(html.contains(&format!("\"{wanted}\"")), "{wanted}: {html}");
        }
    }

    #[tokio::test]
    async fn init_starts_swagger_ui_on_our_document_with_the_validator_off() {
        let a = fetch("/docs/assets/init.js").await;
        let js = a.text();
        for wanted in [
            "SwaggerUIBundle({",
            "url: \"/openapi.json\",",
            "dom_id: \"#ui\",",
            "deepLinking: true,",
            "tryItOutEnabled: false,",
            "validatorUrl: null,",
        ] {
            assert!(js.contains(wanted), "init.js lacks {wanted:?}: {js}");
        }
        for banned in ["http:", "https:", "configUrl", "queryConfigEnabled"] {
            assert!(!js.contains(banned), "init.js holds {banned:?}: {js}");
        }
    }

    #[tokio::test]
    async fn each_asset_answers_with_its_type_and_a_day_of_cache() {
        for (uri, content_type) in [
            ("/docs/assets/swagger-ui-bundle.js", JAVASCRIPT),
            ("/docs/assets/swagger-ui.css", "text/css; charset=utf-8"),
            ("/docs/assets/init.js", JAVASCRIPT),
            ("/docs/assets/LICENSE", "text/plain; charset=utf-8"),
        ] {
            let a = fetch(uri).await;
            assert_eq!(a.status, StatusCode::OK, "{uri}");
            assert_eq!(a.header("content-type"), content_type, "{uri}");
            assert_eq!(a.header("cache-control"), "public, max-age=86400", "{uri}");
            assert_eq!(a.header("access-control-allow-origin"), "", "{uri}");
            assert_eq!(a.header("content-length"), a.body.len().to_string());
            a.assert_secure(uri);
            assert!(!a.body.is_empty(), "{uri}");
            // No source map to ask for (none is served).
            assert!(!a.text().contains("# sourceMappingURL="), "{uri}");
        }
        assert!(
            fetch("/docs/assets/LICENSE")
                .await
                .text()
                .contains("Apache License")
        );
        let bundle = fetch("/docs/assets/swagger-ui-bundle.js").await;
        assert!(bundle.text().contains("SwaggerUIBundle"));
    }

    #[test]
    fn the_embedded_files_are_the_ones_vendored_md_names() {
        use sha2::{Digest, Sha256};
        let md = include_str!("../assets/VENDORED.md");
        for (name, _, text) in ASSETS.iter().filter(|(n, ..)| *n != "init.js") {
            let row = md
                .lines()
                .find(|l| l.starts_with(&format!("| `{name}` |")))
                .unwrap_or_else(|| panic!("VENDORED.md has no row for {name}"));
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert_eq!(cells[2], text.len().to_string(), "{name}: size");
            let digest: String = Sha256::digest(text.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(cells[3], format!("`{digest}`"), "{name}: sha256");
        }
        assert!(md.contains("`swagger-ui-dist`"), "{md}");
    }

    #[tokio::test]
    async fn nothing_else_is_served() {
        for uri in [
            "/docs/assets/nope.js",
            "/docs/assets/VENDORED.md",
            "/docs/assets/swagger-ui.css.map",
            "/docs/assets/swagger-ui-bundle.js.LICENSE.txt",
            "/docs/assets/index.html",
            "/docs/assets/SWAGGER-UI.CSS",
            "/docs/assets/swagger-ui.css%00",
            "/docs/assets/swagger-ui.css/",
            "/docs/assets/",
            "/docs/assets",
            "/docs/",
            "/docs/assets/..",
            "/docs/assets/../../Cargo.toml",
            "/docs/assets/..%2F..%2FCargo.toml",
            "/docs/assets/%2e%2e%2f%2e%2e%2fsrc%2flib.rs",
            "/docs/assets/..%5c..%5cCargo.toml",
            "/docs/assets/%2e%2e",
            "/docs/assets/./init.js",
            "/docs/assets//init.js",
            "/docs/assets/init.js/..",
            "/docs/assets/lib.rs",
            "/docs/../Cargo.toml",
            "/openapi.yaml",
        ] {
            let a = fetch(uri).await;
            assert_eq!(a.status, StatusCode::NOT_FOUND, "{uri}");
            assert!(!a.text().contains("SwaggerUIBundle"), "{uri}");
        }
    }

    #[tokio::test]
    async fn only_get_and_head_are_answered() {
        for uri in ["/openapi.json", "/docs", "/docs/assets/init.js"] {
            let a = call(Method::POST, uri).await;
            assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "POST {uri}");
        }
    }
}
