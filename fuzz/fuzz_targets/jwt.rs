//! JWTs: the input as an `Authorization` value gets a verdict, never a panic; the
//! input as claims, signed with the shared secret, verifies only where it is an
//! object whose time claims hold, keys by the `sub` it carries, and never verifies
//! with its signature changed, unsigned (`alg: none`), or with its HMAC keyed with
//! the issuer's public key.

#![no_main]

use std::{sync::LazyLock, time::Duration};

use libfuzzer_sys::fuzz_target;
use limiter_core::jwt::{
    Expected, JwtFailure, Verifier, parse_jwks,
    testing::{SigningKey, jwks, sign_parts},
};
use serde_json::Value;

const SECRET: &[u8] = b"the fuzz target's shared secret!";
const ISS: &str = "https://id.example.com";
const NOW: u64 = 1_700_000_000;

/// The issuer's key, and a verifier of the shared secret and of that issuer.
static KEYS: LazyLock<(SigningKey, Verifier)> = LazyLock::new(|| {
    let key = SigningKey::ed25519();
    let public = parse_jwks(&jwks(&[("ed", &key)])).expect("the issuer's JWKS");
    let verifier = Verifier::new(Duration::ZERO)
        .with_secrets(&[SECRET.to_vec()], Expected::default())
        .with_issuer(ISS.to_owned(), Vec::new(), public);
    (key, verifier)
});

fuzz_target!(|data: &[u8]| {
    let (issuer_key, verifier) = &*KEYS;
    let now = Duration::from_secs(NOW);
    let _ = verifier.verify(data, now);

    let Ok(claims) = std::str::from_utf8(data) else { return };
    let hmac = SigningKey::Hmac(SECRET.to_vec());
    let token = sign_parts(r#"{"alg":"HS256","typ":"JWT"}"#, claims, "HS256", &hmac);
    let outcome = verifier.verify(format!("Bearer {token}").as_bytes(), now);
    if let Ok(verified) = &outcome {
        // Only an object of claims verifies, and only where its times hold.
        let Ok(Value::Object(parsed)) = serde_json::from_str::<Value>(claims) else {
            panic!("{claims:?} is no object of claims, yet it verified");
        };
        let time = |name: &str| parsed.get(name).map(|value| value.as_f64().expect("a time claim is a number"));
        assert!(time("exp").is_none_or(|exp| exp > NOW as f64), "expired, yet verified: {claims}");
        assert!(time("nbf").is_none_or(|nbf| nbf <= NOW as f64), "not valid yet, yet verified: {claims}");
        let sub = match parsed.get("sub") {
            Some(Value::String(sub)) if !sub.is_empty() => Some(sub.clone()),
            Some(Value::Number(number)) => Some(number.to_string()),
            Some(Value::Bool(yes)) => Some(yes.to_string()),
            _ => None,
        };
        assert_eq!(verified.key_value("sub").map(|sub| sub.into_owned()), sub, "{claims}");
    }

    // What never verifies, whatever the claims.
    let (head, signature) = token.rsplit_once('.').expect("three parts");
    let other = if signature.starts_with('A') { "B" } else { "A" };
    let changed = format!("{head}.{other}{}", &signature[1..]);
    assert!(verifier.verify(changed.as_bytes(), now).is_err(), "another signature verified: {claims}");
    let unsigned = sign_parts(r#"{"alg":"none"}"#, claims, "none", &SigningKey::Unsigned);
    assert_eq!(verifier.verify(unsigned.as_bytes(), now).map(|_| ()), Err(JwtFailure::Algorithm), "alg none");
    let public = issuer_key.jwk("ed")["x"].as_str().expect("x").to_owned();
    let confused = sign_parts(r#"{"alg":"HS256","kid":"ed"}"#, claims, "HS256", &SigningKey::Hmac(public.into_bytes()));
    assert!(verifier.verify(confused.as_bytes(), now).is_err(), "an HMAC keyed with the public key: {claims}");
});
