//! A shop for the browser-driven tests: one merchant on a running gateway,
//! its sandbox API key and one customer's browser, with the merchant's API
//! calls and the simulators' control API that those tests share.

use std::sync::atomic::AtomicI64;

use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::outbox::{self, Event};
use shared::domain::payments::Payment;
use shared::domain::record::from_item;

use crate::browser::{Browser, Form, Page, fields, form, text};
use crate::{Tenant, TestApp};

/// The merchant's pages (nothing listens there: the customer's browser is
/// only told to go there).
pub const RETURN_URL: &str = "http://127.0.0.1:9/thanks";
pub const CANCEL_URL: &str = "http://127.0.0.1:9/cancel";

/// How the customer pays through a browser hand-off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Esewa,
    Khalti,
    FonepayWeb,
}

pub struct Shop {
    pub app: TestApp,
    pub tenant: Tenant,
    pub key: String,
    pub browser: Browser,
    /// Sweeps made so far: each runs two minutes after the last, so every
    /// open payment is due again (the sweep checks a young payment at most
    /// once a minute) while sessions stay within their 30 minutes.
    pub sweeps: AtomicI64,
}

impl Shop {
    /// A new merchant with a sandbox key for every scope on `app`.
    pub async fn on(app: TestApp) -> Shop {
        let tenant = app.tenant("Asan Bazaar", "owner@asan.example").await;
        let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
        let browser = Browser::new(&app.base);
        Shop {
            app,
            tenant,
            key,
            browser,
            sweeps: AtomicI64::new(0),
        }
    }

    pub async fn stop(self) {
        self.app.stop().await;
    }

    pub fn sim(&self, path: &str) -> String {
        format!("{}/sim{path}", self.app.base)
    }

    // --- the merchant, through the API

    /// `POST /v1/checkout`: the new session as answered (201, `cs_` id).
    pub async fn create_checkout(&self, amount: i64) -> Value {
        let body = json!({"amount": amount, "returnUrl": RETURN_URL, "cancelUrl": CANCEL_URL});
        let a = self
            .app
            .post("/v1/checkout", Some(&self.key), None, &body)
            .await;
        assert_eq!(a.status, 201, "{}", a.body);
        let id = text(&a.body["id"]);
        assert!(id.starts_with("cs_"), "{}", a.body);
        a.body
    }

    pub async fn session(&self, id: &str) -> Value {
        let a = self
            .app
            .get(&format!("/v1/sessions/{id}"), Some(&self.key))
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        a.body
    }

    pub async fn payment(&self, id: &str) -> Value {
        let a = self
            .app
            .get(&format!("/v1/payments/{id}"), Some(&self.key))
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        a.body
    }

    /// The payment as stored (with the attempt's details).
    pub async fn stored(&self, id: &str) -> Payment {
        match self.app.store.get(&Payment::key(&id.into())).await {
            Ok(Some(item)) => match from_item(item) {
                Ok(p) => p,
                Err(e) => panic!("payment {id}: {e}"),
            },
            other => panic!("payment {id}: {other:?}"),
        }
    }

    /// Our reference at the provider (eSewa `transaction_uuid`, Khalti
    /// `purchase_order_id`, Fonepay `PRN`).
    pub async fn reference(&self, payment: &str) -> String {
        match self.stored(payment).await.attempt.reference {
            Some(r) => r,
            None => panic!("payment {payment} has no reference"),
        }
    }

    pub async fn events(&self) -> Vec<Event> {
        match outbox::recent(
            &*self.app.store,
            &shared::domain::Tenant::new(self.tenant.project.id.clone(), Mode::Sandbox),
            50,
        )
        .await
        {
            Ok(e) => e,
            Err(e) => panic!("events: {e}"),
        }
    }

    /// How many events of `kind` (e.g. `payment.succeeded`) name `id`.
    pub async fn events_about(&self, kind: &str, id: &str) -> usize {
        self.events()
            .await
            .iter()
            .filter(|e| serde_json::to_value(e.event_type).ok() == Some(json!(kind)))
            .filter(|e| e.object["id"] == id)
            .count()
    }

