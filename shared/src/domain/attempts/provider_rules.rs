//! What sets one provider's attempts apart, in one table: the generic steps
//! (starting, deciding, settling, the reconciler's timing) ask it rather
//! than naming a provider.

use super::{Mode, Provider};

/// One provider's rules on the attempt path, in one mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProviderRules {
    /// Its status answer states the amount paid (eSewa, Khalti): a paid
    /// answer without one proves nothing. Fonepay's has none: the proof is
    /// our own signed request for that PRN (the QR we minted, the web
    /// request whose DV we signed), which fixes the amount.
    pub states_paid_amount: bool,
    /// Paid by scanning a QR unless the customer asks for the provider's
    /// web page (Fonepay).
    pub pays_by_qr: bool,
    /// Real money under the month cap (sandbox Fonepay,
    /// [`fonepay_cap`](crate::domain::fonepay_cap)): an attempt holds its
    /// amount from its start, and its success counts against the month.
    pub month_cap: bool,
}

/// The rules of `provider` in `mode`.
pub(crate) fn of(provider: Provider, mode: Mode) -> ProviderRules {
    match provider {
        Provider::Esewa | Provider::Khalti => ProviderRules {
            states_paid_amount: true,
            pays_by_qr: false,
            month_cap: false,
        },
        Provider::Fonepay => ProviderRules {
            states_paid_amount: false,
            pays_by_qr: true,
            month_cap: mode == Mode::Sandbox,
        },
    }
}
