//! The secrets layer under the rules: the master keys that seal stored
//! secrets (from configuration, rotatable) and a project's credentials at
//! a provider as plain values. Sealing and storing them is
//! `domain::credentials`; the provider clients only receive them.

use aes_gcm::Aes256Gcm;
use aes_gcm::aead::KeyInit;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use rand::TryRngCore;
use serde::{Deserialize, Serialize};

use crate::kinds::Provider;
use crate::store::StoreError;

/// The current master key: `base64` (key id [`DEFAULT_KEY_ID`]) or
/// `id:base64`, 32 bytes once decoded.
pub const KEY_ENV: &str = "DHUKUTI_CREDENTIALS_KEY";
/// Older master keys that may still have sealed stored credentials,
/// comma-separated `id:base64`.
pub const PREVIOUS_KEYS_ENV: &str = "DHUKUTI_CREDENTIALS_PREVIOUS_KEYS";
/// The Secrets Manager secret (ARN or name) holding the master keys, for
/// deployed functions: its value is what [`KEY_ENV`] would hold, or JSON
/// `{"current": "id:base64", "previous": "id:base64,..."}` (see
/// [`CredentialsKeys::from_secret_string`]).
pub const KEY_SECRET_ENV: &str = "DHUKUTI_CREDENTIALS_KEY_SECRET";
/// The id of a master key given without one.
pub const DEFAULT_KEY_ID: &str = "k1";
/// The only algorithm so far; stored so a later one can be told apart.
pub(crate) const ALG: &str = "A256GCM";
pub(crate) const NONCE_LEN: usize = 12;
pub(crate) const KEY_LEN: usize = 32;
/// Longest accepted value of one credential field.
pub(crate) const MAX_FIELD_LEN: usize = 1024;
pub(crate) const REDACTED: &str = "[redacted]";

/// What a project needs to talk to one provider. Secrets never show in
/// `Debug` output, and the type is deliberately not `Serialize`: the only
/// way out of this module is the sealed form.
#[derive(Clone, PartialEq, Eq)]
pub enum ProviderCredentials {
    Esewa {
        product_code: String,
        secret_key: String,
    },
    Khalti {
        secret_key: String,
    },
    Fonepay {
        merchant_code: String,
        secret_key: String,
        username: String,
        password: String,
    },
}

/// The plaintext inside a ciphertext (JSON), private to this module.
#[derive(Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "lowercase")]
pub(crate) enum Plaintext {
    Esewa {
        product_code: String,
        secret_key: String,
    },
    Khalti {
        secret_key: String,
    },
    Fonepay {
        merchant_code: String,
        secret_key: String,
        username: String,
        password: String,
    },
}

impl From<&ProviderCredentials> for Plaintext {
    fn from(c: &ProviderCredentials) -> Self {
        match c.clone() {
            ProviderCredentials::Esewa {
                product_code,
                secret_key,
            } => Plaintext::Esewa {
                product_code,
                secret_key,
            },
            ProviderCredentials::Khalti { secret_key } => Plaintext::Khalti { secret_key },
            ProviderCredentials::Fonepay {
                merchant_code,
                secret_key,
                username,
                password,
            } => Plaintext::Fonepay {
                merchant_code,
                secret_key,
                username,
                password,
            },
        }
    }
}

impl From<Plaintext> for ProviderCredentials {
    fn from(p: Plaintext) -> Self {
        match p {
            Plaintext::Esewa {
                product_code,
                secret_key,
            } => ProviderCredentials::Esewa {
                product_code,
                secret_key,
            },
            Plaintext::Khalti { secret_key } => ProviderCredentials::Khalti { secret_key },
            Plaintext::Fonepay {
                merchant_code,
                secret_key,
                username,
                password,
            } => ProviderCredentials::Fonepay {
                merchant_code,
                secret_key,
                username,
                password,
            },
        }
    }
}

