use std::time::Duration;

use serde_json::{Value, json};

use super::{
    JwksError, JwtFailure, Verifier,
    testing::{RSA_PUBLIC_PEM, SigningKey, jwks, sign, sign_parts},
};
use crate::{Clock as _, FakeClock};

const SECRET: &[u8] = b"an hs256 secret of some 32 bytes";
const NEXT_SECRET: &[u8] = b"the secret rotated in, 32 bytes!";
const ISS: &str = "https://id.example.com";
const NOW: u64 = 1_700_000_000;
const LEEWAY: Duration = Duration::from_secs(30);

fn clock() -> FakeClock {
    FakeClock::new(Duration::from_secs(NOW))
}

fn claims(extra: Value) -> Value {
    let mut claims = json!({"sub": "alice", "iss": ISS, "aud": "api", "exp": NOW + 600});
    if let (Some(claims), Value::Object(extra)) = (claims.as_object_mut(), extra) {
        claims.extend(extra);
    }
    claims
}

fn shared() -> Verifier {
    let expected = super::Expected { iss: Some(ISS.to_owned()), audiences: vec!["api".to_owned()] };
    Verifier::new(LEEWAY).with_secrets(&[SECRET.to_vec(), NEXT_SECRET.to_vec()], expected)
}

fn issuer(keys: &[(&str, &SigningKey)]) -> Verifier {
    let keys = super::parse_jwks(&jwks(keys)).expect("the JWKS");
    Verifier::new(LEEWAY).with_issuer(ISS.to_owned(), vec!["api".to_owned()], keys)
}

fn hs256(claims: &Value) -> String {
    sign("HS256", None, claims, &SigningKey::Hmac(SECRET.to_vec()))
}

fn verify(verifier: &Verifier, token: &str, clock: &FakeClock) -> Result<String, JwtFailure> {
    let claims = verifier.verify(format!("Bearer {token}").as_bytes(), clock.now())?;
    Ok(claims.key_value("sub").map(|sub| sub.into_owned()).unwrap_or_default())
}

#[test]
fn an_hs256_token_verifies_to_its_claims_under_either_secret() {
    let clock = clock();
    assert_eq!(verify(&shared(), &hs256(&claims(json!({}))), &clock), Ok("alice".to_owned()));
    for alg in ["HS384", "HS512"] {
        let token = sign(alg, None, &claims(json!({})), &SigningKey::Hmac(NEXT_SECRET.to_vec()));
        assert_eq!(verify(&shared(), &token, &clock), Ok("alice".to_owned()), "{alg} under the second secret");
    }
    let token = hs256(&claims(json!({})));
    assert!(shared().verify(token.as_bytes(), clock.now()).is_ok(), "a bare token");
    assert!(shared().verify(format!("bearer  {token}").as_bytes(), clock.now()).is_ok(), "the scheme in any case");
    assert_eq!(shared().verify(format!("Basic {token}").as_bytes(), clock.now()), Err(JwtFailure::Malformed));
}

#[test]
fn a_signature_of_another_secret_or_over_other_claims_fails() {
    let clock = clock();
    let other =
        sign("HS256", None, &claims(json!({})), &SigningKey::Hmac(b"not one of the configured secrets".to_vec()));
    assert_eq!(verify(&shared(), &other, &clock), Err(JwtFailure::Signature));
    // Alice's signature over Mallory's claims.
    let alice = hs256(&claims(json!({})));
    let mallory = hs256(&claims(json!({"sub": "mallory"})));
    let (alice_head, alice_sig) = alice.rsplit_once('.').expect("three parts");
    let (mallory_head, _) = mallory.rsplit_once('.').expect("three parts");
    assert_ne!(alice_head, mallory_head);
    assert_eq!(verify(&shared(), &format!("{mallory_head}.{alice_sig}"), &clock), Err(JwtFailure::Signature));
    assert_eq!(verify(&shared(), alice_head, &clock), Err(JwtFailure::Malformed), "no signature part");
}

