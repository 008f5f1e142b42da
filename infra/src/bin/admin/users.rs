//! `dhukuti-admin user …`: the dashboard's people (create, reset a
//! password, disable or enable, list). Each change is written to the
//! merchant's audit log first (`dashboard::operator`). Passwords come from stdin, never
//! the command line; without `--password-stdin` one is generated and shown
//! once.

use clap::{Subcommand, ValueEnum};
use serde_json::json;
use shared::domain::dashboard::{self, DashboardError, DashboardUser, Role};
use shared::ids::MerchantId;
use shared::time::Timestamp;

use super::{Failure, Output, deps_of, failed, parse_id, store};

#[derive(Subcommand, Debug)]
pub enum UserCmd {
    /// Create a dashboard user of a merchant.
    Create {
        #[arg(long = "merchant", value_name = "MERCHANT_ID")]
        merchant_id: String,
        #[arg(long)]
        email: String,
        #[arg(long, value_enum)]
        role: RoleArg,
        /// Read the password from stdin (one line); else one is generated
        /// and shown once.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Set a new password; the user is signed out everywhere.
    ResetPassword {
        #[arg(long)]
        email: String,
        /// Read the password from stdin (one line); else one is generated
        /// and shown once.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Disable a user (signed out everywhere, cannot sign in); `--enable`
    /// undoes it.
    Disable {
        #[arg(long)]
        email: String,
        #[arg(long)]
        enable: bool,
    },
    /// List a merchant's users.
    List {
        #[arg(long = "merchant", value_name = "MERCHANT_ID")]
        merchant_id: String,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RoleArg {
    Owner,
    Developer,
    Viewer,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Role {
        match r {
            RoleArg::Owner => Role::Owner,
            RoleArg::Developer => Role::Developer,
            RoleArg::Viewer => Role::Viewer,
        }
    }
}

/// The password to set: stdin's first line, or a generated one (and
/// whether it was generated, to show it).
fn password(from_stdin: bool) -> Result<(String, bool), Failure> {
    if !from_stdin {
        return Ok((dashboard::new_form_token(), true));
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Failure::Usage(format!("cannot read the password from stdin: {e}")))?;
    let line = line.trim_end_matches(['\r', '\n']).to_owned();
    dashboard::check_password(&line).map_err(|e| Failure::Usage(e.to_string()))?;
    Ok((line, false))
}

fn user_failed(e: DashboardError) -> Failure {
    match e {
        DashboardError::Invalid { .. }
        | DashboardError::EmailTaken
        | DashboardError::UnknownUser
        | DashboardError::UnknownMerchant => Failure::Usage(e.to_string()),
        other => Failure::Failed(other.to_string()),
    }
}

/// The user as shown: never the password hash.
fn shown(u: &DashboardUser) -> serde_json::Value {
    json!({
        "id": u.id,
        "merchant_id": u.merchant_id,
        "email": u.email,
        "role": u.role.as_str(),
        "disabled": u.disabled,
        "created_at": u.created_at,
    })
}

fn lines(u: &DashboardUser) -> Vec<String> {
    vec![
        format!("user        {}", u.id),
        format!("merchant    {}", u.merchant_id),
        format!("email       {}", u.email),
        format!("role        {}", u.role.as_str()),
        format!("disabled    {}", u.disabled),
    ]
}

fn with_password(mut out: Output, password: &str, generated: bool) -> Output {
    if generated {
        out.json["password"] = json!(password);
        out.text.push(format!("password    {password}"));
        out = out.note("The password is shown once; it is stored only as an argon2id hash.");
    }
    out
}

pub async fn user_cmd(cmd: UserCmd, now: Timestamp) -> Result<Output, Failure> {
    match cmd {
        UserCmd::Create {
            merchant_id,
            email,
            role,
            password_stdin,
        } => {
            let merchant_id = parse_id::<MerchantId>(&merchant_id, "merchant")?;
            dashboard::normalize_email(&email).map_err(user_failed)?;
            let (password, generated) = password(password_stdin)?;
            let store = store().await?;
            let u = dashboard::operator::create(
                &deps_of(&store),
                now,
                &merchant_id,
                &email,
                role.into(),
                &password,
            )
            .await
            .map_err(user_failed)?;
            Ok(with_password(
                Output::new(shown(&u), lines(&u)),
                &password,
                generated,
            ))
        }
        UserCmd::ResetPassword {
            email,
            password_stdin,
        } => {
            dashboard::normalize_email(&email).map_err(user_failed)?;
            let (password, generated) = password(password_stdin)?;
            let store = store().await?;
            let u = dashboard::operator::reset_password(&deps_of(&store), now, &email, &password)
                .await
                .map_err(user_failed)?;
            let out =
                Output::new(shown(&u), lines(&u)).note("Every session of this user has ended.");
            Ok(with_password(out, &password, generated))
        }
        UserCmd::Disable { email, enable } => {
            dashboard::normalize_email(&email).map_err(user_failed)?;
            let store = store().await?;
            let u = dashboard::operator::set_disabled(&deps_of(&store), now, &email, !enable)
                .await
                .map_err(user_failed)?;
            let mut out = Output::new(shown(&u), lines(&u));
            if !enable {
                out = out.note("The user is signed out everywhere and cannot sign in.");
            }
            Ok(out)
        }
        UserCmd::List { merchant_id } => {
            let merchant_id = parse_id::<MerchantId>(&merchant_id, "merchant")?;
            let store = store().await?;
            let users = dashboard::list_users(&deps_of(&store), &merchant_id)
                .await
                .map_err(failed("cannot list the users"))?;
            let text = users
                .iter()
                .map(|u| {
                    format!(
                        "{}  {:<9}  {}{}",
                        u.id,
                        u.role.as_str(),
                        u.email,
                        if u.disabled { "  (disabled)" } else { "" }
                    )
                })
                .collect();
            Ok(Output::new(
                json!(users.iter().map(shown).collect::<Vec<_>>()),
                text,
            ))
        }
    }
}
