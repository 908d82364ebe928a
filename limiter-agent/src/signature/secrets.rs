//! Loading key secrets from references, so that secrets never sit in the config text.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use limiter_core::signature::SigningKey;

use crate::config::ProxyConfig;

/// Why a secret reference could not be loaded. Messages name the reference, never
/// the secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The value is not `file:PATH` or `env:NAME`; it is not echoed, as it may well be a
    /// secret pasted into the config.
    #[error("secrets must be references (\"file:PATH\" or \"env:NAME\"), not literal values")]
    NotAReference,
    /// The file could not be read.
    #[error("secret {reference}: {source}")]
    Read {
        /// The reference as configured.
        reference: String,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The environment variable is not set.
    #[error("secret {reference}: environment variable not set")]
    EnvMissing {
        /// The reference as configured.
        reference: String,
    },
    /// The secret is empty (or the reference has an empty path or name).
    #[error("secret {reference} is empty")]
    Empty {
        /// The reference as configured.
        reference: String,
    },
}

/// Loads the secret `reference` points to: `file:PATH` (one trailing line ending is
/// removed, as editors and `echo` add one) or `env:NAME` (taken as is).
pub fn load_secret(reference: &str) -> Result<Vec<u8>, SecretError> {
    let empty = || SecretError::Empty { reference: reference.to_owned() };
    let secret = if let Some(path) = reference.strip_prefix("file:") {
        if path.is_empty() {
            return Err(empty());
        }
        read_secret_file(Path::new(path))
            .map_err(|source| SecretError::Read { reference: reference.to_owned(), source })?
    } else if let Some(name) = reference.strip_prefix("env:") {
        if name.is_empty() {
            return Err(empty());
        }
        std::env::var_os(name)
            .map(OsString::into_vec)
            .ok_or_else(|| SecretError::EnvMissing { reference: reference.to_owned() })?
    } else {
        return Err(SecretError::NotAReference);
    };
    if secret.is_empty() {
        return Err(empty());
    }
    Ok(secret)
}

/// Reads a secret file the way both the proxy and `limiter sign` must, so that they
/// agree on the key bytes: contents minus one trailing `\n` or `\r\n`.
pub fn read_secret_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = std::fs::read(path)?;
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    Ok(bytes)
}

/// Every key's secrets, read from their references once the config is parsed: the
/// one place the agent reads them, in its own environment (not the CLI's).
#[derive(Clone, Default)]
pub struct KeySecrets(Vec<(String, SigningKey)>);

impl std::fmt::Debug for KeySecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(id, key)| (id, key.secrets.len(), key.sign_host))).finish()
    }
}

/// A secret of `[[proxy.keys]]` that could not be loaded, with the key naming it.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {source}")]
pub struct KeySecretError {
    /// The dotted config key, `proxy.keys[N].secrets`.
    pub key: String,
    #[source]
    pub source: SecretError,
}

impl KeySecrets {
    /// Loads the secrets of every key of `proxy` that has some.
    pub fn load(proxy: &ProxyConfig) -> Result<Self, KeySecretError> {
        let keys = proxy.keys.iter().enumerate().filter(|(_, key)| !key.secrets.is_empty());
        let loaded = keys.map(|(i, key)| {
            let secrets = key.secrets.iter().map(|reference| load_secret(reference)).collect::<Result<_, _>>();
            secrets
                .map(|secrets| (key.id.clone(), SigningKey { secrets, sign_host: key.sign_host }))
                .map_err(|source| KeySecretError { key: format!("proxy.keys[{i}].secrets"), source })
        });
        loaded.collect::<Result<_, _>>().map(Self)
    }

    /// Key id and secrets, for [`limiter_core::signature::Verifier::new`].
    #[must_use]
    pub fn into_keys(self) -> Vec<(String, SigningKey)> {
        self.0
    }
}
