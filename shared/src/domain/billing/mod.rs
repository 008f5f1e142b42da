//! Recurring billing (issue 39). For now its pure foundation: Nepal days,
//! Bikram Sambat dates and billing periods; no store, no HTTP.

pub mod calendar;
pub mod customers;
pub mod period;
pub mod plans;