    // --- the simulators' control API

    /// `POST /sim/{provider}/_control/next`.
    pub async fn script(&self, provider: &str, body: Value) {
        let res = self
            .app
            .client
            .post(self.sim(&format!("/{provider}/_control/next")))
            .json(&body)
            .send()
            .await;
        match res {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => panic!(
                "control next {body}: HTTP {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ),
            Err(e) => panic!("control next: {e}"),
        }
    }

    // --- the customer, through the browser

    /// Picks `via` on the hosted page, follows the hand-off to the
    /// provider's page and answers its form (the one with the buttons).
    pub async fn to_wallet(&self, session: &str, via: Via) -> Form {
        let base = &self.app.base;
        let (wallet_url, wallet_prefix) = match via {
            Via::Esewa => {
                let page = self.choose(session, &[("provider", "esewa")]).await;
                assert_eq!(page.status, 200, "{}", page.show());
                let Some(handoff) = form(&page.body, Some("handoff")) else {
                    panic!("no hand-off form: {}", page.show())
                };
                let at = self
                    .browser
                    .post_form(&handoff.action, &handoff.hidden)
                    .await;
                (at.redirect(303), "/sim/esewa/wallet/")
            }
            Via::Khalti => {
                let page = self.choose(session, &[("provider", "khalti")]).await;
                (page.redirect(303), "/sim/khalti/pay")
            }
            Via::FonepayWeb => {
                let page = self
                    .choose(session, &[("provider", "fonepay"), ("fonepay", "web")])
                    .await;
                let to = page.redirect(303);
                assert!(
                    to.starts_with(&format!("{base}/sim/fonepay/api/merchantRequest?")),
                    "{to}"
                );
                (
                    self.browser.get(&to).await.redirect(303),
                    "/sim/fonepay/web/",
                )
            }
        };
        assert!(
            wallet_url.starts_with(&format!("{base}{wallet_prefix}")),
            "{wallet_url}"
        );
        let page = self.browser.get(&wallet_url).await;
        assert_eq!(page.status, 200, "{}", page.show());
        let Some(f) = form(&page.body, None) else {
            panic!("no form on the provider's page: {}", page.show())
        };
        f
    }

    /// A customer pays `amount` through `via`: the payment's id, paid
    /// (`success`).
    pub async fn paid(&self, via: Via, amount: i64) -> String {
        let s = text(&self.create_checkout(amount).await["id"]);
        let wallet = self.to_wallet(&s, via).await;
        let payment = text(&self.session(&s).await["paymentId"]);
        assert!(payment.starts_with("pay_"), "no attempt for {s}");
        let mut sent = wallet.hidden.clone();
        sent.push(("action".into(), "pay".into()));
        let callback = self
            .browser
            .post_form(&wallet.action, &sent)
            .await
            .redirect(302);
        assert!(
            callback.starts_with(&format!("{}/c/{s}/return/{payment}/ok", self.app.base)),
            "{callback}"
        );
        let back = self.browser.get(&callback).await;
        assert_eq!(
            back.redirect(303),
            format!("{RETURN_URL}?session_id={s}&status=success")
        );
        let p = self.payment(&payment).await;
        assert_eq!(p["status"], "success", "{p}");
        assert_eq!(p["amount"], amount, "{p}");
        assert_eq!(p["amountRefunded"], 0, "{p}");
        assert!(
            p["providerRef"].as_str().is_some_and(|r| !r.is_empty()),
            "{p}"
        );
        payment
    }

    /// `POST /c/{id}/pay` with the picker's fields.
    pub async fn choose(&self, session: &str, picked: &[(&str, &str)]) -> Page {
        self.browser
            .post_form(&format!("/c/{session}/pay"), &fields(picked))
            .await
    }
}
