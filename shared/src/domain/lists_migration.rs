//! Lists and counts a tenant's records from before the lists' counters,
//! then marks the tenant covered: `dhukuti-admin lists migrate`.
//! Idempotent and safe while traffic runs: one conditional transaction
//! per record (`listing::migrate` for payments and refunds,
//! `listing::counted::migrate` for the counted lists: sessions, links,
//! one-time invoices, webhook deliveries per endpoint, SMS reminders,
//! billing customers, subscriptions and invoices;
//! `listing::counted::migrate_narrowed` for their narrowings: billing
//! invoices by status, customer and subscription).

use super::Tenant;
use super::billing::customers::Customer;
use super::billing::invoice::BillingInvoice;
use super::billing::subscription::Subscription;
use super::checkout::CheckoutSession;
use super::invoices::Invoice;
use super::links::PaymentLink;
use super::listing::counted::{self, Counted, CountedKind, CountedList, Narrowing};
use super::listing::{self, ListsMarker, Migrated};
use super::payments::Payment;
use super::refunds::Refund;
use super::sms::SmsReminder;
use super::webhooks::{self, Delivery};
use crate::keys;
use crate::store::{Index, Query, Store, StoreError};

/// What one tenant's migration did, per list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantMigrated {
    pub payments: Migrated,
    pub refunds: Migrated,
    pub sessions: Migrated,
    pub links: Migrated,
    pub invoices: Migrated,
    pub deliveries: Migrated,
    pub sms: Migrated,
    pub customers: Migrated,
    pub subscriptions: Migrated,
    pub billing_invoices: Migrated,
    /// Billing invoices entered and counted by status, customer and
    /// subscription.
    pub billing_invoices_by_filter: Migrated,
}

/// Migrates `tenant`'s payments, refunds, then the counted lists.
pub async fn migrate(store: &dyn Store, tenant: &Tenant) -> Result<TenantMigrated, StoreError> {
    let by_id =
        |what| Query::partition(keys::per_mode(&tenant.project, tenant.mode, what)).on(Index::Gsi1);
    let payments =
        listing::migrate::<Payment>(store, tenant, by_id(keys::PerMode::Payments)).await?;
    let refunds = listing::migrate::<Refund>(store, tenant, by_id(keys::PerMode::Refunds)).await?;
    let sessions = counted_list::<CheckoutSession>(
        store,
        tenant,
        CountedKind::Sessions,
        vec![CheckoutSession::counted_list_of(tenant)],
    )
    .await?;
    let links = counted_list::<PaymentLink>(
        store,
        tenant,
        CountedKind::Links,
        vec![PaymentLink::counted_list_of(tenant)],
    )
    .await?;
    let invoices = counted_list::<Invoice>(
        store,
        tenant,
        CountedKind::Invoices,
        vec![Invoice::counted_list_of(tenant)],
    )
    .await?;
    let endpoints = webhooks::list_in(store, tenant).await?;
    let deliveries = counted_list::<Delivery>(
        store,
        tenant,
        CountedKind::Deliveries,
        endpoints
            .iter()
            .map(|e| Delivery::counted_list_of(tenant, &e.id))
            .collect(),
    )
    .await?;
    let sms = counted_list::<SmsReminder>(
        store,
        tenant,
        CountedKind::Sms,
        vec![SmsReminder::counted_list_of(tenant)],
    )
    .await?;
    let customers = counted_list::<Customer>(
        store,
        tenant,
        CountedKind::Customers,
        vec![Customer::counted_list_of(tenant)],
    )
    .await?;
    let subscriptions = counted_list::<Subscription>(
        store,
        tenant,
        CountedKind::Subscriptions,
        vec![Subscription::counted_list_of(tenant)],
    )
    .await?;
    let billing_invoices = counted_list::<BillingInvoice>(
        store,
        tenant,
        CountedKind::BillingInvoices,
        vec![BillingInvoice::counted_list_of(tenant)],
    )
    .await?;
    let billing_invoices_by_filter = counted::migrate_narrowed::<BillingInvoice>(
        store,
        BillingInvoice::counted_list_of(tenant).all(),
    )
    .await?;
    store
        .transact(vec![ListsMarker::mark_narrowing(
            tenant,
            Narrowing::BillingInvoicesByFilter,
        )])
        .await?;
    Ok(TenantMigrated {
        payments,
        refunds,
        sessions,
        links,
        invoices,
        deliveries,
        sms,
        customers,
        subscriptions,
        billing_invoices,
        billing_invoices_by_filter,
    })
}

/// Counts the records of `lists`, then marks `kind` covered for `tenant`.
async fn counted_list<R: Counted>(
    store: &dyn Store,
    tenant: &Tenant,
    kind: CountedKind,
    lists: Vec<CountedList>,
) -> Result<Migrated, StoreError> {
    let mut done = Migrated::default();
    for list in lists {
        let m = counted::migrate::<R>(store, list.all()).await?;
        done.listed += m.listed;
        done.already += m.already;
        done.retried += m.retried;
    }
    store
        .transact(vec![ListsMarker::mark_counted(tenant, kind)])
        .await?;
    Ok(done)
}
