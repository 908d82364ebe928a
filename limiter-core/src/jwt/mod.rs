//! JSON Web Tokens a client proves itself with (`[proxy.jwt]`): a [`Verifier`] built
//! once per config, whose [`Verifier::verify`] turns an `Authorization: Bearer …`
//! value into the token's [`Claims`], or says why not ([`JwtFailure`]).
//!
//! What is accepted:
//! - `HS256`, `HS384` and `HS512` tokens, against the shared secrets only (any of
//!   them: several for rotation);
//! - `RS*`, `PS*`, `ES256`, `ES384` and `EdDSA` tokens, against the JWKS of the
//!   issuer their `iss` names, by `kid` when they carry one, and only with a key of
//!   the token's algorithm family (and of its `alg`, when the JWK sets one).
//!
//! So an HMAC token is never checked against a public key (the algorithm confusion
//! where the public key, which anyone has, is taken as the HMAC secret), a JWKS can
//! hold no shared secret ([`parse_jwks`] refuses one), and `alg: none` is refused
//! for naming no algorithm of either list.
//!
//! `exp` and `nbf` are checked here against the caller's clock, with the leeway,
//! wherever a token carries them, and must be numbers: jsonwebtoken's own checks
//! read the system clock and skip a claim of the wrong type. `iss` and `aud` are
//! checked where the config expects them.

mod keys;
mod ring;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

use std::{borrow::Cow, fmt, sync::LazyLock, time::Duration};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation, errors::ErrorKind};
use serde_json::{Map, Value};

pub use self::keys::{JwksError, PublicKey, parse_jwks};

/// Why a token was not taken. Each is a label of the failures counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum JwtFailure {
    /// Not a token: no three base64url parts of JSON, several header lines, or a
    /// time claim that is no number.
    #[error("not a JWT")]
    Malformed,
    /// `none`, an algorithm not supported, or one no configured key is for (an HMAC
    /// token without shared secrets).
    #[error("algorithm not accepted")]
    Algorithm,
    /// No key of the issuer's JWKS has the token's `kid` and algorithm.
    #[error("no such key")]
    UnknownKey,
    /// No candidate key verifies the signature.
    #[error("bad signature")]
    Signature,
    /// `exp` passed, more than the leeway ago.
    #[error("expired")]
    Expired,
    /// `nbf` is ahead, by more than the leeway.
    #[error("not valid yet")]
    NotYetValid,
    /// `iss` is not the one expected, or names no configured issuer.
    #[error("wrong issuer")]
    Issuer,
    /// `aud` names none of the audiences expected.
    #[error("wrong audience")]
    Audience,
}

impl JwtFailure {
    /// Every failure, for pre-registering metric label values.
    pub const ALL: [Self; 8] = [
        Self::Malformed,
        Self::Algorithm,
        Self::UnknownKey,
        Self::Signature,
        Self::Expired,
        Self::NotYetValid,
        Self::Issuer,
        Self::Audience,
    ];

    /// The label value, in snake case.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Algorithm => "algorithm",
            Self::UnknownKey => "unknown_key",
            Self::Signature => "signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Issuer => "issuer",
            Self::Audience => "audience",
        }
    }
}

/// The claims of a token that verified.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claims {
    claims: Map<String, Value>,
    /// The configured issuer whose JWKS verified it; `None` for the shared secrets.
    issuer: Option<String>,
}

impl Claims {
    /// What a `jwt:NAME` key counts by: a string as it is, a number or a boolean by
    /// its JSON text, after the issuer's `iss` and a space for a token of an issuer's
    /// JWKS, so that two issuers' `alice` never share a bucket; `None` where the
    /// claim is absent, empty, null, an object or a list, none of which names one
    /// holder.
    #[must_use]
    pub fn key_value(&self, name: &str) -> Option<Cow<'_, str>> {
        let value = match self.claims.get(name)? {
            Value::String(text) if !text.is_empty() => Cow::Borrowed(text.as_str()),
            Value::Number(number) => Cow::Owned(number.to_string()),
            Value::Bool(yes) => Cow::Borrowed(if *yes { "true" } else { "false" }),
            Value::String(_) | Value::Null | Value::Array(_) | Value::Object(_) => return None,
        };
        Some(match &self.issuer {
            Some(iss) => Cow::Owned(format!("{iss} {value}")),
            None => value,
        })
    }
}

