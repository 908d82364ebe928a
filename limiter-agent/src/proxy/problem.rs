//! Why the proxy answered a request itself, and the `application/problem+json`
//! response (RFC 9457) for each reason.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use limiter_core::path::PathError;
use serde::Serialize;

use super::{
    body::{BodyRefused, BoxError, ProxyBody, full_body},
    gates::Shed,
    headers::ceil_secs,
};
use crate::config::proxy::RefusalAdvice;

const PROBLEM_JSON: &str = "application/problem+json";
const TYPE_BASE: &str = "https://limiter.dev/problems#";

/// A request the proxy refused instead of forwarding.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    /// `own_bucket`: a bucket of the client's own refused (see [`crate::limits::engine::Holder`]);
    /// `fingerprint_bucket`: one of its TLS fingerprint's did; `advice`: the refusing
    /// policy's `refusal`.
    #[error("over the limit of {violated:?}")]
    QuotaExceeded {
        violated: Vec<String>,
        retry_after: Duration,
        own_bucket: bool,
        fingerprint_bucket: bool,
        advice: Option<RefusalAdvice>,
    },
    /// A rule's `concurrency` for the request's key: its queue was full, or the request
    /// waited `queue_timeout`. `violated`: the rule, where `disclose = "full"`;
    /// `own_bucket`: the rule's key is the client's own.
    #[error("{shed:?} at the concurrency of {violated:?}")]
    ConcurrencyExceeded { violated: Vec<String>, shed: Shed, own_bucket: bool },
    /// `[proxy.upstream_capacity]`: the queue before the upstream was full, or the
    /// request waited its `queue_timeout` (503: our overload, not the client's doing).
    #[error("{0:?} before the upstream")]
    ReducedCapacity(Shed),
    /// A rule with `missing_key = "reject"` counts by a key the request lacks; named
    /// only where `disclose = "full"`. `challenge`: for a rule counting by API key,
    /// the `WWW-Authenticate` of its 401; `None`: a header's rule, 400.
    #[error("rule {rule:?} needs a key the request lacks")]
    MissingKey { rule: Option<String>, challenge: Option<HeaderValue> },
    /// The route is in a scope's area and the request proves no key (401); the scope
    /// is named only where `disclose = "full"`.
    #[error("scope {scope:?} needs a proven key")]
    KeyRequired { scope: Option<String>, carried_credentials: bool, challenge: HeaderValue },
    /// The request proved a key that does not hold a scope whose area the route is in
    /// (403); named only where the key's `disclose` is `full`.
    #[error("the key does not hold scope {scope:?}")]
    InsufficientScope { scope: Option<String> },
    /// A `deny` rule applies; named only where `disclose = "full"`.
    /// `escalates`: the rule has `escalate = true`.
    #[error("denied by rule {rule:?}")]
    Denied { rule: Option<String>, escalates: bool },
    /// Every signature failure looks the same from outside; the reason is counted.
    /// `carried_credentials`: the request carried a signature or a key
    /// ([`super::blame::carries_credentials`]).
    /// `challenge`: the 401's `WWW-Authenticate`.
    #[error("signature not accepted")]
    Unauthorized { carried_credentials: bool, challenge: HeaderValue },
    /// The path has no canonical form, or holds an escaped separator
    /// (`escaped_slashes = "reject"`).
    #[error("path refused: {0}")]
    BadPath(PathError),
    /// More than one `Host`, or a `Host` other than the authority the target or
    /// HTTP/2's `:authority` names: which one a rule, a signature and the upstream
    /// each take would be anyone's guess.
    #[error("Host repeated, or at odds with the request's authority")]
    AmbiguousHost,
    #[error("body larger than {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("request body could not be read")]
    BodyUnreadable,
    /// The body would take its connection or its client past
    /// `max_buffered_bytes_per_connection` or `_per_client`.
    #[error("too many request bytes held for this client")]
    BuffersFull,
    #[error("request body did not arrive within body_timeout")]
    BodyTimeout,
    #[error("Idempotency-Key is not visible ASCII or longer than 255 bytes")]
    IdempotencyKeyMalformed,
    #[error("Idempotency-Key reused for a different request")]
    IdempotencyKeyReused,
    #[error("a request with this Idempotency-Key is in progress or cannot be replayed")]
    IdempotencyConflict,
    /// The first request with this key was sent upstream and got no response.
    #[error("the outcome of the first request with this Idempotency-Key is unknown")]
    IdempotencyOutcomeUnknown,
    #[error("too many idempotent requests in flight")]
    IdempotencyStoreFull,
    #[error("upstream unavailable: {0}")]
    Upstream(BoxError),
    /// The upstream took longer than `upstream_timeout` to answer.
    #[error("upstream did not answer in time")]
    UpstreamTimeout,
    /// The client had `max_requests_in_flight_per_client` requests in flight already.
    #[error("too many requests in flight from this client")]
    TooManyInFlight,
    /// `max_upstream_connections` were open, none of them free.
    #[error("every upstream connection is in use")]
    UpstreamBusy,
    /// The shared store is unreachable: under `store_failure = "deny"` for the limits,
    /// always for replay protection and idempotency.
    #[error("shared store unreachable")]
    StoreUnavailable,
}