impl std::fmt::Debug for ProviderCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderCredentials::Esewa { product_code, .. } => f
                .debug_struct("Esewa")
                .field("product_code", product_code)
                .field("secret_key", &REDACTED)
                .finish(),
            ProviderCredentials::Khalti { .. } => f
                .debug_struct("Khalti")
                .field("secret_key", &REDACTED)
                .finish(),
            ProviderCredentials::Fonepay { merchant_code, .. } => f
                .debug_struct("Fonepay")
                .field("merchant_code", merchant_code)
                .field("secret_key", &REDACTED)
                .field("username", &REDACTED)
                .field("password", &REDACTED)
                .finish(),
        }
    }
}

impl ProviderCredentials {
    pub fn provider(&self) -> Provider {
        match self {
            ProviderCredentials::Esewa { .. } => Provider::Esewa,
            ProviderCredentials::Khalti { .. } => Provider::Khalti,
            ProviderCredentials::Fonepay { .. } => Provider::Fonepay,
        }
    }

    /// Every field is non-empty, without control characters or surrounding
    /// whitespace, and at most 1,024 bytes.
    pub fn validate(&self) -> Result<(), CredentialsError> {
        let fields: Vec<(&str, &str)> = match self {
            ProviderCredentials::Esewa {
                product_code,
                secret_key,
            } => vec![("product_code", product_code), ("secret_key", secret_key)],
            ProviderCredentials::Khalti { secret_key } => vec![("secret_key", secret_key)],
            ProviderCredentials::Fonepay {
                merchant_code,
                secret_key,
                username,
                password,
            } => vec![
                ("merchant_code", merchant_code),
                ("secret_key", secret_key),
                ("username", username),
                ("password", password),
            ],
        };
        for (name, value) in fields {
            let problem = if value.is_empty() {
                Some("is empty")
            } else if value.len() > MAX_FIELD_LEN {
                Some("is longer than 1024 bytes")
            } else if value.chars().any(char::is_control) {
                Some("contains control characters")
            } else if value.trim() != value {
                Some("has leading or trailing whitespace")
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(CredentialsError::Invalid(format!(
                    "{} {name} {problem}",
                    self.provider().as_str()
                )));
            }
        }
        Ok(())
    }
}

/// Why credentials could not be stored or read. Messages never hold a
/// secret or key material.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CredentialsError {
    #[error(
        "{KEY_ENV} is not set: it must hold a base64 32-byte key \
         (make one with `dhukuti-admin credentials generate-key` or `openssl rand -base64 32`)"
    )]
    MissingKey,
    #[error("invalid credentials key: {0}")]
    BadKey(String),
    #[error("invalid credentials: {0}")]
    Invalid(String),
    #[error("project {0} does not exist")]
    ProjectNotFound(String),
    #[error(
        "credentials of {what} were sealed with key '{key_id}', which is not configured \
         (add it to {PREVIOUS_KEYS_ENV})"
    )]
    UnknownKey { key_id: String, what: String },
    #[error(
        "credentials of {0} cannot be decrypted: wrong key, or the stored record was altered or moved"
    )]
    Decrypt(String),
    #[error("stored credentials of {0} are malformed: {1}")]
    Corrupt(String, String),
    #[error("credentials could not be sealed: {0}")]
    Crypto(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A 32-byte master key and its id. `Debug` never shows the bytes.
#[derive(Clone)]
pub struct CredentialsKey {
    pub(crate) id: String,
    pub(crate) bytes: [u8; KEY_LEN],
}

impl std::fmt::Debug for CredentialsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialsKey")
            .field("id", &self.id)
            .field("bytes", &REDACTED)
            .finish()
    }
}

pub(crate) fn validate_key_id(id: &str) -> Result<(), CredentialsError> {
    let ok = !id.is_empty()
        && id.len() <= 32
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(CredentialsError::BadKey(format!(
            "key id {id:?} must be 1-32 characters of A-Z a-z 0-9 . - _"
        )))
    }
}

