//! Who may do what in the dashboard: every action a page or form takes,
//! and the one table ([`allows`]) of which role may take it in which mode.
//! Handlers ask [`allows`] and nothing else; `docs/dashboard.md` shows the
//! same table (a test keeps the two alike).

use super::Role;
use crate::domain::Mode;
use crate::refusal::Refusal;

/// What a dashboard page or form does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The overview, payments, refunds, links, invoices, the SMS log, and
    /// a payment's events (not where they were delivered).
    ReadRecords,
    /// Issue a refund; make, edit or cancel a link; pause, resume or
    /// cancel a subscription; void a billing invoice or record a payment
    /// of it received outside.
    ChangeRecords,
    /// Webhook endpoints: their ids, URLs, secrets, deliveries and the
    /// answers they gave (also on a payment's page); add, change, resend,
    /// test.
    Webhooks,
    /// The API keys page (prefixes, never a secret).
    ReadKeys,
    /// Issue or rotate a publishable key (it opens mobile sessions only).
    IssuePublishableKey,
    /// Issue or rotate a secret or restricted key (its secret acts for
    /// the project).
    IssueSecretKey,
    /// Revoke a key.
    RevokeKey,
    /// The provider credentials page (which are set; never a value) and
    /// asking the provider whether they work.
    ReadCredentials,
    /// Set or replace a provider's credentials.
    SetCredentials,
    /// Invite people, revoke an invitation, change a role, disable,
    /// enable.
    People,
    /// The audit log.
    Audit,
    /// Start an export (a CSV of payments, refunds or billing invoices);
    /// reading the Exports page and downloading a finished one is
    /// `ReadRecords`. Not viewers: a start takes one of the project's
    /// few unfinished places (`domain::reports::MAX_UNFINISHED`).
    Export,
}

impl Action {
    /// Every action, in the order `docs/dashboard.md` lists them.
    pub const ALL: [Action; 12] = [
        Action::ReadRecords,
        Action::ChangeRecords,
        Action::Webhooks,
        Action::ReadKeys,
        Action::IssuePublishableKey,
        Action::IssueSecretKey,
        Action::RevokeKey,
        Action::ReadCredentials,
        Action::SetCredentials,
        Action::People,
        Action::Audit,
        Action::Export,
    ];

    /// How `docs/dashboard.md` names the action.
    pub fn describe(self) -> &'static str {
        match self {
            Action::ReadRecords => "Read payments, refunds, links, invoices, SMS, events",
            Action::ChangeRecords => {
                "Refund; make, edit, cancel links; change subscriptions, billing invoices"
            }
            Action::Webhooks => "Webhook endpoints, deliveries and their answers",
            Action::ReadKeys => "See API keys (prefixes)",
            Action::IssuePublishableKey => "Issue or rotate a publishable key",
            Action::IssueSecretKey => "Issue or rotate a secret or restricted key",
            Action::RevokeKey => "Revoke a key",
            Action::ReadCredentials => "See which provider credentials are set; ask the provider",
            Action::SetCredentials => "Set or replace provider credentials",
            Action::People => "Invite people, change roles, disable",
            Action::Audit => "Read the audit log",
            Action::Export => "Start an export (CSV); anyone who reads records downloads",
        }
    }

    /// The page refusing this action to `role` in `mode`.
    pub fn refusal(self, role: Role, mode: Mode) -> Refusal {
        let why = match self {
            _ if allows(Role::Owner, self, mode) && !allows(Role::Developer, self, mode) => {
                if allows(Role::Developer, self, Mode::Sandbox) {
                    "Only an owner can do this in live mode; developers can in sandbox"
                } else {
                    "Only an owner can do this"
                }
            }
            _ if role == Role::Viewer => "Your role can read records but not change anything",
            _ => "Your role cannot do this",
        };
        Refusal::forbidden("permission_denied", why)
    }
}

/// Whether `role` may take `action` in `mode`: the dashboard's role
/// table. Live credentials and live secret keys move real money, so only
/// an owner sets or issues them; a developer does in sandbox.
pub fn allows(role: Role, action: Action, mode: Mode) -> bool {
    match (role, action) {
        (Role::Owner, _) | (_, Action::ReadRecords) => true,
        (Role::Viewer, _) | (Role::Developer, Action::People | Action::Audit) => false,
        (Role::Developer, Action::SetCredentials | Action::IssueSecretKey) => mode == Mode::Sandbox,
        (Role::Developer, _) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::{Action, allows};
    use crate::domain::Mode;
    use crate::domain::dashboard::Role;

    /// The whole table, written out: (owner, developer, viewer) in
    /// sandbox, then in live.
    const TABLE: [(Action, [bool; 3], [bool; 3]); 12] = [
        (Action::ReadRecords, [true, true, true], [true, true, true]),
        (
            Action::ChangeRecords,
            [true, true, false],
            [true, true, false],
        ),
        (Action::Webhooks, [true, true, false], [true, true, false]),
        (Action::ReadKeys, [true, true, false], [true, true, false]),
        (
            Action::IssuePublishableKey,
            [true, true, false],
            [true, true, false],
        ),
        (
            Action::IssueSecretKey,
            [true, true, false],
            [true, false, false],
        ),
        (Action::RevokeKey, [true, true, false], [true, true, false]),
        (
            Action::ReadCredentials,
            [true, true, false],
            [true, true, false],
        ),
        (
            Action::SetCredentials,
            [true, true, false],
            [true, false, false],
        ),
        (Action::People, [true, false, false], [true, false, false]),
        (Action::Audit, [true, false, false], [true, false, false]),
        (Action::Export, [true, true, false], [true, true, false]),
    ];
    const ROLES: [Role; 3] = [Role::Owner, Role::Developer, Role::Viewer];

    #[test]
    fn the_role_table_is_walked_whole() {
        let listed: Vec<Action> = TABLE.iter().map(|(a, _, _)| *a).collect();
        assert_eq!(listed, Action::ALL.to_vec(), "every action, once");
        for (action, sandbox, live) in TABLE {
            for (i, role) in ROLES.into_iter().enumerate() {
                assert_eq!(
                    allows(role, action, Mode::Sandbox),
                    sandbox[i],
                    "{role:?} {action:?} sandbox"
                );
                assert_eq!(
                    allows(role, action, Mode::Live),
                    live[i],
                    "{role:?} {action:?} live"
                );
            }
        }
    }

    /// `docs/dashboard.md` shows this table, a row per action.
    #[test]
    fn the_docs_show_the_same_table() {
        let docs = include_str!("../../../../docs/dashboard.md");
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        for action in Action::ALL {
            let cells: Vec<String> = ROLES
                .iter()
                .flat_map(|r| {
                    [Mode::Sandbox, Mode::Live].map(|m| yes_no(allows(*r, action, m)).to_owned())
                })
                .collect();
            let row = format!("| {} | {} |", action.describe(), cells.join(" | "));
            assert!(
                docs.contains(&row),
                "docs/dashboard.md lacks the row\n{row}"
            );
        }
    }

    #[test]
    fn a_refusal_says_who_may() {
        let r = Action::SetCredentials.refusal(Role::Developer, Mode::Live);
        assert!(r.message.contains("Only an owner"), "{}", r.message);
        assert!(r.message.contains("sandbox"), "{}", r.message);
        let r = Action::People.refusal(Role::Developer, Mode::Sandbox);
        assert_eq!(r.message, "Only an owner can do this");
        let r = Action::ChangeRecords.refusal(Role::Viewer, Mode::Sandbox);
        assert!(r.message.contains("read records"), "{}", r.message);
    }
}
