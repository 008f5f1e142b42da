//! Lists and counts a tenant's records from before the lists' counters,
//! then marks the tenant covered: `dhukuti-admin lists migrate`.
//! Idempotent and safe while traffic runs: one conditional transaction
//! per record (`listing::migrate` for payments and refunds,
//! `listing::counted::migrate` for the counted lists: sessions, links,
//! one-time invoices, webhook deliveries per endpoint, SMS reminders,
//! billing customers, subscriptions and invoices, reports and
//! reconciliation runs; `listing::counted::migrate_narrowed` for their
//! narrowings: sessions by status, links by `active`, one-time invoices
//! by status, subscriptions by status, plan and customer, billing
//! invoices by status, customer and subscription).

use super::Tenant;
use super::billing::customers::Customer;
use super::billing::invoice::BillingInvoice;
use super::billing::subscription::Subscription;
use super::checkout::CheckoutSession;
use super::invoices::Invoice;
use super::links::PaymentLink;
use super::listing::counted::{self, Counted, CountedKind, CountedList, Narrowed, Narrowing};
use super::listing::{self, ListsMarker, Migrated};
use super::payments::Payment;
use super::reconciliation::runs::{Run, RunFilter};
use super::refunds::Refund;
use super::reports::Report;
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
    pub reports: Migrated,
    pub recon_runs: Migrated,
    /// Sessions entered in their narrowing by stored status.
    pub sessions_by_status: Migrated,
    /// Links entered in their narrowing by `active`.
    pub links_by_active: Migrated,
    /// One-time invoices entered in their narrowings by status.
    pub invoices_by_status: Migrated,
    /// Subscriptions entered in their narrowings by status, plan and
    /// customer.
    pub subscriptions_by_filter: Migrated,
    /// Billing invoices entered and counted by status, customer and
    /// subscription.
    pub billing_invoices_by_filter: Migrated,
}

/// Migrates `tenant`'s payments, refunds, then the counted lists and
/// their narrowings.
pub async fn migrate(store: &dyn Store, tenant: &Tenant) -> Result<TenantMigrated, StoreError> {
    let by_id =
        |what| Query::partition(keys::per_mode(&tenant.project, tenant.mode, what)).on(Index::Gsi1);
    let mut done = TenantMigrated {
        payments: listing::migrate::<Payment>(store, tenant, by_id(keys::PerMode::Payments))
            .await?,
        refunds: listing::migrate::<Refund>(store, tenant, by_id(keys::PerMode::Refunds)).await?,
        ..TenantMigrated::default()
    };
    counted_lists(store, tenant, &mut done).await?;
    narrowings(store, tenant, &mut done).await?;
    Ok(done)
}

/// The counted lists of [`migrate`].
async fn counted_lists(
    store: &dyn Store,
    tenant: &Tenant,
    done: &mut TenantMigrated,
) -> Result<(), StoreError> {
    use CountedKind as K;
    done.sessions = counted_list::<CheckoutSession>(
        store,
        tenant,
        K::Sessions,
        vec![CheckoutSession::counted_list_of(tenant)],
    )
    .await?;
    let links = vec![PaymentLink::counted_list_of(tenant)];
    done.links = counted_list::<PaymentLink>(store, tenant, K::Links, links).await?;
    let invoices = vec![Invoice::counted_list_of(tenant)];
    done.invoices = counted_list::<Invoice>(store, tenant, K::Invoices, invoices).await?;
    let deliveries = webhooks::list_in(store, tenant)
        .await?
        .iter()
        .map(|e| Delivery::counted_list_of(tenant, &e.id))
        .collect();
    done.deliveries = counted_list::<Delivery>(store, tenant, K::Deliveries, deliveries).await?;
    let sms = vec![SmsReminder::counted_list_of(tenant)];
    done.sms = counted_list::<SmsReminder>(store, tenant, K::Sms, sms).await?;
    let customers = vec![Customer::counted_list_of(tenant)];
    done.customers = counted_list::<Customer>(store, tenant, K::Customers, customers).await?;
    let subscriptions = vec![Subscription::counted_list_of(tenant)];
    done.subscriptions =
        counted_list::<Subscription>(store, tenant, K::Subscriptions, subscriptions).await?;
    let billing_invoices = vec![BillingInvoice::counted_list_of(tenant)];
    done.billing_invoices =
        counted_list::<BillingInvoice>(store, tenant, K::BillingInvoices, billing_invoices).await?;
    let reports = vec![Report::counted_list_of(tenant)];
    done.reports = counted_list::<Report>(store, tenant, K::Reports, reports).await?;
    let runs = vec![Run::counted_list_of(tenant, &RunFilter::default())];
    done.recon_runs = counted_list::<Run>(store, tenant, K::ReconRuns, runs).await?;
    Ok(())
}

