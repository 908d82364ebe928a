//! jsonwebtoken's signature checks done by ring, the crypto rustls already brings
//! into the agent: jsonwebtoken's own backends are aws-lc (a second C library) or
//! RustCrypto's `rsa` (whose advisory of timing leaks is open). Verification only:
//! the agent signs no token.

use jsonwebtoken::{
    Algorithm, DecodingKey, DecodingKeyKind, EncodingKey,
    crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils},
    errors::{ErrorKind, Result},
    signature,
};
use ring::{hmac, signature as ring_signature};

static PROVIDER: CryptoProvider =
    CryptoProvider { signer_factory: no_signer, verifier_factory: verifier, key_utils: KeyUtils::new_unimplemented() };

/// Makes ring jsonwebtoken's provider for this process. Nothing else installs one
/// (none of its crypto features is on), so the first call succeeds and the others
/// find it in place.
pub(super) fn install() {
    let _ = PROVIDER.install_default();
}

fn no_signer(_: &Algorithm, _: &EncodingKey) -> Result<Box<dyn JwtSigner>> {
    Err(ErrorKind::UnsupportedAlgorithm.into())
}

fn verifier(alg: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>> {
    // jsonwebtoken checks this too; a key is never used for another family.
    if key.family() != alg.family() {
        return Err(ErrorKind::InvalidKeyFormat.into());
    }
    Ok(Box::new(RingVerifier { alg: *alg, key: key.clone() }))
}

struct RingVerifier {
    alg: Algorithm,
    key: DecodingKey,
}

impl signature::Verifier<Vec<u8>> for RingVerifier {
    fn verify(&self, message: &[u8], signature: &Vec<u8>) -> std::result::Result<(), signature::Error> {
        verify(self.alg, self.key.kind(), message, signature)
            .map_err(|ring::error::Unspecified| signature::Error::new())
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }
}

/// ring's RSA checks refuse moduli under 2048 bits, as the JWKS reader does.
fn verify(
    alg: Algorithm,
    key: &DecodingKeyKind,
    message: &[u8],
    signature: &[u8],
) -> std::result::Result<(), ring::error::Unspecified> {
    use ring_signature::{
        ECDSA_P256_SHA256_FIXED, ECDSA_P384_SHA384_FIXED, ED25519, RSA_PKCS1_2048_8192_SHA256,
        RSA_PKCS1_2048_8192_SHA384, RSA_PKCS1_2048_8192_SHA512, RSA_PSS_2048_8192_SHA256, RSA_PSS_2048_8192_SHA384,
        RSA_PSS_2048_8192_SHA512, RsaParameters, RsaPublicKeyComponents, UnparsedPublicKey, VerificationAlgorithm,
    };
    let rsa = |parameters: &'static RsaParameters| match key {
        DecodingKeyKind::RsaModulusExponent { n, e } => {
            RsaPublicKeyComponents { n, e }.verify(parameters, message, signature)
        }
        DecodingKeyKind::SecretOrDer(der) => UnparsedPublicKey::new(parameters, der).verify(message, signature),
    };
    let raw = |algorithm: &'static dyn VerificationAlgorithm| match key {
        DecodingKeyKind::SecretOrDer(bytes) => UnparsedPublicKey::new(algorithm, bytes).verify(message, signature),
        DecodingKeyKind::RsaModulusExponent { .. } => Err(ring::error::Unspecified),
    };
    let mac = |algorithm: hmac::Algorithm| match key {
        DecodingKeyKind::SecretOrDer(secret) => hmac::verify(&hmac::Key::new(algorithm, secret), message, signature),
        DecodingKeyKind::RsaModulusExponent { .. } => Err(ring::error::Unspecified),
    };
    match alg {
        Algorithm::HS256 => mac(hmac::HMAC_SHA256),
        Algorithm::HS384 => mac(hmac::HMAC_SHA384),
        Algorithm::HS512 => mac(hmac::HMAC_SHA512),
        Algorithm::RS256 => rsa(&RSA_PKCS1_2048_8192_SHA256),
        Algorithm::RS384 => rsa(&RSA_PKCS1_2048_8192_SHA384),
        Algorithm::RS512 => rsa(&RSA_PKCS1_2048_8192_SHA512),
        Algorithm::PS256 => rsa(&RSA_PSS_2048_8192_SHA256),
        Algorithm::PS384 => rsa(&RSA_PSS_2048_8192_SHA384),
        Algorithm::PS512 => rsa(&RSA_PSS_2048_8192_SHA512),
        Algorithm::ES256 => raw(&ECDSA_P256_SHA256_FIXED),
        Algorithm::ES384 => raw(&ECDSA_P384_SHA384_FIXED),
        Algorithm::EdDSA => raw(&ED25519),
        _ => Err(ring::error::Unspecified),
    }
}
