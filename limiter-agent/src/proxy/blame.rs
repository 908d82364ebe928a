//! Which refusals count towards escalating the client: only those it caused and
//! could have avoided. An escalation blocks a whole address (a CGNAT address, an
//! office) on every agent, so no refusal a third party can bring about may count: a
//! page making its readers' browsers send requests to a signed route, another client
//! emptying a shared bucket, a header value anyone can send.
//!
//! What counts: a 401 for a signature or key the request carried; a 403 for a proven
//! key outside its scopes; a 429 from a bucket of the client's own (its address's, its
//! proven key's or plan's), or from a rule's `concurrency` for such a key; a `deny` rule with `escalate = true`. None of them for a request the browser says another
//! site made it send (`Sec-Fetch-Site: cross-site`): it is limited as usual, never
//! escalated. A client may send that header itself to stay unescalated; it still
//! meets every limit. The same goes for an answer of the upstream that
//! `[escalation] upstream_statuses` names: a page can post a login form to the API. The 429s, 401s and 403s spared are counted
//! (`refusals_not_escalated`), so an operator sees how much escalation left alone.
//!
//! A client's TLS fingerprint is held to the same, and besides to the 429s of the
//! buckets its fingerprint shares with every client presenting it
//! ([`Refusal::fingerprint_blame`]).

use http::HeaderMap;
use limiter_core::signature::verify::{API_KEY_HEADER, SIGNATURE_HEADER};

use super::problem::Refusal;

/// Set by browsers alone (scripts cannot): which site's page made the request.
const FETCH_SITE_HEADER: &str = "sec-fetch-site";

/// Whom a refusal is held against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Blame {
    /// The client caused it: it counts towards the client's escalation.
    Client,
    /// A refusal for what was sent (a 429, a signature's 401, a deny rule's 403) that
    /// someone else could have caused: not counted.
    Doubtful,
    /// Not about what the client sent at all (a 502, a 413, a missing key…).
    Nobody,
}

/// Who made the client send a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Initiator {
    /// The client itself, or a page of the same site.
    Client,
    /// A page of another site, as the browser says (`Sec-Fetch-Site: cross-site`).
    OtherSite,
}

impl Initiator {
    pub(super) fn of(headers: &HeaderMap) -> Self {
        let cross_site = |value: &http::HeaderValue| value.as_bytes().eq_ignore_ascii_case(b"cross-site");
        if headers.get_all(FETCH_SITE_HEADER).iter().any(cross_site) { Self::OtherSite } else { Self::Client }
    }
}

/// Whether a request carried a signature or a key: another site cannot make a
/// browser send either without the browser asking the API first (CORS preflight).
pub(super) fn carries_credentials(headers: &HeaderMap) -> bool {
    headers.contains_key(SIGNATURE_HEADER) || headers.contains_key(API_KEY_HEADER)
}

/// Whom an answer of the upstream that `upstream_statuses` names is held against:
/// the client, unless a page of another site made it send the request.
pub(super) fn upstream_answer(initiator: Initiator) -> Blame {
    for_what_was_sent(true, initiator)
}

/// A refusal for what was sent: the client's doing if it caused it, unless a page of
/// another site made it send the request.
fn for_what_was_sent(client_caused: bool, initiator: Initiator) -> Blame {
    if client_caused && initiator == Initiator::Client { Blame::Client } else { Blame::Doubtful }
}

impl Refusal {
    /// Whom this refusal is held against, answered to the directly connected client
    /// that sent the request at `initiator`'s bidding: only [`Blame::Client`] counts
    /// towards its escalation.
    pub(super) fn blame(&self, initiator: Initiator) -> Blame {
        let client_caused = match self {
            Self::QuotaExceeded { own_bucket, .. } | Self::ConcurrencyExceeded { own_bucket, .. } => *own_bucket,
            Self::Unauthorized { carried_credentials, .. } | Self::KeyRequired { carried_credentials, .. } => {
                *carried_credentials
            }
            // The key was proven: its holder sent it.
            Self::InsufficientScope { .. } => true,
            Self::Denied { escalates, .. } => *escalates,
            // Everyone behind the address shares the cap.
            Self::TooManyInFlight => false,
            Self::MissingKey { .. }
            | Self::BadPath(_)
            | Self::AmbiguousHost
            | Self::BodyTooLarge { .. }
            | Self::BodyUnreadable
            | Self::BuffersFull
            | Self::BodyTimeout
            | Self::IdempotencyKeyMalformed
            | Self::IdempotencyKeyReused
            | Self::IdempotencyConflict
            | Self::IdempotencyOutcomeUnknown
            | Self::IdempotencyStoreFull
            | Self::Upstream(_)
            | Self::UpstreamTimeout
            | Self::UpstreamBusy
            | Self::ReducedCapacity(_)
            | Self::StoreUnavailable => return Blame::Nobody,
        };
        for_what_was_sent(client_caused, initiator)
    }