/// What a token's `iss` and `aud` must say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expected {
    /// `None`: any issuer, or none.
    pub iss: Option<String>,
    /// Empty: any audience, or none; else `aud` (a string or a list) names one.
    pub audiences: Vec<String>,
}

/// The keys tokens are verified with, and what their claims must say.
#[derive(Clone)]
pub struct Verifier {
    leeway: Duration,
    secrets: Vec<DecodingKey>,
    /// What tokens of the shared secrets must say.
    shared: Expected,
    issuers: Vec<Issuer>,
}

/// One issuer of asymmetrically signed tokens.
#[derive(Clone, Debug)]
struct Issuer {
    /// `iss` is always `Some`: it is what picks the issuer.
    expected: Expected,
    keys: Vec<PublicKey>,
}

impl fmt::Debug for Verifier {
    /// The shape only: no secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("leeway", &self.leeway)
            .field("secrets", &self.secrets.len())
            .field("issuers", &self.issuers.iter().map(|i| (&i.expected.iss, i.keys.len())).collect::<Vec<_>>())
            .finish()
    }
}

impl Verifier {
    /// A verifier with no key yet; `exp` and `nbf` are allowed `leeway` of clock skew.
    #[must_use]
    pub fn new(leeway: Duration) -> Self {
        ring::install();
        Self { leeway, secrets: Vec::new(), shared: Expected::default(), issuers: Vec::new() }
    }

    /// Accepts HMAC tokens signed with any of `secrets` that say what `expected` says.
    #[must_use]
    pub fn with_secrets(mut self, secrets: &[Vec<u8>], expected: Expected) -> Self {
        self.secrets.extend(secrets.iter().filter_map(|secret| DecodingKey::from_secret(secret).ok()));
        self.shared = expected;
        self
    }

    /// Accepts tokens whose `iss` is `iss`, signed by one of `keys`, for one of
    /// `audiences` (any if empty).
    #[must_use]
    pub fn with_issuer(mut self, iss: String, audiences: Vec<String>, keys: Vec<PublicKey>) -> Self {
        self.issuers.push(Issuer { expected: Expected { iss: Some(iss), audiences }, keys });
        self
    }

    /// The claims of the token in `value` (`Bearer TOKEN`, the scheme in any case,
    /// or the bare token) if it verifies at `now` (since the Unix epoch).
    pub fn verify(&self, value: &[u8], now: Duration) -> Result<Claims, JwtFailure> {
        let token = bearer(value).filter(|token| token.split('.').count() == 3).ok_or(JwtFailure::Malformed)?;
        let header = jsonwebtoken::decode_header(token).map_err(|_| header_failure(token))?;
        let (claims, expected) = if header.alg.family() == AlgorithmFamily::Hmac {
            if self.secrets.is_empty() {
                return Err(JwtFailure::Algorithm);
            }
            let claims = first_verifying(token, header.alg, &self.secrets)?;
            (Claims { claims, issuer: None }, &self.shared)
        } else {
            // The issuer is picked by the claim before the signature is checked, and
            // the claim is checked again once it is.
            let iss = jsonwebtoken::dangerous::insecure_decode_claims::<Unverified>(token)
                .map_err(|_| JwtFailure::Malformed)?
                .iss
                .ok_or(JwtFailure::Issuer)?;
            let issuer = self
                .issuers
                .iter()
                .find(|issuer| issuer.expected.iss.as_deref() == Some(iss.as_str()))
                .ok_or(JwtFailure::Issuer)?;
            let keys: Vec<DecodingKey> = issuer
                .keys
                .iter()
                .filter(|key| key.accepts(header.alg, header.kid.as_deref()))
                .map(|key| key.key.clone())
                .collect();
            if keys.is_empty() {
                return Err(JwtFailure::UnknownKey);
            }
            let claims = first_verifying(token, header.alg, &keys)?;
            (Claims { claims, issuer: Some(iss) }, &issuer.expected)
        };
        check(claims, expected, now, self.leeway)
    }
}