#[test]
fn alg_none_is_refused_whatever_the_keys() {
    let clock = clock();
    let rsa = SigningKey::rsa();
    let both = issuer(&[("rsa", &rsa)])
        .with_secrets(&[SECRET.to_vec()], super::Expected { iss: Some(ISS.to_owned()), audiences: Vec::new() });
    for alg in ["none", "None", "NONE", ""] {
        let token = sign(alg, None, &claims(json!({})), &SigningKey::Unsigned);
        assert_eq!(verify(&both, &token, &clock), Err(JwtFailure::Algorithm), "alg {alg:?}");
        let with_mac = sign_parts(
            &json!({"alg": alg}).to_string(),
            &claims(json!({})).to_string(),
            "HS256",
            &SigningKey::Hmac(SECRET.to_vec()),
        );
        assert_eq!(verify(&both, &with_mac, &clock), Err(JwtFailure::Algorithm), "alg {alg:?} with a valid MAC");
    }
}

#[test]
fn exp_and_nbf_hold_by_the_clock_with_the_leeway() {
    let clock = clock();
    let verifier = shared();
    let expiring = hs256(&claims(json!({"exp": NOW - 10})));
    assert_eq!(verify(&verifier, &expiring, &clock), Ok("alice".to_owned()), "10 s past exp, within the leeway");
    clock.set(Duration::from_secs(NOW + 19));
    assert_eq!(verify(&verifier, &expiring, &clock), Ok("alice".to_owned()), "the last second of the leeway");
    clock.set(Duration::from_secs(NOW + 20));
    assert_eq!(verify(&verifier, &expiring, &clock), Err(JwtFailure::Expired));

    let clock = self::clock();
    let early = hs256(&claims(json!({"nbf": NOW + 31})));
    assert_eq!(verify(&verifier, &early, &clock), Err(JwtFailure::NotYetValid));
    clock.advance(Duration::from_secs(1));
    assert_eq!(verify(&verifier, &early, &clock), Ok("alice".to_owned()), "nbf within the leeway");

    // A time claim that is no number is no token (jsonwebtoken's own check skipped it).
    for bad in [json!({"exp": "never"}), json!({"nbf": "1"}), json!({"exp": null}), json!({"exp": [NOW + 600]})] {
        assert_eq!(verify(&verifier, &hs256(&claims(bad.clone())), &clock), Err(JwtFailure::Malformed), "{bad}");
    }
    let no_exp = hs256(&json!({"sub": "bob", "iss": ISS, "aud": ["web", "api"]}));
    assert_eq!(verify(&verifier, &no_exp, &clock), Ok("bob".to_owned()), "no exp: the issuer's choice");
}

#[test]
fn iss_and_aud_must_say_what_the_config_expects() {
    let clock = clock();
    let verifier = shared();
    for (claims, failure) in [
        (claims(json!({"iss": "https://evil.example.com"})), JwtFailure::Issuer),
        (json!({"sub": "alice", "aud": "api"}), JwtFailure::Issuer),
        (claims(json!({"iss": [ISS]})), JwtFailure::Issuer),
        (claims(json!({"aud": "other"})), JwtFailure::Audience),
        (claims(json!({"aud": ["web", "other"]})), JwtFailure::Audience),
        (json!({"sub": "alice", "iss": ISS}), JwtFailure::Audience),
    ] {
        assert_eq!(verify(&verifier, &hs256(&claims), &clock), Err(failure), "{claims}");
    }
    let open = Verifier::new(LEEWAY).with_secrets(&[SECRET.to_vec()], super::Expected::default());
    assert_eq!(verify(&open, &hs256(&json!({"sub": "carol"})), &clock), Ok("carol".to_owned()), "nothing expected");
}