    /// Whom this refusal is held against for the TLS fingerprint the client presented
    /// (`[escalation.fingerprint]`): what the client caused itself, and a 429 of a
    /// bucket every client presenting the fingerprint shares (`key = "ja4"`), unless
    /// a page of another site made the request.
    pub(super) fn fingerprint_blame(&self, initiator: Initiator) -> Blame {
        match self {
            Self::QuotaExceeded { fingerprint_bucket: true, .. } => for_what_was_sent(true, initiator),
            _ => self.blame(initiator),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{HeaderMap, HeaderValue};

    use super::{Blame, Initiator, Refusal, carries_credentials};
    use crate::proxy::gates::Shed;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| (http::HeaderName::from_static(name), HeaderValue::from_static(value)))
            .collect()
    }

    fn over_limit(own_bucket: bool) -> Refusal {
        Refusal::QuotaExceeded {
            violated: Vec::new(),
            retry_after: Duration::from_secs(1),
            own_bucket,
            fingerprint_bucket: false,
            advice: None,
        }
    }

    fn concurrency(own_bucket: bool) -> Refusal {
        Refusal::ConcurrencyExceeded { violated: Vec::new(), shed: Shed::QueueFull, own_bucket }
    }

    fn challenge() -> HeaderValue {
        HeaderValue::from_static("Limiter-HMAC realm=\"limiter\"")
    }

    #[test]
    fn only_refusals_the_client_caused_escalate() {
        let escalating = [
            over_limit(true),
            concurrency(true),
            Refusal::Unauthorized { carried_credentials: true, challenge: challenge() },
            Refusal::KeyRequired { scope: None, carried_credentials: true, challenge: challenge() },
            Refusal::InsufficientScope { scope: None },
            Refusal::Denied { rule: None, escalates: true },
        ];
        for refusal in &escalating {
            assert_eq!(refusal.blame(Initiator::Client), Blame::Client, "{refusal:?}");
            assert_eq!(refusal.blame(Initiator::OtherSite), Blame::Doubtful, "another site's doing: {refusal:?}");
        }
        let doubtful = [
            over_limit(false),
            concurrency(false),
            Refusal::Unauthorized { carried_credentials: false, challenge: challenge() },
            Refusal::KeyRequired { scope: None, carried_credentials: false, challenge: challenge() },
            Refusal::Denied { rule: Some("probe".to_owned()), escalates: false },
        ];
        for refusal in &doubtful {
            assert_eq!(refusal.blame(Initiator::Client), Blame::Doubtful, "{refusal:?}");
        }
        let nobodys = [
            Refusal::MissingKey { rule: None, challenge: Some(challenge()) },
            Refusal::StoreUnavailable,
            Refusal::UpstreamTimeout,
            Refusal::ReducedCapacity(Shed::QueueTimeout),
        ];
        for refusal in &nobodys {
            assert_eq!(refusal.blame(Initiator::Client), Blame::Nobody, "{refusal:?}");
        }
    }

    #[test]
    fn only_a_cross_site_fetch_is_another_sites_doing() {
        assert_eq!(Initiator::of(&headers(&[("sec-fetch-site", "cross-site")])), Initiator::OtherSite);
        assert_eq!(Initiator::of(&headers(&[("sec-fetch-site", "Cross-Site")])), Initiator::OtherSite);
        for own in ["same-origin", "same-site", "none"] {
            assert_eq!(Initiator::of(&headers(&[("sec-fetch-site", own)])), Initiator::Client, "{own}");
        }
        assert_eq!(Initiator::of(&HeaderMap::new()), Initiator::Client, "no browser");
    }

    #[test]
    fn credentials_are_a_signature_or_a_key() {
        assert!(carries_credentials(&headers(&[("x-signature", "00")])));
        assert!(carries_credentials(&headers(&[("x-api-key", "k")])));
        assert!(!carries_credentials(&headers(&[("x-timestamp", "1"), ("cookie", "session=1")])));
        assert!(!carries_credentials(&HeaderMap::new()));
    }
}
