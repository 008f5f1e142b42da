//! Reconciliation (issue 41 parts 4-6): what the providers say they
//! collected ([`statements`]), matched against our payments and refunds,
//! and the settlements the merchant's bank credited.
//!
//! The types every part shares live here and in [`statements`]; each
//! part adds its module.

pub mod daily;
pub mod enroll;
pub mod matching;
pub mod runs;
pub mod settlements;
pub mod statements;
pub mod uploads;
