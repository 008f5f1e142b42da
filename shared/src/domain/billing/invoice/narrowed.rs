//! The billing invoices' narrowings (issue 37 item 11): the counted list
//! (`listing::counted`) narrowed by each of its filters, so a filtered
//! page and its total cost what an unfiltered one does, at any page.
//!
//! - **By status**: `gsi4` partition `PROJ#<p>#<mode>#BINV#S#<status>`,
//!   sorted by id, counted as `s_<status>` beside `all` in the list's
//!   counters (`LIST#BINV#...`). [`BillingInvoice::status_change`] is the
//!   one write of an invoice's status (a test fails on any other `set` of
//!   it): it re-enters the entry and moves the count in the same
//!   transaction, conditioned on the status as read.
//! - **By customer**: `gsi3` partition `PROJ#<p>#<mode>#BINV#C#<cus>`, a
//!   scoped list (its own counters `LIST#BINV#<cus>#...`, member `all`).
//! - **By subscription**: `gsi5` partition `PROJ#<p>#<mode>#BINV#SUB#<sub>`,
//!   scoped likewise (`LIST#BINV#<sub>#...`). An invoice's customer and
//!   subscription never change: these entries are written once.
//!
//! An invoice is entered and counted in all three by its insert
//! ([`BillingInvoice::insert_counts`] beside its entries), or by the
//! lists migration for one issued before ([`Narrowed`]). Until then it
//! has no `gsi4` entry (`narrowed` false) and a status change leaves its
//! counting to the migration.

use super::{BillingInvoice, InvoiceStatus};
use crate::domain::Tenant;
use crate::domain::listing::counted;
use crate::domain::listing::counted::{CountedList, Narrowed};
use crate::domain::listing::{StatusChange, merge_counts};
use crate::domain::record::{Attr, Changes, Entry};
use crate::ids::{CustomerId, SubscriptionId};
use crate::store::{Cond, Index, TxOp};

impl BillingInvoice {
    /// Its tenant.
    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// `tenant`'s invoices in `status`.
    pub fn by_status(tenant: &Tenant, status: InvoiceStatus) -> CountedList {
        let list = BillingInvoice::counted_list_of(tenant);
        let partition = format!("{}#S#{}", list.partition, status.as_str());
        list.narrowed(&format!("s_{}", status.as_str()), Index::Gsi4, partition)
    }

    /// `tenant`'s invoices of `customer`.
    pub fn by_customer(tenant: &Tenant, customer: &CustomerId) -> CountedList {
        let list = BillingInvoice::counted_list_of(tenant);
        let partition = format!("{}#C#{customer}", list.partition);
        list.scoped(customer.as_str())
            .narrowed("all", Index::Gsi3, partition)
    }

    /// `tenant`'s invoices of `subscription`.
    pub fn by_subscription(tenant: &Tenant, subscription: &SubscriptionId) -> CountedList {
        let list = BillingInvoice::counted_list_of(tenant);
        let partition = format!("{}#SUB#{subscription}", list.partition);
        list.scoped(subscription.as_str())
            .narrowed("all", Index::Gsi5, partition)
    }

    /// The narrowings it is in (as it is now).
    fn narrowings_now(&self) -> [CountedList; 3] {
        let t = self.tenant();
        [
            BillingInvoice::by_status(&t, self.status),
            BillingInvoice::by_customer(&t, &self.customer_id),
            BillingInvoice::by_subscription(&t, &self.subscription_id),
        ]
    }

    /// Its entries in its narrowings.
    pub(super) fn narrowed_entries(&self) -> Vec<Entry> {
        counted::entries_in(&self.narrowings_now(), self.id.as_str())
    }

    /// Its counts in its narrowings.
    fn narrowed_counts(&self) -> Vec<TxOp> {
        counted::counts_in(&self.narrowings_now(), self.id.as_str(), self.created_at)
    }

    /// The counter writes of a new invoice, for its insert's transaction
    /// (its entries are written by its `put_new`): its list's and, when
    /// narrowed (every invoice made now), its narrowings', folded per
    /// counter item.
    pub fn insert_counts(&self) -> Vec<TxOp> {
        let mut ops = self.count_new();
        if self.narrowed {
            merge_counts(&mut ops, self.narrowed_counts());
        }
        ops
    }

    /// Moving this invoice (as read) to `to`: the status and its `gsi4`
    /// entry, to write with `.changes` under `.cond` (the status as read,
    /// and narrowed or not as read) with `.also` (the count moved from
    /// the old status to the new) in the same transaction. Every status
    /// change goes through here (a test fails on a `set` of the status
    /// anywhere else).
    pub fn status_change(&self, to: InvoiceStatus) -> StatusChange<BillingInvoice> {
        let t = self.tenant();
        counted::value_change(
            self,
            BillingInvoice::STATUS.eq(&self.status),
            Changes::new().set(BillingInvoice::STATUS, &to),
            (
                &BillingInvoice::by_status(&t, self.status),
                &BillingInvoice::by_status(&t, to),
            ),
            (self.id.as_str(), self.created_at),
        )
    }
}

impl Narrowed for BillingInvoice {
    const NARROWED: Attr<Self, bool> = BillingInvoice::NARROWED;

    fn is_narrowed(&self) -> bool {
        self.narrowed
    }

    fn narrowings(&self) -> (Changes<Self>, Vec<TxOp>) {
        (
            Changes::new().enter(self.narrowed_entries()),
            self.narrowed_counts(),
        )
    }

    fn narrowed_as_read(&self) -> Cond {
        BillingInvoice::STATUS.eq(&self.status)
    }
}

#[cfg(test)]
mod tests;
