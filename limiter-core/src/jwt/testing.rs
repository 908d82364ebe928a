//! Tokens signed as an issuer (or an attacker) would sign them, and the JWKS that
//! verifies them: for the tests and the fuzz target (feature `testing`). The agent
//! signs nothing.

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use ring::{
    hmac,
    rand::SystemRandom,
    signature::{
        self as ring_signature, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _,
        RsaKeyPair, RsaPublicKeyComponents,
    },
};
use serde_json::{Value, json};

/// A 2048-bit RSA key (PKCS#1 DER): ring makes no RSA keys, so the tests share one.
pub const RSA_DER: &[u8] = include_bytes!("testdata/rsa-2048.der");
/// Its public key as PEM, as an issuer publishes it: what an algorithm confusion
/// attack takes for an HMAC secret.
pub const RSA_PUBLIC_PEM: &str = include_str!("testdata/rsa-2048.pub.pem");

/// What a token is signed with.
#[derive(Debug)]
pub enum SigningKey {
    /// HS256, HS384 or HS512 by the token's `alg`.
    Hmac(Vec<u8>),
    /// RS* or PS* by the token's `alg`.
    Rsa(RsaKeyPair),
    /// ES256.
    EcP256(EcdsaKeyPair),
    /// EdDSA.
    Ed25519(Ed25519KeyPair),
    /// No signature at all (`alg: none`).
    Unsigned,
}

impl SigningKey {
    /// The RSA key of [`RSA_DER`].
    #[must_use]
    pub fn rsa() -> Self {
        Self::Rsa(RsaKeyPair::from_der(RSA_DER).expect("the RSA test key"))
    }

    /// A new P-256 key.
    #[must_use]
    pub fn ec_p256() -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("a P-256 key");
        Self::EcP256(
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).expect("a P-256 key"),
        )
    }

    /// A new Ed25519 key.
    #[must_use]
    pub fn ed25519() -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("an Ed25519 key");
        Self::Ed25519(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("an Ed25519 key"))
    }

    /// The public JWK of an asymmetric key, under `kid`.
    #[must_use]
    pub fn jwk(&self, kid: &str) -> Value {
        let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
        match self {
            Self::Rsa(pair) => {
                let public = RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
                json!({"kty": "RSA", "kid": kid, "use": "sig", "n": b64(&public.n), "e": b64(&public.e)})
            }
            Self::EcP256(pair) => {
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "kid": kid, "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..])})
            }
            Self::Ed25519(pair) => {
                json!({"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(pair.public_key().as_ref())})
            }
            Self::Hmac(_) | Self::Unsigned => panic!("no public JWK for {self:?}"),
        }
    }
}

/// A JWKS file's text with the public keys of `keys`, each under its `kid`.
#[must_use]
pub fn jwks(keys: &[(&str, &SigningKey)]) -> String {
    json!({"keys": keys.iter().map(|(kid, key)| key.jwk(kid)).collect::<Vec<_>>()}).to_string()
}

/// A compact token of `claims` whose header says `alg` (and `kid`), signed with `key`
/// as `alg` says; `alg` is taken as written, so that a test can lie with it.
#[must_use]
pub fn sign(alg: &str, kid: Option<&str>, claims: &Value, key: &SigningKey) -> String {
    let mut header = json!({"alg": alg, "typ": "JWT"});
    if let Some(kid) = kid {
        header["kid"] = json!(kid);
    }
    sign_parts(&header.to_string(), &claims.to_string(), alg, key)
}

/// A token of the header and claims `header` and `claims` as written (any bytes of
/// JSON or not), signed with `key` as `alg` says.
#[must_use]
pub fn sign_parts(header: &str, claims: &str, alg: &str, key: &SigningKey) -> String {
    let input = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(claims));
    let rng = SystemRandom::new();
    let signature = match key {
        SigningKey::Hmac(secret) => {
            let algorithm = match alg {
                "HS384" => hmac::HMAC_SHA384,
                "HS512" => hmac::HMAC_SHA512,
                _ => hmac::HMAC_SHA256,
            };
            hmac::sign(&hmac::Key::new(algorithm, secret), input.as_bytes()).as_ref().to_vec()
        }
        SigningKey::Rsa(pair) => {
            let padding: &'static dyn ring_signature::RsaEncoding = match alg {
                "RS384" => &ring_signature::RSA_PKCS1_SHA384,
                "RS512" => &ring_signature::RSA_PKCS1_SHA512,
                "PS256" => &ring_signature::RSA_PSS_SHA256,
                "PS384" => &ring_signature::RSA_PSS_SHA384,
                "PS512" => &ring_signature::RSA_PSS_SHA512,
                _ => &ring_signature::RSA_PKCS1_SHA256,
            };
            let mut signature = vec![0; pair.public().modulus_len()];
            pair.sign(padding, &rng, input.as_bytes(), &mut signature).expect("an RSA signature");
            signature
        }
        SigningKey::EcP256(pair) => pair.sign(&rng, input.as_bytes()).expect("an ECDSA signature").as_ref().to_vec(),
        SigningKey::Ed25519(pair) => pair.sign(input.as_bytes()).as_ref().to_vec(),
        SigningKey::Unsigned => Vec::new(),
    };
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
}
