use rand::{Rng, SeedableRng, rngs::StdRng};

use super::*;

const REJECT: PathOptions = PathOptions { escaped_slashes: EscapedSlashes::Reject, case_insensitive: false };
const KEEP: PathOptions = PathOptions { escaped_slashes: EscapedSlashes::Keep, case_insensitive: false };
const FOLD: PathOptions = PathOptions { escaped_slashes: EscapedSlashes::Reject, case_insensitive: true };

fn canonical(raw: &str, options: PathOptions) -> (String, String) {
    let path = CanonicalPath::parse(raw, options).unwrap_or_else(|e| panic!("{raw}: {e}"));
    (path.forward().to_owned(), path.route().to_owned())
}

#[test]
fn every_spelling_of_login_is_the_login_route() {
    for raw in [
        "/login",
        "/login;x",
        "/login/",
        "/login/..;/login",
        "//login",
        "/./login",
        "/%6cogin",
        "/%6Cogin",
        "/%2e/login",
        "/x/%2E%2E/login",
        "/x/.%2e/login",
        "/../login",
        "/x/..;jsessionid=1/login",
        "/;x/login",
        "/login/.",
        "/login/x/..",
    ] {
        assert_eq!(canonical(raw, REJECT).1, "/login", "{raw}");
    }
    for raw in ["/api/%74ransfer", "//api/transfer", "/api/./transfer", "/api//transfer/", "/api/x/../transfer"] {
        assert_eq!(canonical(raw, REJECT).1, "/api/transfer", "{raw}");
    }
}

#[test]
fn the_forwarded_path_is_what_was_matched_with_its_parameters_and_trailing_slash() {
    for (raw, forward, route) in [
        ("/", "/", "/"),
        ("//", "/", "/"),
        ("/a/./b/../c//d/%7e%41%2a", "/a/c/d/~A%2A", "/a/c/d/~A%2A"),
        ("/login;x", "/login;x", "/login"),
        ("/login/..;/login", "/login", "/login"),
        ("/login/", "/login/", "/login"),
        ("/a/b/..", "/a/", "/a"),
        ("/a/b/..;x", "/a/", "/a"),
        ("/a/;x", "/a/;x", "/a"),
        ("/a/;x/", "/a/;x/", "/a"),
        ("/..", "/", "/"),
        ("/a%3bb/%3B", "/a%3Bb/%3B", "/a%3Bb/%3B"),
        ("/%25%32%65", "/%252e", "/%252e"),
        ("/\"{x}\"/caf\u{e9}", "/%22%7Bx%7D%22/caf%C3%A9", "/%22%7Bx%7D%22/caf%C3%A9"),
        ("/a:b@c!$&'()*+,=", "/a:b@c!$&'()*+,=", "/a:b@c!$&'()*+,="),
    ] {
        assert_eq!(canonical(raw, REJECT), (forward.to_owned(), route.to_owned()), "{raw}");
    }
}

#[test]
fn escaped_separators_are_refused_or_kept_encoded() {
    for (raw, at) in
        [("/api%2Ftransfer", 4), ("/api%2ftransfer", 4), ("/a%5Cb", 2), ("/a%00b", 2), ("/a\\b", 2), ("/a\0b", 2)]
    {
        assert_eq!(CanonicalPath::parse(raw, REJECT), Err(PathError::EscapedSeparator(at)), "{raw}");
    }
    assert_eq!(canonical("/api%2ftransfer", KEEP), ("/api%2Ftransfer".to_owned(), "/api%2Ftransfer".to_owned()));
    assert_eq!(canonical("/a\\..\\b", KEEP).0, "/a%5C..%5Cb");
    assert_eq!(canonical("/a%00/%5c", KEEP).0, "/a%00/%5C");
    // Found by the `path` fuzz target: a raw NUL was encoded as the `%00` it refuses.
    assert_eq!(canonical("/logi\u{3}\0gin", KEEP).0, "/logi%03%00gin");
}

#[test]
fn malformed_paths_are_refused() {
    for (raw, error) in [
        ("", PathError::NotAbsolute),
        ("*", PathError::NotAbsolute),
        ("login", PathError::NotAbsolute),
        ("/a%", PathError::BadEscape(2)),
        ("/a%4", PathError::BadEscape(2)),
        ("/a%zz", PathError::BadEscape(2)),
        ("/a%+1", PathError::BadEscape(2)),
        ("/%\u{e9}", PathError::BadEscape(1)),
    ] {
        assert_eq!(CanonicalPath::parse(raw, KEEP), Err(error), "{raw}");
    }
}

