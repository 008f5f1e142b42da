//! The customer's side of the hosted pages: HTML, forms, URLs and base64
//! read with plain string functions, and an HTTP client playing a browser
//! without JavaScript that follows no redirect by itself.

use std::time::Duration;

use serde_json::Value;

/// HTML text back to plain text.
pub fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// One start tag's attributes (`a=b c="d" e`), values unescaped.
pub fn attributes(tag: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = tag.trim_start();
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| c == '=' || c == '/' || c.is_whitespace())
            .unwrap_or(rest.len());
        let name = rest[..end].to_ascii_lowercase();
        let after_name = rest[end..].trim_start();
        let mut value = "";
        rest = after_name;
        if let Some(v) = after_name.strip_prefix('=') {
            let v = v.trim_start();
            if let Some(q) = v.strip_prefix('"').or_else(|| v.strip_prefix('\'')) {
                let quote = &v[..1];
                let close = q.find(quote).unwrap_or(q.len());
                value = &q[..close];
                rest = q.get(close + 1..).unwrap_or("");
            } else {
                let close = v.find(char::is_whitespace).unwrap_or(v.len());
                value = &v[..close];
                rest = &v[close..];
            }
        }
        if !name.is_empty() {
            out.push((name, unescape(value)));
        }
        rest = rest.trim_start_matches(|c: char| c == '/' || c.is_whitespace());
    }
    out
}

/// A start tag: where it ends in the page, and its attributes.
pub struct Tag {
    pub end: usize,
    pub attrs: Vec<(String, String)>,
}

impl Tag {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every `<name ...>` start tag of `html`, in order.
pub fn tags(html: &str, name: &str) -> Vec<Tag> {
    let open = format!("<{name}");
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = html[from..].find(&open) {
        let start = from + i + open.len();
        let Some(close) = html[start..].find('>') else {
            break;
        };
        let inner = &html[start..start + close];
        if inner.is_empty() || inner.starts_with(char::is_whitespace) {
            out.push(Tag {
                end: start + close + 1,
                attrs: attributes(inner),
            });
        }
        from = start;
    }
    out
}

/// A form of a page: where it posts and its hidden fields.
#[derive(Clone, Debug)]
pub struct Form {
    pub action: String,
    pub hidden: Vec<(String, String)>,
}

/// The first form of `html` with `id` (any form when `None`).
pub fn form(html: &str, id: Option<&str>) -> Option<Form> {
    let tag = tags(html, "form")
        .into_iter()
        .find(|t| id.is_none() || t.get("id") == id)?;
    let rest = &html[tag.end..];
    let body = &rest[..rest.find("</form>").unwrap_or(rest.len())];
    let hidden = tags(body, "input")
        .into_iter()
        .filter(|t| t.get("type") == Some("hidden"))
        .map(|t| {
            (
                t.get("name").unwrap_or_default().to_owned(),
                t.get("value").unwrap_or_default().to_owned(),
            )
        })
        .collect();
    Some(Form {
        action: tag.get("action").unwrap_or_default().to_owned(),
        hidden,
    })
}

/// The values of the radios named `name`, in page order.
pub fn radios(html: &str, name: &str) -> Vec<String> {
    tags(html, "input")
        .into_iter()
        .filter(|t| t.get("type") == Some("radio") && t.get("name") == Some(name))
        .map(|t| t.get("value").unwrap_or_default().to_owned())
        .collect()
}

/// `u` parsed (panics when it is not a URL).
pub fn url(u: &str) -> reqwest::Url {
    match reqwest::Url::parse(u) {
        Ok(u) => u,
        Err(e) => panic!("not a URL ({e}): {u}"),
    }
}

/// Form-encodes `fields` (as a browser does).
pub fn form_encode(fields: &[(String, String)]) -> String {
    let mut u = url("http://form.invalid/");
    u.query_pairs_mut()
        .extend_pairs(fields.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    u.query().unwrap_or_default().to_owned()
}

/// The first value of query parameter `name` of `u`.
pub fn query_param(u: &str, name: &str) -> Option<String> {
    url(u)
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// `u` with its query replaced by `params`.
pub fn with_query(u: &str, params: &[(&str, &str)]) -> String {
    let mut u = url(u);
    u.set_query(None);
    u.query_pairs_mut().extend_pairs(params.iter().copied());
    u.to_string()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 back to bytes (panics on a character outside it).
pub fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes().filter(|c| *c != b'=') {
        let Some(v) = B64.iter().position(|b| *b == c) else {
            panic!("not base64: {text}")
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The customer's browser

/// An HTTP client that behaves like a browser without JavaScript and
/// follows no redirect by itself.
pub struct Browser {
    pub http: reqwest::Client,
    pub base: String,
}

/// One answer as the browser sees it.
pub struct Page {
    pub status: u16,
    /// `Location`, made absolute.
    pub location: Option<String>,
    pub body: String,
}

impl Page {
    /// A short view for assertion messages: the status, the location and
    /// the page's `<main>`.
    pub fn show(&self) -> String {
        let main = match (self.body.find("<main>"), self.body.find("</main>")) {
            (Some(a), Some(b)) if a < b => &self.body[a..b],
            _ => self.body.as_str(),
        };
        let main: String = main.chars().take(700).collect();
        format!("HTTP {} location {:?}: {main}", self.status, self.location)
    }

    /// Asserts a redirect with `status` and answers where it goes.
    pub fn redirect(&self, status: u16) -> String {
        assert_eq!(self.status, status, "expected a {status}: {}", self.show());
        match &self.location {
            Some(l) => l.clone(),
            None => panic!("a redirect without Location: {}", self.show()),
        }
    }

    pub fn has(&self, text: &str) -> bool {
        self.body.contains(text)
    }
}

impl Browser {
    pub fn new(base: &str) -> Browser {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(30))
            .build();
        match http {
            Ok(http) => Browser {
                http,
                base: base.to_owned(),
            },
            Err(e) => panic!("client: {e}"),
        }
    }

    pub fn absolute(&self, u: &str) -> String {
        if u.starts_with('/') {
            format!("{}{u}", self.base)
        } else {
            u.to_owned()
        }
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Page {
        let res = match req.send().await {
            Ok(r) => r,
            Err(e) => panic!("request failed: {e}"),
        };
        let status = res.status().as_u16();
        let location = res
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(|l| self.absolute(l));
        let body = res.text().await.unwrap_or_default();
        Page {
            status,
            location,
            body,
        }
    }

    pub async fn get(&self, u: &str) -> Page {
        self.send(self.http.get(self.absolute(u))).await
    }

    pub async fn post_form(&self, u: &str, fields: &[(String, String)]) -> Page {
        let req = self
            .http
            .post(self.absolute(u))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_encode(fields));
        self.send(req).await
    }
}

/// Form fields from string pairs.
pub fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A JSON string's text (empty when not a string).
pub fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}