#[test]
fn rs256_es256_and_eddsa_tokens_verify_by_their_issuers_jwks() {
    let clock = clock();
    let (rsa, ec, ed) = (SigningKey::rsa(), SigningKey::ec_p256(), SigningKey::ed25519());
    let verifier = issuer(&[("rsa", &rsa), ("ec", &ec), ("ed", &ed)]);
    for (alg, kid, key) in [
        ("RS256", "rsa", &rsa),
        ("PS256", "rsa", &rsa),
        ("RS512", "rsa", &rsa),
        ("ES256", "ec", &ec),
        ("EdDSA", "ed", &ed),
    ] {
        let token = sign(alg, Some(kid), &claims(json!({})), key);
        assert_eq!(verify(&verifier, &token, &clock), Ok(format!("{ISS} alice")), "{alg}: keyed under its issuer");
        let unnamed = sign(alg, None, &claims(json!({})), key);
        assert_eq!(verify(&verifier, &unnamed, &clock), Ok(format!("{ISS} alice")), "{alg} without a kid");
    }
    // Another key under a known kid, a kid the JWKS lacks, an issuer not configured.
    let stranger = SigningKey::ec_p256();
    assert_eq!(
        verify(&verifier, &sign("ES256", Some("ec"), &claims(json!({})), &stranger), &clock),
        Err(JwtFailure::Signature)
    );
    assert_eq!(
        verify(&verifier, &sign("ES256", Some("gone"), &claims(json!({})), &ec), &clock),
        Err(JwtFailure::UnknownKey)
    );
    assert_eq!(
        verify(&verifier, &sign("EdDSA", Some("ec"), &claims(json!({})), &ed), &clock),
        Err(JwtFailure::UnknownKey),
        "the EC key for EdDSA"
    );
    let elsewhere = claims(json!({"iss": "https://other.example.com"}));
    assert_eq!(verify(&verifier, &sign("ES256", Some("ec"), &elsewhere, &ec), &clock), Err(JwtFailure::Issuer));
    assert_eq!(
        verify(&verifier, &sign("ES256", Some("ec"), &claims(json!({"aud": "x"})), &ec), &clock),
        Err(JwtFailure::Audience)
    );
    assert_eq!(
        verify(&verifier, &sign("ES256", Some("ec"), &claims(json!({"exp": NOW - 31})), &ec), &clock),
        Err(JwtFailure::Expired)
    );
}

#[test]
fn an_hmac_token_keyed_with_the_rsa_public_key_never_verifies() {
    let clock = clock();
    let rsa = SigningKey::rsa();
    let confused = SigningKey::Hmac(RSA_PUBLIC_PEM.as_bytes().to_vec());
    let jwks_only = issuer(&[("rsa", &rsa)]);
    let with_secrets = issuer(&[("rsa", &rsa)])
        .with_secrets(&[SECRET.to_vec()], super::Expected { iss: Some(ISS.to_owned()), audiences: Vec::new() });
    for alg in ["HS256", "HS384", "HS512"] {
        for kid in [None, Some("rsa")] {
            let token = sign(alg, kid, &claims(json!({})), &confused);
            assert_eq!(verify(&jwks_only, &token, &clock), Err(JwtFailure::Algorithm), "{alg} {kid:?}, JWKS only");
            assert_eq!(
                verify(&with_secrets, &token, &clock),
                Err(JwtFailure::Signature),
                "{alg} {kid:?}, with secrets"
            );
        }
    }
    // The PEM without its newline, and the DER-less raw modulus, fare no better.
    let trimmed = SigningKey::Hmac(RSA_PUBLIC_PEM.trim_end().as_bytes().to_vec());
    assert_eq!(
        verify(&jwks_only, &sign("HS256", Some("rsa"), &claims(json!({})), &trimmed), &clock),
        Err(JwtFailure::Algorithm)
    );
    // An RS token is never checked against the shared secrets either.
    let shared_only = shared();
    assert_eq!(verify(&shared_only, &sign("RS256", None, &claims(json!({})), &rsa), &clock), Err(JwtFailure::Issuer));
}

