//! The dashboard as a browser without JavaScript drives it: a cookie jar,
//! no redirect followed by itself, forms posted url-encoded. Shared by the
//! dashboard's end-to-end modules (sign-in, roles, invitations, pages).

use std::collections::HashMap;
use std::time::Duration;

use crate::browser::{form_encode, tags};

/// A browser with a cookie jar that follows no redirect by itself.
pub struct Dash {
    http: reqwest::Client,
    base: String,
    /// Its cookies, by name.
    pub jar: HashMap<String, String>,
    /// The `Set-Cookie` headers of the last answer.
    pub set_cookies: Vec<String>,
}

/// One answer, read whole.
pub struct Reply {
    pub status: u16,
    /// The `Location` header, or empty.
    pub location: String,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Reply {
    /// For an assertion's message: the status, where it points and the
    /// start of the body.
    pub fn show(&self) -> String {
        let body: String = self.body.chars().take(800).collect();
        format!("HTTP {} -> {:?}: {body}", self.status, self.location)
    }
}

impl Dash {
    /// A browser at `base` from the default loopback address.
    pub fn new(base: &str) -> Dash {
        Self::build(base, reqwest::Client::builder())
    }

    /// A browser at `base` whose requests come from `ip` (a loopback
    /// address: each counts as its own client).
    pub fn at(base: &str, ip: [u8; 4]) -> Dash {
        let builder = reqwest::Client::builder().local_address(std::net::IpAddr::from(ip));
        Self::build(base, builder)
    }

    fn build(base: &str, builder: reqwest::ClientBuilder) -> Dash {
        let http = builder
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap_or_else(|e| panic!("client: {e}"));
        Dash {
            http,
            base: base.to_owned(),
            jar: HashMap::new(),
            set_cookies: Vec::new(),
        }
    }

    /// Sends `req` with the jar's cookies and keeps what the answer sets.
    pub async fn send(&mut self, req: reqwest::RequestBuilder) -> Reply {
        let cookies: Vec<String> = self.jar.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let req = if cookies.is_empty() {
            req
        } else {
            req.header("cookie", cookies.join("; "))
        };
        let res = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}"));
        self.set_cookies.clear();
        for v in res.headers().get_all("set-cookie") {
            let line = v.to_str().unwrap_or("").to_owned();
            if let Some((name, rest)) = line.split(';').next().and_then(|p| p.split_once('=')) {
                if line.contains("Max-Age=0") || rest.is_empty() {
                    self.jar.remove(name);
                } else {
                    self.jar.insert(name.to_owned(), rest.to_owned());
                }
            }
            self.set_cookies.push(line);
        }
        Reply {
            status: res.status().as_u16(),
            location: res
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned(),
            headers: res.headers().clone(),
            body: res.text().await.unwrap_or_default(),
        }
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        let req = self.http.get(format!("{}{path}", self.base));
        self.send(req).await
    }

    /// Posts `fields` as a form.
    pub async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Reply {
        let fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_encode(&fields));
        self.send(req).await
    }

    /// The CSRF token of the page at `path` (fetching a page sets its
    /// cookie).
    pub async fn csrf_of(&mut self, path: &str) -> String {
        let page = self.get(path).await;
        assert_eq!(page.status, 200, "{}", page.show());
        field(&page.body, "csrf")
    }

    /// The sign-in form's token.
    pub async fn form_token(&mut self) -> String {
        self.csrf_of("/dashboard/sign-in").await
    }

    /// Signs in; answers the sign-in form's answer (a redirect when it
    /// worked).
    pub async fn sign_in(&mut self, email: &str, password: &str) -> Reply {
        let token = self.form_token().await;
        self.post(
            "/dashboard/sign-in",
            &[("email", email), ("password", password), ("csrf", &token)],
        )
        .await
    }

    /// Switches the session to `mode` of `project`.
    pub async fn switch(&mut self, project: &str, mode: &str) {
        let token = self.csrf_of("/dashboard").await;
        let r = self
            .post(
                "/dashboard/view",
                &[("csrf", &token), ("project", project), ("mode", mode)],
            )
            .await;
        assert_eq!(r.status, 303, "{}", r.show());
    }
}

/// The value of the first input named `name` on a page.
pub fn field(body: &str, name: &str) -> String {
    tags(body, "input")
        .into_iter()
        .find(|t| t.get("name") == Some(name))
        .and_then(|t| t.get("value").map(str::to_owned))
        .unwrap_or_else(|| panic!("no {name} field in {body}"))
}
