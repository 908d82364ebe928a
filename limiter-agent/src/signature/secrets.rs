//! Loading key secrets from references, so that secrets never sit in the config text.

use std::ffi::OsString;
use std::io::Read as _;
use std::os::unix::{ffi::OsStringExt, fs::PermissionsExt as _};
use std::path::Path;
use std::sync::Arc;

use limiter_core::{jwt, signature::SigningKey};

use crate::{
    config::{ProxyConfig, proxy::JwtConfig},
    tls::ServerTls,
};

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
    /// A certificate or private key of `[proxy.tls]` that cannot serve.
    #[error("{0}")]
    Tls(String),
    /// A JWKS file of `[proxy.jwt]` that cannot be read or holds no usable key.
    #[error("{0}")]
    Jwks(String),
}

/// Loads the secret `reference` points to: `file:PATH` (one trailing line ending is
/// removed, as editors and `echo` add one) or `env:NAME` (taken as is).
pub(crate) fn load_secret(reference: &str) -> Result<Vec<u8>, SecretError> {
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

/// The most a secret file may hold: a key is tens of bytes, and a path pointing at
/// something else (a log, a device) must not be read into memory whole.
pub(crate) const MAX_SECRET_BYTES: u64 = 4096;

/// Shorter secrets are warned about: a guessable key lets anyone sign.
pub(crate) const MIN_SECRET_BYTES: usize = 16;

/// The most a JWKS file may hold: an issuer publishes a few keys, some kilobytes.
const MAX_JWKS_BYTES: u64 = 1 << 20;

/// Reads a secret file the way both the proxy and `limiter sign` must, so that they
/// agree on the key bytes: contents minus one trailing `\n` or `\r\n`. A file
/// larger than [`MAX_SECRET_BYTES`] is refused.
pub(crate) fn read_secret_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(MAX_SECRET_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SECRET_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_SECRET_BYTES} bytes, not a key file"),
        ));
    }
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    Ok(bytes)
}

/// Every key's secrets, the listener's TLS certificates and keys, and the keys JWTs
/// are verified with, read once the config is parsed: the one place the agent reads
/// them, in its own environment (not the CLI's).
#[derive(Clone, Default)]
pub struct KeySecrets {
    keys: Vec<(String, SigningKey)>,
    tls: Option<ServerTls>,
    jwt: Option<Arc<jwt::Verifier>>,
    warnings: Vec<String>,
}

impl std::fmt::Debug for KeySecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.keys.iter().map(|(id, key)| (id, key.secrets.len(), key.sign_host))).finish()
    }
}

/// What is weak about a loaded secret: a file others may read, or too few bytes.
/// `key` is the dotted config key naming it.
fn weaknesses(key: &str, reference: &str, secret: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mode =
        reference.strip_prefix("file:").and_then(|path| std::fs::metadata(path).ok()).map(|m| m.permissions().mode());
    if let Some(mode) = mode
        && mode & 0o077 != 0
    {
        found.push(format!(
            "{key}: {reference} can be read by group or others (mode {:o}); make it 0600, owned by the agent's user",
            mode & 0o777
        ));
    }
    if secret.len() < MIN_SECRET_BYTES {
        found.push(format!(
            "{key}: {reference} is {} bytes; use at least {MIN_SECRET_BYTES} random bytes (openssl rand -hex 32)",
            secret.len()
        ));
    }
    found
}

/// A secret of `[[proxy.keys]]` or `[proxy.tls]` that could not be loaded, with the
/// key naming it.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {source}")]
pub struct KeySecretError {
    /// The dotted config key, e.g. `proxy.keys[N].secrets` or `proxy.tls.cert`.
    pub key: String,
    #[source]
    pub source: SecretError,
}

impl KeySecrets {
    /// Loads the secrets of every key of `proxy` that has some, noting the weak ones.
    pub fn load(proxy: &ProxyConfig) -> Result<Self, KeySecretError> {
        let mut loaded = Self::default();
        for (i, key) in proxy.keys.iter().enumerate().filter(|(_, key)| !key.secrets.is_empty()) {
            let name = format!("proxy.keys[{i}].secrets");
            let mut secrets = Vec::with_capacity(key.secrets.len());
            for reference in &key.secrets {
                let secret = load_secret(reference).map_err(|source| KeySecretError { key: name.clone(), source })?;
                loaded.warnings.extend(weaknesses(&name, reference, &secret));
                secrets.push(secret);
            }
            loaded.keys.push((key.id.clone(), SigningKey { secrets, sign_host: key.sign_host }));
        }
        if let Some(tls) = &proxy.tls {
            let server = ServerTls::load(tls)
                .map_err(|error| KeySecretError { key: error.key, source: SecretError::Tls(error.message) })?;
            loaded.tls = Some(server);
        }
        if let Some(config) = &proxy.jwt {
            loaded.jwt = Some(Arc::new(load_jwt(config, &mut loaded.warnings)?));
        }
        Ok(loaded)
    }

    /// What verifies JWTs, with `[proxy.jwt]`.
    #[must_use]
    pub(crate) fn jwt(&self) -> Option<&Arc<jwt::Verifier>> {
        self.jwt.as_ref()
    }

    /// The listener's TLS, with `[proxy.tls]`.
    #[must_use]
    pub fn tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    /// What `limiter check` and `limiter run` warn about: secret files others can
    /// read, secrets too short to resist guessing. Never the secrets themselves.
    #[must_use]
    pub(crate) fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Key id and secrets, for [`limiter_core::signature::Verifier::new`].
    #[must_use]
    pub(crate) fn into_keys(self) -> Vec<(String, SigningKey)> {
        self.keys
    }
}

/// The verifier of `[proxy.jwt]`: its secrets read (the weak ones noted in
/// `warnings`), its issuers' JWKS files read and checked.
fn load_jwt(config: &JwtConfig, warnings: &mut Vec<String>) -> Result<jwt::Verifier, KeySecretError> {
    let name = "proxy.jwt.hs256_secrets";
    let mut secrets = Vec::with_capacity(config.hs256_secrets.len());
    for reference in &config.hs256_secrets {
        let secret = load_secret(reference).map_err(|source| KeySecretError { key: name.to_owned(), source })?;
        warnings.extend(weaknesses(name, reference, &secret));
        secrets.push(secret);
    }
    let mut verifier = jwt::Verifier::new(config.leeway.0);
    if !secrets.is_empty() {
        let expected = jwt::Expected { iss: config.iss.clone(), audiences: config.audiences.clone() };
        verifier = verifier.with_secrets(&secrets, expected);
    }
    for (i, issuer) in config.issuers.iter().enumerate() {
        let keys = read_jwks(&issuer.jwks_file).map_err(|message| KeySecretError {
            key: format!("proxy.jwt.issuers[{i}].jwks_file"),
            source: SecretError::Jwks(message),
        })?;
        verifier = verifier.with_issuer(issuer.iss.clone(), issuer.audiences.clone(), keys);
    }
    Ok(verifier)
}

/// The keys of the JWKS file at `path`; a file larger than [`MAX_JWKS_BYTES`] is
/// refused.
fn read_jwks(path: &Path) -> Result<Vec<jwt::PublicKey>, String> {
    let failed = |error: &dyn std::fmt::Display| format!("{}: {error}", path.display());
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_JWKS_BYTES + 1).read_to_string(&mut text))
        .map_err(|error| failed(&error))?;
    if text.len() as u64 > MAX_JWKS_BYTES {
        return Err(failed(&format!("larger than {MAX_JWKS_BYTES} bytes, not a JWKS")));
    }
    jwt::parse_jwks(&text).map_err(|error| failed(&error))
}