#[test]
fn claims_key_by_value_and_structures_are_missing() {
    let clock = clock();
    let token = hs256(&claims(
        json!({"n": 42, "f": 1.5, "admin": true, "org": {"id": 1}, "groups": ["a"], "none": null, "empty": ""}),
    ));
    let claims = shared().verify(token.as_bytes(), clock.now()).expect("verifies");
    let value = |name: &str| claims.key_value(name).map(|value| value.into_owned());
    assert_eq!(value("sub").as_deref(), Some("alice"));
    assert_eq!(value("n").as_deref(), Some("42"));
    assert_eq!(value("f").as_deref(), Some("1.5"));
    assert_eq!(value("admin").as_deref(), Some("true"));
    for missing in ["org", "groups", "none", "empty", "absent"] {
        assert_eq!(value(missing), None, "{missing}");
    }
}

#[test]
fn what_is_not_a_token_is_malformed() {
    let clock = clock();
    let verifier = shared();
    let signed_garbage =
        |claims: &str| sign_parts(r#"{"alg":"HS256"}"#, claims, "HS256", &SigningKey::Hmac(SECRET.to_vec()));
    for value in [
        String::new(),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        "a.b".to_owned(),
        "a.b.c.d".to_owned(),
        "!!!.???.***".to_owned(),
        signed_garbage("[1,2]"),
        signed_garbage("not json"),
        signed_garbage(r#""alice""#),
        // jsonwebtoken refuses a `sub` of another type, whatever the rules key by.
        signed_garbage(r#"{"sub":["alice"]}"#),
    ] {
        assert_eq!(verifier.verify(value.as_bytes(), clock.now()).map(|_| ()), Err(JwtFailure::Malformed), "{value:?}");
    }
    assert_eq!(verifier.verify(b"Bearer \xff\xfe", clock.now()), Err(JwtFailure::Malformed));
}

#[test]
fn a_jwks_holds_public_signature_keys_only() {
    let (rsa, ed) = (SigningKey::rsa(), SigningKey::ed25519());
    let parse = |text: &str| super::parse_jwks(text).map(|keys| keys.len());
    assert_eq!(parse(&jwks(&[("rsa", &rsa), ("ed", &ed)])).ok(), Some(2));
    let mut encryption = rsa.jwk("enc");
    encryption["use"] = json!("enc");
    let with_enc = json!({"keys": [encryption, ed.jwk("ed")]}).to_string();
    assert_eq!(parse(&with_enc).ok(), Some(1), "an encryption key is left out");
    assert!(matches!(parse(&json!({"keys": [encryption]}).to_string()), Err(JwksError::Empty)));
    let secret = json!({"keys": [{"kty": "oct", "kid": "s", "k": "c2VjcmV0"}]}).to_string();
    assert!(matches!(parse(&secret), Err(JwksError::Key { which, .. }) if which == "`s`"));
    let mut small = rsa.jwk("small");
    small["n"] = json!("AQAB");
    assert!(matches!(parse(&json!({"keys": [small]}).to_string()), Err(JwksError::Key { .. })));
    let mut mislabelled = ed.jwk("ed");
    mislabelled["alg"] = json!("ES256");
    assert!(matches!(parse(&json!({"keys": [mislabelled]}).to_string()), Err(JwksError::Key { .. })));
    assert!(matches!(parse("{\"keys\": 1}"), Err(JwksError::Json(_))));
    // A JWK that names its algorithm verifies that one only.
    let mut rs384_only = rsa.jwk("rsa");
    rs384_only["alg"] = json!("RS384");
    let keys = super::parse_jwks(&json!({"keys": [rs384_only]}).to_string()).expect("the JWKS");
    let verifier = Verifier::new(LEEWAY).with_issuer(ISS.to_owned(), Vec::new(), keys);
    let clock = clock();
    assert_eq!(
        verify(&verifier, &sign("RS384", Some("rsa"), &claims(json!({})), &rsa), &clock),
        Ok(format!("{ISS} alice"))
    );
    assert_eq!(
        verify(&verifier, &sign("RS256", Some("rsa"), &claims(json!({})), &rsa), &clock),
        Err(JwtFailure::UnknownKey)
    );
}