impl From<BodyRefused> for Refusal {
    fn from(refused: BodyRefused) -> Self {
        match refused {
            BodyRefused::TooLarge { limit } => Self::BodyTooLarge { limit },
            BodyRefused::TimedOut => Self::BodyTimeout,
            BodyRefused::Unreadable => Self::BodyUnreadable,
            BodyRefused::BuffersFull => Self::BuffersFull,
        }
    }
}

/// The body of every problem response.
#[derive(Debug, Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    violated_policies: Option<&'a [String]>,
    /// A refusing policy's `refusal.link`: where to buy more.
    #[serde(skip_serializing_if = "Option::is_none")]
    upgrade: Option<&'a str>,
}

impl Problem<'_> {
    fn json(&self) -> Bytes {
        // Serialising a struct of strings and numbers cannot fail.
        serde_json::to_vec(self).map(Bytes::from).unwrap_or_default()
    }
}

/// The generic `detail` of a 429 over a quota, unless the refusing policy's
/// `refusal` says what to do instead.
const QUOTA_EXCEEDED: &str = "The request exceeds a rate limit; retry after the time in Retry-After.";

/// A problem response with no other headers.
fn problem(status: StatusCode, slug: &str, detail: &str, violated: Option<&[String]>) -> Response<ProxyBody> {
    let body = Problem {
        kind: format!("{TYPE_BASE}{slug}"),
        title: status.canonical_reason().unwrap_or("Error"),
        status: status.as_u16(),
        detail,
        violated_policies: violated,
        upgrade: None,
    }
    .json();
    problem_response(status, body)
}

