//! Which methods a request may be served as, for rules scoped by `methods`.
//!
//! The method on the request line is not the only one an upstream may act on: every
//! server answers `HEAD` with its `GET` handler, and many frameworks run the method
//! that an override header or a `_method` parameter names (Rails, Laravel, Symfony,
//! Express's `method-override`, ASP.NET's `X-HTTP-Method-Override`). A rule matches
//! a request that may be served as any of its methods: over-matching is the safe side
//! for deny, limit and signature rules, while matching the request line alone lets a
//! `POST` with `X-HTTP-Method-Override: DELETE` past a rule on `DELETE`.

use http::Method;

use crate::conditions::{Seen, param_values};

/// Headers that frameworks read as the method to run instead of the request line's.
pub const OVERRIDE_HEADERS: [&str; 3] = ["x-http-method-override", "x-http-method", "x-method-override"];

/// The query parameter that frameworks read as the method to run.
pub const OVERRIDE_PARAM: &str = "_method";

/// Whether `seen` may be served as one of `methods`: its own method, one an override
/// header or `_method` names, and `HEAD` as `GET`.
#[must_use]
pub fn served_as_any(seen: &Seen<'_>, methods: &[Method]) -> bool {
    let listed = |name: &[u8]| {
        let name = name.trim_ascii();
        methods.iter().any(|method| name.eq_ignore_ascii_case(method.as_str().as_bytes()))
            || (name.eq_ignore_ascii_case(b"HEAD") && methods.contains(&Method::GET))
    };
    listed(seen.method.as_str().as_bytes())
        || OVERRIDE_HEADERS
            .iter()
            .flat_map(|name| seen.headers.get_all(*name))
            .any(|value| value.as_bytes().split(|&byte| byte == b',').any(listed))
        || seen.query.is_some_and(|query| param_values(query, OVERRIDE_PARAM).any(|value| listed(&value)))
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use http::{HeaderMap, HeaderValue};

    use super::*;

    fn served_as(
        method: Method,
        headers: &[(&'static str, &'static str)],
        query: Option<&str>,
        rule: &[Method],
    ) -> bool {
        let mut map = HeaderMap::new();
        for &(name, value) in headers {
            map.append(name, HeaderValue::from_static(value));
        }
        let seen = Seen {
            method: &method,
            path: "/",
            query,
            client: IpAddr::from([192, 0, 2, 1]),
            headers: &map,
            body_length: Some(0),
            ja4: None,
        };
        served_as_any(&seen, rule)
    }

    #[test]
    fn head_is_served_as_get_and_not_the_other_way() {
        assert!(served_as(Method::HEAD, &[], None, &[Method::GET]));
        assert!(served_as(Method::GET, &[], None, &[Method::GET]));
        assert!(!served_as(Method::GET, &[], None, &[Method::HEAD]));
        assert!(!served_as(Method::HEAD, &[], None, &[Method::POST]));
    }

    #[test]
    fn an_override_header_or_parameter_is_matched_as_its_method_too() {
        let delete = [Method::DELETE];
        for header in OVERRIDE_HEADERS {
            assert!(served_as(Method::POST, &[(header, "DELETE")], None, &delete), "{header}");
        }
        assert!(served_as(Method::POST, &[("x-http-method-override", " delete ")], None, &delete), "any case");
        assert!(served_as(Method::POST, &[("x-http-method-override", "PUT, DELETE")], None, &delete), "a list");
        assert!(served_as(Method::POST, &[], Some("a=1&_method=DELETE"), &delete));
        assert!(served_as(Method::POST, &[], Some("%5Fmethod=d%45lete"), &delete), "escaped");
        assert!(served_as(Method::POST, &[("x-http-method", "HEAD")], None, &[Method::GET]));
        // The request line's own method still counts.
        assert!(served_as(Method::POST, &[("x-http-method-override", "DELETE")], None, &[Method::POST]));
        assert!(!served_as(Method::POST, &[("x-http-method-override", "PUT")], Some("_method=PATCH"), &delete));
        assert!(!served_as(Method::POST, &[], Some("method=DELETE&x_method=DELETE"), &delete));
    }
}