impl CredentialsKey {
    pub fn new(id: &str, bytes: [u8; KEY_LEN]) -> Result<Self, CredentialsError> {
        validate_key_id(id)?;
        Ok(CredentialsKey {
            id: id.to_owned(),
            bytes,
        })
    }

    /// A fresh random key from the operating system.
    pub fn generate(id: &str) -> Result<Self, CredentialsError> {
        let mut bytes = [0u8; KEY_LEN];
        rand::rngs::OsRng
            .try_fill_bytes(&mut bytes)
            .map_err(|e| CredentialsError::Crypto(format!("no randomness: {e}")))?;
        CredentialsKey::new(id, bytes)
    }

    /// The key `id` from base64 text (standard or URL-safe alphabet,
    /// padding optional, surrounding whitespace ignored).
    pub fn from_base64(id: &str, text: &str) -> Result<Self, CredentialsError> {
        validate_key_id(id)?;
        let text = text.trim();
        if text.is_empty() {
            return Err(CredentialsError::BadKey(format!("key '{id}' is empty")));
        }
        let decoded = [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
            .iter()
            .find_map(|engine| engine.decode(text).ok())
            .ok_or_else(|| CredentialsError::BadKey(format!("key '{id}' is not valid base64")))?;
        let bytes: [u8; KEY_LEN] = decoded.as_slice().try_into().map_err(|_| {
            CredentialsError::BadKey(format!(
                "key '{id}' decodes to {} bytes; AES-256 needs exactly {KEY_LEN} \
                 (make one with `openssl rand -base64 32`)",
                decoded.len()
            ))
        })?;
        CredentialsKey::new(id, bytes)
    }

    /// `id:base64` or plain `base64` (id [`DEFAULT_KEY_ID`]).
    pub fn parse(text: &str) -> Result<Self, CredentialsError> {
        match text.trim().split_once(':') {
            Some((id, b64)) => CredentialsKey::from_base64(id.trim(), b64),
            None => CredentialsKey::from_base64(DEFAULT_KEY_ID, text),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// `id:base64`, the form [`CredentialsKey::parse`] reads. This is the
    /// secret itself: only for handing a generated key to the operator.
    pub fn export(&self) -> String {
        format!("{}:{}", self.id, STANDARD.encode(self.bytes))
    }

    /// A key for `purpose` derived from this one (HMAC-SHA256 of the
    /// purpose under the master key): signing with it never exposes the
    /// master key, and each purpose signs apart.
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        use hmac::{Hmac, Mac};
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.bytes)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(b"dhukuti/derive/");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    pub(crate) fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(&self.bytes.into())
    }
}

/// The master key that seals new writes and the older ones that may still
/// be needed to read.
#[derive(Clone, Debug)]
pub struct CredentialsKeys {
    pub(crate) current: CredentialsKey,
    pub(crate) previous: Vec<CredentialsKey>,
}

impl CredentialsKeys {
    pub fn new(
        current: CredentialsKey,
        previous: Vec<CredentialsKey>,
    ) -> Result<Self, CredentialsError> {
        let mut ids = vec![current.id.as_str()];
        for key in &previous {
            if ids.contains(&key.id.as_str()) {
                return Err(CredentialsError::BadKey(format!(
                    "key id '{}' is configured twice",
                    key.id
                )));
            }
            ids.push(&key.id);
        }
        Ok(CredentialsKeys { current, previous })
    }

    pub fn single(current: CredentialsKey) -> Self {
        CredentialsKeys {
            current,
            previous: Vec::new(),
        }
    }

    /// From [`KEY_ENV`] and [`PREVIOUS_KEYS_ENV`].
    pub fn from_env() -> Result<Self, CredentialsError> {
        let current = std::env::var(KEY_ENV).ok();
        let previous = std::env::var(PREVIOUS_KEYS_ENV).ok();
        CredentialsKeys::from_values(current.as_deref(), previous.as_deref())
    }