/// `body`, a problem's JSON, answered with `status`.
fn problem_response(status: StatusCode, body: Bytes) -> Response<ProxyBody> {
    let mut response = Response::new(full_body(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

/// A 401 (RFC 9110 §15.5.2), which must say how to authenticate.
fn unauthorized(slug: &str, detail: &str, challenge: HeaderValue) -> Response<ProxyBody> {
    let mut response = problem(StatusCode::UNAUTHORIZED, slug, detail, None);
    response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
    response
}

/// A 429 for a share of the client's (or its key's) that its requests in progress
/// hold: free again as soon as one ends, so `Retry-After: 1`.
fn share_in_use(slug: &str, detail: &str, violated: Option<&[String]>) -> Response<ProxyBody> {
    let mut response = problem(StatusCode::TOO_MANY_REQUESTS, slug, detail, violated);
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1));
    response
}

impl Refusal {
    pub(super) fn into_response(self) -> Response<ProxyBody> {
        match self {
            Self::QuotaExceeded { violated, retry_after, advice, .. } => {
                let advice = advice.as_ref();
                let status = StatusCode::TOO_MANY_REQUESTS;
                let body = Problem {
                    kind: format!("{TYPE_BASE}quota-exceeded"),
                    title: status.canonical_reason().unwrap_or("Too Many Requests"),
                    status: status.as_u16(),
                    detail: advice.and_then(|advice| advice.detail.as_deref()).unwrap_or(QUOTA_EXCEEDED),
                    // Empty where `disclose` hides the names.
                    violated_policies: (!violated.is_empty()).then_some(&violated[..]),
                    upgrade: advice.and_then(|advice| advice.link.as_deref()),
                };
                let mut response = problem_response(status, body.json());
                let headers = response.headers_mut();
                headers.insert(header::RETRY_AFTER, HeaderValue::from(ceil_secs(retry_after)));
                // The link was checked at load to be visible ASCII without brackets.
                if let Some(link) = body.upgrade
                    && let Ok(value) = HeaderValue::try_from(format!("<{link}>; rel=\"upgrade\""))
                {
                    headers.insert(header::LINK, value);
                }
                response
            }
            Self::ConcurrencyExceeded { violated, shed, .. } => {
                let detail = match shed {
                    Shed::QueueFull => "Too many requests of this key are in progress or waiting; retry once one ends.",
                    Shed::QueueTimeout => "The request waited too long for one of this key's requests to end.",
                };
                // Empty where `disclose` hides the names.
                share_in_use("concurrency-exceeded", detail, (!violated.is_empty()).then_some(&violated[..]))
            }
            Self::ReducedCapacity(_) => {
                let mut response = problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "temporary-reduced-capacity",
                    "The service is working at reduced capacity; retry shortly.",
                    None,
                );
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1));
                response
            }
            Self::MissingKey { rule, challenge } => {
                let detail = match rule {
                    Some(rule) => format!("Rule `{rule}` requires a key this request does not carry."),
                    None => "A rule requires a key this request does not carry.".to_owned(),
                };
                match challenge {
                    Some(challenge) => unauthorized("missing-key", &detail, challenge),
                    None => problem(StatusCode::BAD_REQUEST, "missing-key", &detail, None),
                }
            }
            Self::KeyRequired { scope, challenge, .. } => {
                let detail = match scope {
                    Some(scope) => format!("Scope `{scope}` covers this route: it needs a proven key that holds it."),
                    None => "This route needs a proven key.".to_owned(),
                };
                unauthorized("missing-key", &detail, challenge)
            }
            Self::InsufficientScope { scope } => {
                let detail = match scope {
                    Some(scope) => format!("The key does not hold scope `{scope}`, which this route needs."),
                    None => "The key does not hold a scope this route needs.".to_owned(),
                };
                problem(StatusCode::FORBIDDEN, "insufficient-scope", &detail, None)
            }
            Self::Denied { rule, .. } => {
                let detail = match rule {
                    Some(rule) => format!("The request is refused by rule `{rule}`."),
                    None => "The request is refused.".to_owned(),
                };
                problem(StatusCode::FORBIDDEN, "denied", &detail, None)
            }
            Self::Unauthorized { challenge, .. } => {
                unauthorized("invalid-signature", "The request signature could not be verified.", challenge)
            }
            Self::BodyTooLarge { limit } => {
                let mut response = problem(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body-too-large",
                    &format!("The request body exceeds {limit} bytes."),
                    None,
                );
                // The rest of the body is still on its way; reading it only to keep
                // the connection would be the work the limit exists to refuse.
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                response
            }
            Self::BodyTimeout => {
                let mut response = problem(
                    StatusCode::REQUEST_TIMEOUT,
                    "request-timeout",
                    "The request body did not arrive in time.",
                    None,
                );
                // The client is still sending, or pretending to: the connection is
                // not worth keeping.
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                response
            }
            Self::BuffersFull => {
                let mut response = share_in_use(
                    "buffers-full",
                    "Too many of this client's request bodies are being received at once; retry when one is done.",
                    None,
                );
                // As for a body too large: the rest of it is not worth reading.
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                response
            }
            Self::BadPath(_) => problem(
                StatusCode::BAD_REQUEST,
                "bad-path",
                "The request path is malformed, or holds an encoded slash, backslash or NUL.",
                None,
            ),
            Self::AmbiguousHost => problem(
                StatusCode::BAD_REQUEST,
                "bad-host",
                "The request carries more than one Host, or a Host other than its authority.",
                None,
            ),
            Self::BodyUnreadable => {
                problem(StatusCode::BAD_REQUEST, "bad-body", "The request body could not be read.", None)
            }
            Self::IdempotencyKeyMalformed => problem(
                StatusCode::BAD_REQUEST,
                "bad-idempotency-key",
                "Idempotency-Key must be visible ASCII, at most 255 bytes.",
                None,
            ),
            Self::IdempotencyKeyReused => problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "This Idempotency-Key was used for a different request.",
                None,
            ),
            Self::IdempotencyConflict => problem(
                StatusCode::CONFLICT,
                "idempotency-key-in-use",
                "A request with this Idempotency-Key is still in progress, or its response cannot be replayed.",
                None,
            ),
            Self::IdempotencyOutcomeUnknown => problem(
                StatusCode::CONFLICT,
                "idempotency-outcome-unknown",
                "The first request with this Idempotency-Key was sent upstream and no response came back: it may or \
                 may not have taken effect, and it is not run again. Check its outcome; send a new request with a \
                 new key if it must be repeated.",
                None,
            ),
            Self::IdempotencyStoreFull => problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "idempotency-store-full",
                "Too many idempotent requests are in progress; retry shortly.",
                None,
            ),
            Self::TooManyInFlight => share_in_use(
                "too-many-in-flight",
                "Too many requests from this client are in progress; retry once one has its answer.",
                None,
            ),
            Self::UpstreamBusy => problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream-busy",
                "Every connection to the upstream service is in use; retry shortly.",
                None,
            ),
            Self::StoreUnavailable => problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "The shared state this request is checked against cannot be reached right now; retry shortly.",
                None,
            ),
            Self::Upstream(_) => problem(
                StatusCode::BAD_GATEWAY,
                "upstream-unavailable",
                "The upstream service could not be reached.",
                None,
            ),
            Self::UpstreamTimeout => problem(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "The upstream service did not answer in time.",
                None,
            ),
        }
    }
}

/// The raw 408 written on a connection whose headers did not arrive in time. hyper
/// only closes such a connection, so the server writes this itself before closing.
pub(super) fn request_timeout_bytes() -> Vec<u8> {
    let status = StatusCode::REQUEST_TIMEOUT;
    let body = Problem {
        kind: format!("{TYPE_BASE}request-timeout"),
        title: status.canonical_reason().unwrap_or("Request Timeout"),
        status: status.as_u16(),
        detail: "The request headers did not arrive in time.",
        violated_policies: None,
        upgrade: None,
    }
    .json();
    let mut raw = format!(
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: {PROBLEM_JSON}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&body);
    raw
}
