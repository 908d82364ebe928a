//! The public keys of a JWKS file, checked once when it is read: a key that could
//! never verify a signature is an error then, not a failure on every token.

use std::str::FromStr as _;

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use jsonwebtoken::{
    Algorithm, DecodingKey,
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse},
};

/// Why a JWKS file cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("not a JWKS (a JSON object with a `keys` list): {0}")]
    Json(String),
    /// `which` is the key's `kid`, or its place in the list.
    #[error("key {which}: {why}")]
    Key { which: String, why: String },
    #[error("holds no key that verifies signatures")]
    Empty,
}

/// A key of an issuer's JWKS.
#[derive(Clone, Debug)]
pub struct PublicKey {
    kid: Option<String>,
    /// The JWK's `alg`: the only algorithm it verifies, where it names one.
    alg: Option<Algorithm>,
    pub(super) key: DecodingKey,
}

impl PublicKey {
    /// Whether a token of `alg` naming `kid` is checked with this key: the same
    /// family (so never an HMAC token), the JWK's `alg` if it has one, and its `kid`
    /// if the token names one.
    pub(super) fn accepts(&self, alg: Algorithm, kid: Option<&str>) -> bool {
        self.key.family() == alg.family()
            && self.alg.is_none_or(|own| own == alg)
            && kid.is_none_or(|kid| self.kid.as_deref() == Some(kid))
    }
}

/// The signature keys of the JWKS `text`. Keys marked for encryption (`use: enc`,
/// or an encryption `alg`) are left out; a shared secret (`kty: oct`), an RSA
/// modulus under 2048 bits, or a curve other than P-256, P-384 and Ed25519 is an error.
pub fn parse_jwks(text: &str) -> Result<Vec<PublicKey>, JwksError> {
    let set: JwkSet = serde_json::from_str(text).map_err(|error| JwksError::Json(error.to_string()))?;
    let mut keys = Vec::with_capacity(set.keys.len());
    for (i, jwk) in set.keys.iter().enumerate() {
        let which = || jwk.common.key_id.as_ref().map_or_else(|| format!("[{i}]"), |kid| format!("`{kid}`"));
        let failed = |why: &str| JwksError::Key { which: which(), why: why.to_owned() };
        if let Some(key) = public_key(jwk).map_err(failed)? {
            keys.push(key);
        }
    }
    if keys.is_empty() { Err(JwksError::Empty) } else { Ok(keys) }
}

/// `None` for an encryption key.
fn public_key(jwk: &Jwk) -> Result<Option<PublicKey>, &'static str> {
    if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
        return Ok(None);
    }
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(KeyAlgorithm::RSA1_5 | KeyAlgorithm::RSA_OAEP | KeyAlgorithm::RSA_OAEP_256) => return Ok(None),
        Some(alg) => Some(Algorithm::from_str(&alg.to_string()).map_err(|_| "an algorithm not supported")?),
    };
    let decode = |text: &str, why| URL_SAFE_NO_PAD.decode(text).map_err(|_| why);
    // EC and OKP keys sign with one algorithm each, which their curve names.
    let (key, implied) = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            let (n, e) = (decode(&rsa.n, "n is not base64url")?, decode(&rsa.e, "e is not base64url")?);
            let bits = n.iter().skip_while(|b| **b == 0).count() * 8;
            if bits < 2048 {
                return Err("an RSA modulus under 2048 bits");
            }
            (DecodingKey::from_rsa_raw_components(&n, &e), None)
        }
        AlgorithmParameters::EllipticCurve(ec) => {
            let (size, implied) = match ec.curve {
                EllipticCurve::P256 => (32, Algorithm::ES256),
                EllipticCurve::P384 => (48, Algorithm::ES384),
                _ => return Err("a curve not supported for EC keys"),
            };
            let (x, y) = (decode(&ec.x, "x is not base64url")?, decode(&ec.y, "y is not base64url")?);
            if x.len() != size || y.len() != size {
                return Err("a coordinate not of the curve's size");
            }
            // What `from_ec_components` makes, and ring reads: the uncompressed point.
            (DecodingKey::from_ec_der(&[&[4], x.as_slice(), y.as_slice()].concat()), Some(implied))
        }
        AlgorithmParameters::OctetKeyPair(okp) => {
            if okp.curve != EllipticCurve::Ed25519 {
                return Err("a curve not supported for OKP keys (Ed25519 is)");
            }
            let x = decode(&okp.x, "x is not base64url")?;
            if x.len() != 32 {
                return Err("an Ed25519 key not of 32 bytes");
            }
            (DecodingKey::from_ed_der(&x), Some(Algorithm::EdDSA))
        }
        AlgorithmParameters::OctetKey(_) => {
            return Err("a shared secret (kty oct), which anyone who reads the file could sign with: list it in \
                        hs256_secrets");
        }
        _ => return Err("a key type not supported (RSA, EC and OKP are)"),
    };
    let alg = match (alg, implied) {
        (Some(alg), Some(implied)) if alg != implied => return Err("an `alg` its curve does not sign with"),
        (Some(alg), None) if !key.family().algorithms().contains(&alg) => return Err("an `alg` not of the key's type"),
        (alg, implied) => alg.or(implied),
    };
    Ok(Some(PublicKey { kid: jwk.common.key_id.clone(), alg, key }))
}