#[test]
fn case_insensitive_folds_the_route_only() {
    assert_eq!(canonical("/API/%54ransfer;X/", FOLD), ("/API/Transfer;X/".to_owned(), "/api/transfer".to_owned()));
    assert_eq!(canonical("/A%3Bb", FOLD).1, "/a%3Bb");
    assert_eq!(canonical("/API", REJECT).1, "/API");
    assert_eq!(PathOptions::default(), FOLD, "folding is the default");
}

#[test]
fn escaped_ascii_letters_fold_once_decoded() {
    for raw in ["/api/transfer", "/%41PI/TRANSFER", "/%61pi/%54ransfer", "/Api/%74RANSFER"] {
        assert_eq!(canonical(raw, FOLD).1, "/api/transfer", "{raw}");
    }
}

#[test]
fn non_ascii_letters_that_fold_to_ascii_are_their_ascii_letter() {
    for (raw, route) in [
        ("/api/tran\u{17f}fer", "/api/transfer"),
        ("/api/tran%C5%BFfer", "/api/transfer"),
        ("/api/tran%c5%bffer", "/api/transfer"),
        ("/log\u{131}n", "/login"),
        ("/log\u{130}n", "/login"),
        ("/\u{212a}ey", "/key"),
        ("/%E2%84%AAey", "/key"),
    ] {
        let (forward, folded) = canonical(raw, FOLD);
        assert_eq!(folded, route, "{raw}");
        assert_ne!(forward.to_ascii_lowercase(), route, "{raw}: the upstream gets the letter as sent");
    }
    // Only where case folds: a case-sensitive route keeps the letter, escaped.
    assert_eq!(canonical("/tran\u{17f}fer", REJECT).1, "/tran%C5%BFfer");
    // Other non-ASCII letters stay escaped, and an escape that merely starts alike is kept.
    assert_eq!(canonical("/%C3%A9t%C5%BE", FOLD).1, "/%C3%A9t%C5%BE");
}

#[test]
fn escaped_slashes_parses_its_config_names() {
    assert_eq!("reject".parse(), Ok(EscapedSlashes::Reject));
    assert_eq!("keep".parse(), Ok(EscapedSlashes::Keep));
    assert_eq!("decode".parse::<EscapedSlashes>(), Err(PathError::UnknownAction("decode".to_owned())));
}

/// Random paths from the characters that make trouble.
fn random_path(rng: &mut StdRng) -> String {
    const PIECES: &[&str] = &[
        "/", "//", ".", "..", "%2e", "%2E", "%2f", "%5c", "%00", "\\", ";", ";x", "a", "B", "%41", "%6c", "%3b", "%25",
        "%", "%z", "~", "\u{e9}", "\"", "login", "*", ":", "\0", "\u{3}",
    ];
    let len = rng.random_range(0..12);
    let mut path = String::from("/");
    for _ in 0..len {
        path.push_str(PIECES[rng.random_range(0..PIECES.len())]);
    }
    path
}

#[test]
fn canonical_forms_are_fixed_points_without_dot_or_empty_segments() {
    let mut rng = StdRng::seed_from_u64(10);
    let mut parsed = 0;
    for _ in 0..20_000 {
        let raw = random_path(&mut rng);
        for options in [REJECT, KEEP, FOLD] {
            let Ok(path) = CanonicalPath::parse(&raw, options) else {
                continue;
            };
            parsed += 1;
            let again = CanonicalPath::parse(path.forward(), options).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert_eq!(again, path, "{raw}: not idempotent");
            assert_eq!(
                CanonicalPath::parse(path.route(), options).map(|p| p.route().to_owned()),
                Ok(path.route().to_owned()),
                "{raw}"
            );
            for form in [path.forward(), path.route()] {
                assert!(form.starts_with('/'), "{raw} -> {form}");
                assert!(form.is_ascii(), "{raw} -> {form}");
                let segments: Vec<&str> = form.split('/').skip(1).collect();
                for (i, segment) in segments.iter().enumerate() {
                    let last = i + 1 == segments.len();
                    assert!(!segment.is_empty() || last, "{raw} -> {form} has //");
                    assert!(!matches!(*segment, "." | ".."), "{raw} -> {form} has a dot segment");
                }
                assert!(!form.contains('\\'), "{raw} -> {form}");
            }
            assert!(!path.route().contains(';'), "{raw}");
            assert!(path.route() == "/" || !path.route().ends_with('/'), "{raw}");
        }
    }
    assert!(parsed > 10_000, "only {parsed} random paths parsed");
}
