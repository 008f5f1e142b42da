//! The end-to-end suite: one test binary, a module per capability. Every
//! module drives the gateway the way a merchant, a customer's browser, a
//! provider or an attacker does, through the one app builder in
//! `tests/support` (`spawn_app`, `on_both_backends!`), on the embedded
//! store and on DynamoDB/SQS/S3 (moto). One binary links the workspace
//! once instead of fifteen times (see `BENCHMARKS.md`).
//!
//! Run one module: `bash infra/test.sh -p dhukuti-tests --test e2e links::`.

mod analytics;
mod api;
mod billing;
mod billing_changes;
mod billing_clocks;
mod billing_coupons;
mod billing_dashboard;
mod billing_deep;
mod billing_invoices;
mod billing_invoices_narrowed;
mod billing_notices;
mod billing_subscriptions;
mod billing_taxcredit;
mod billing_timelines;
mod billing_upcoming;
mod billing_usage;
mod billing_walk;
mod browser;
mod checkout;
mod contract;
mod counter_page;
mod dashboard;
mod dashboard_browser;
mod dashboard_exports;
mod dashboard_host;
mod dashboard_invites;
mod dashboard_members;
mod dashboard_reconciliation;
mod dashboard_roles;
mod dashboard_signin;
mod deep_lists;
mod deep_sessions_links;
mod docs_page;
mod dunning;
mod invoices;
mod lambda;
mod links;
mod lists;
mod logs;
mod mail;
mod mobile;
mod narrowed_invoices_subscriptions;
mod openapi;
mod page_policy;
mod pages;
mod pay;
mod qr;
mod ratelimit;
mod reconciliation;
mod reconciliation_sim;
mod refunds;
mod reports;
mod sam_local;
mod settlements;
mod short_links;
mod sms;
mod template;
mod webhooks;
mod workspace;
