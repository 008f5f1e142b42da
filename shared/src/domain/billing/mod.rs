//! Recurring billing (issue 39): Nepal days, Bikram Sambat dates and
//! billing periods; customers and plans; the terms a subscription bills, the subscription and
//! billing invoice state machines and records, exactly one invoice per
//! period, payments taken exactly once, and dunning policies. No HTTP.

pub mod adjust;
pub mod calendar;
pub mod changes;
pub mod compose;
pub mod coupons;
pub mod credit;
pub mod customers;
pub mod discounts;
pub mod due;
pub mod dunning;
pub mod dunning_api;
pub mod events;
pub mod invoice;
pub mod items;
pub mod lifecycle;
pub mod notice_due;
pub mod period;
pub mod plans;
pub mod reminders;
pub mod subscription;
pub mod sweep;
pub mod tax;
pub mod terms;
pub mod test_clock;
#[cfg(test)]
pub(crate) mod testenv;
pub mod upcoming;
pub mod usage;