/// The narrowings of [`migrate`].
async fn narrowings(
    store: &dyn Store,
    tenant: &Tenant,
    done: &mut TenantMigrated,
) -> Result<(), StoreError> {
    use Narrowing as N;
    let sessions = CheckoutSession::counted_list_of(tenant);
    done.sessions_by_status =
        narrowed::<CheckoutSession>(store, tenant, N::SessionsByStatus, sessions).await?;
    let links = PaymentLink::counted_list_of(tenant);
    done.links_by_active = narrowed::<PaymentLink>(store, tenant, N::LinksByActive, links).await?;
    let invoices = Invoice::counted_list_of(tenant);
    done.invoices_by_status =
        narrowed::<Invoice>(store, tenant, N::InvoicesByStatus, invoices).await?;
    let subscriptions = Subscription::counted_list_of(tenant);
    done.subscriptions_by_filter =
        narrowed::<Subscription>(store, tenant, N::SubscriptionsByFilter, subscriptions).await?;
    let billing_invoices = BillingInvoice::counted_list_of(tenant);
    done.billing_invoices_by_filter =
        narrowed::<BillingInvoice>(store, tenant, N::BillingInvoicesByFilter, billing_invoices)
            .await?;
    Ok(())
}

/// Enters and counts the records of `list` in their narrowings, then
/// marks `narrowing` covered for `tenant`.
async fn narrowed<R: Narrowed>(
    store: &dyn Store,
    tenant: &Tenant,
    narrowing: Narrowing,
    list: CountedList,
) -> Result<Migrated, StoreError> {
    let done = counted::migrate_narrowed::<R>(store, list.all()).await?;
    store
        .transact(vec![ListsMarker::mark_narrowing(tenant, narrowing)])
        .await?;
    Ok(done)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Mode;
    use crate::domain::checkout::{self, Creator, SessionStatus};
    use crate::domain::links;
    use crate::domain::record::{Record, Window};
    use crate::time::{Clock, SystemClock};

    /// The narrowings of sessions and links: entered and counted once,
    /// a rerun nothing, both marked covered.
    #[tokio::test]
    async fn the_narrowings_are_migrated_once_and_marked() {
        let store = crate::testenv::memory_store();
        let tenant = Tenant::new("proj_mig", Mode::Sandbox);
        let mut marker = ListsMarker::new(&tenant);
        marker.sessions_by_status = false;
        marker.links_by_active = false;
        let put = marker.to_item().unwrap_or_else(|e| panic!("{e}"));
        store.put(put, None).await.unwrap_or_else(|e| panic!("{e}"));
        let now = SystemClock.now();
        let creator = Creator {
            project_id: tenant.project.clone(),
            mode: Mode::Sandbox,
            api_key_id: "ak_mig".into(),
            spend_cap_paisa: None,
        };
        for status in [
            SessionStatus::Success,
            SessionStatus::Failed,
            SessionStatus::Success,
        ] {
            let valid = checkout::validate_create(
                serde_json::from_value(
                    serde_json::json!({"amount": 5000, "returnUrl": "https://shop.example/done"}),
                )
                .unwrap_or_else(|e| panic!("{e}")),
                Mode::Sandbox,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let mut s = checkout::new_session(&creator, valid, now);
            s.status = status;
            s.narrowed = false;
            let mut ops = vec![s.put_new().unwrap_or_else(|e| panic!("{e}"))];
            ops.extend(s.count_new());
            store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
        }
        for active in [true, false] {
            let req: links::CreateLink =
                serde_json::from_value(serde_json::json!({"title": "Tea", "amount": 1000}))
                    .unwrap_or_else(|e| panic!("{e}"));
            let mut l = links::new_link(&tenant, req, now).unwrap_or_else(|e| panic!("{e:?}"));
            l.active = active;
            l.narrowed = false;
            let mut ops = vec![l.put_new().unwrap_or_else(|e| panic!("{e}"))];
            ops.extend(l.count_new());
            store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
        }
        let first = migrate(&*store, &tenant)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                first.sessions_by_status.listed,
                first.links_by_active.listed
            ),
            (3, 2)
        );
        let again = migrate(&*store, &tenant)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                again.sessions_by_status.listed,
                again.sessions_by_status.already,
                again.links_by_active.listed,
                again.links_by_active.already
            ),
            (0, 3, 0, 2)
        );
        for n in [Narrowing::SessionsByStatus, Narrowing::LinksByActive] {
            assert_eq!(
                counted::covered_narrowing(&*store, &tenant, n).await,
                Ok(true)
            );
        }
        let total = |list: CountedList| {
            let store = store.clone();
            async move {
                counted::page::<serde_json::Value>(&*store, &list, &Window::first(1), true)
                    .await
                    .map(|(_, total, _)| total)
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        };
        assert_eq!(
            total(CheckoutSession::by_status(&tenant, SessionStatus::Success)).await,
            2
        );
        assert_eq!(total(PaymentLink::by_active(&tenant, false)).await, 1);
    }
}