    /// The keys the two configuration values describe (see [`KEY_ENV`] and
    /// [`PREVIOUS_KEYS_ENV`]).
    pub fn from_values(
        current: Option<&str>,
        previous: Option<&str>,
    ) -> Result<Self, CredentialsError> {
        let current = match current.map(str::trim) {
            Some(text) if !text.is_empty() => CredentialsKey::parse(text)?,
            _ => return Err(CredentialsError::MissingKey),
        };
        let older = previous_keys(previous.unwrap_or("").split(','), PREVIOUS_KEYS_ENV)?;
        CredentialsKeys::new(current, older)
    }

    /// The keys in the value of the secret `secret` (named in errors, which
    /// never hold key material): what [`KEY_ENV`] holds (`base64` or
    /// `id:base64`), or a JSON object `{"current": "id:base64",
    /// "previous": "id:base64,..."}` whose `previous` (optional) is
    /// comma-separated like [`PREVIOUS_KEYS_ENV`] or a list. Surrounding
    /// whitespace is ignored.
    pub fn from_secret_string(secret: &str, text: &str) -> Result<Self, CredentialsError> {
        let named = |e: CredentialsError| match e {
            CredentialsError::BadKey(why) => {
                CredentialsError::BadKey(format!("secret {secret}: {why}"))
            }
            other => other,
        };
        let text = text.trim();
        if text.is_empty() {
            return Err(CredentialsError::BadKey(format!(
                "secret {secret} is empty"
            )));
        }
        if !text.starts_with('{') {
            return CredentialsKeys::from_values(Some(text), None).map_err(named);
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct SecretKeys {
            current: String,
            #[serde(default)]
            previous: Option<Previous>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Previous {
            Text(String),
            List(Vec<String>),
        }
        // serde_json's message may quote the value: only its position.
        let parsed: SecretKeys = serde_json::from_str(text).map_err(|e| {
            let why = if e.is_data() {
                "must be a JSON object with a string \"current\" and an optional \"previous\" \
                 (id:base64 entries, comma-separated or a list)"
                    .to_owned()
            } else {
                format!(
                    "is not valid JSON (line {} column {})",
                    e.line(),
                    e.column()
                )
            };
            CredentialsError::BadKey(format!("secret {secret} {why}"))
        })?;
        if parsed.current.trim().is_empty() {
            return Err(CredentialsError::BadKey(format!(
                "secret {secret}: \"current\" is empty"
            )));
        }
        let current = CredentialsKey::parse(&parsed.current).map_err(named)?;
        let older = match &parsed.previous {
            None => Vec::new(),
            Some(Previous::Text(t)) => {
                previous_keys(t.split(','), "\"previous\"").map_err(named)?
            }
            Some(Previous::List(l)) => {
                previous_keys(l.iter().map(String::as_str), "\"previous\"").map_err(named)?
            }
        };
        CredentialsKeys::new(current, older).map_err(named)
    }

    pub fn current(&self) -> &CredentialsKey {
        &self.current
    }

    pub(crate) fn by_id(&self, id: &str) -> Option<&CredentialsKey> {
        std::iter::once(&self.current)
            .chain(self.previous.iter())
            .find(|k| k.id == id)
    }
}

/// Older keys, each `id:base64` (blank entries skipped); `source` names
/// where they were configured.
pub(crate) fn previous_keys<'a>(
    parts: impl Iterator<Item = &'a str>,
    source: &str,
) -> Result<Vec<CredentialsKey>, CredentialsError> {
    let mut older = Vec::new();
    for part in parts.map(str::trim) {
        if part.is_empty() {
            continue;
        }
        let Some((id, b64)) = part.split_once(':') else {
            return Err(CredentialsError::BadKey(format!(
                "{source} entries must be id:base64"
            )));
        };
        older.push(CredentialsKey::from_base64(id.trim(), b64)?);
    }
    Ok(older)
}