/// The only claim read before the signature is checked.
#[derive(serde::Deserialize)]
struct Unverified {
    iss: Option<String>,
}

/// The token of an `Authorization`-style value.
fn bearer(value: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let token = match text.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim_start(),
        Some(_) => return None,
        None => text,
    };
    (!token.is_empty()).then_some(token)
}

/// Why a token's header would not parse: it names an algorithm that jsonwebtoken
/// has not (`none`), or it is no header at all.
fn header_failure(token: &str) -> JwtFailure {
    let named = token
        .split('.')
        .next()
        .and_then(|part| URL_SAFE_NO_PAD.decode(part).ok())
        .and_then(|json| serde_json::from_slice::<Map<String, Value>>(&json).ok())
        .is_some_and(|header| header.get("alg").is_some_and(Value::is_string));
    if named { JwtFailure::Algorithm } else { JwtFailure::Malformed }
}

/// jsonwebtoken's checks of `alg` against the key, and nothing of the claims, which
/// [`check`] reads: one per family, since every algorithm listed must be of the key's.
fn validation(family: AlgorithmFamily) -> &'static Validation {
    static VALIDATIONS: LazyLock<[Validation; 4]> = LazyLock::new(|| {
        [AlgorithmFamily::Hmac, AlgorithmFamily::Rsa, AlgorithmFamily::Ec, AlgorithmFamily::Ed].map(|family| {
            let mut validation = Validation::new_for_family(family);
            validation.required_spec_claims.clear();
            validation.validate_exp = false;
            validation.validate_nbf = false;
            validation.validate_aud = false;
            validation.leeway = 0;
            validation
        })
    });
    let index = match family {
        AlgorithmFamily::Hmac => 0,
        AlgorithmFamily::Rsa => 1,
        AlgorithmFamily::Ec => 2,
        AlgorithmFamily::Ed => 3,
    };
    &VALIDATIONS[index]
}

/// The claims of `token` under the first of `keys` its signature verifies with.
fn first_verifying(token: &str, alg: Algorithm, keys: &[DecodingKey]) -> Result<Map<String, Value>, JwtFailure> {
    for key in keys {
        match jsonwebtoken::decode::<Map<String, Value>>(token, key, validation(alg.family())) {
            Ok(data) => return Ok(data.claims),
            Err(error) => match error.kind() {
                ErrorKind::InvalidSignature => {}
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidKeyFormat | ErrorKind::UnsupportedAlgorithm => {
                    return Err(JwtFailure::Algorithm);
                }
                _ => return Err(JwtFailure::Malformed),
            },
        }
    }
    Err(JwtFailure::Signature)
}

/// The verified `claims`, if their times hold at `now` and they say what `expected`
/// says.
fn check(verified: Claims, expected: &Expected, now: Duration, leeway: Duration) -> Result<Claims, JwtFailure> {
    let claims = &verified.claims;
    let time = |name: &str| claims.get(name).map(|value| value.as_f64().ok_or(JwtFailure::Malformed)).transpose();
    let (now, leeway) = (now.as_secs_f64(), leeway.as_secs_f64());
    if time("exp")?.is_some_and(|exp| now >= exp + leeway) {
        return Err(JwtFailure::Expired);
    }
    if time("nbf")?.is_some_and(|nbf| now + leeway < nbf) {
        return Err(JwtFailure::NotYetValid);
    }
    if let Some(iss) = &expected.iss
        && claims.get("iss").and_then(Value::as_str) != Some(iss)
    {
        return Err(JwtFailure::Issuer);
    }
    if !expected.audiences.is_empty() {
        let expected = |aud: &Value| aud.as_str().is_some_and(|aud| expected.audiences.iter().any(|a| a == aud));
        let named = match claims.get("aud") {
            Some(Value::Array(list)) => list.iter().any(expected),
            Some(aud) => expected(aud),
            None => false,
        };
        if !named {
            return Err(JwtFailure::Audience);
        }
    }
    Ok(verified)
}
