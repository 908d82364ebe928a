//! Post-paid costs (`cost_from`): what a request let through owes its buckets is
//! charged once its answer says how much: a response header's value when the head
//! arrives (the header then removed from the client's response, unless `strip =
//! false`), the upstream's milliseconds when the response ends.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use tokio::time::Instant;

use limiter_core::{Clock, CostSource};

use crate::limits::{Engine, Owed, PolicyStatus};

/// The quotas of the policies a response head's charges settled, carried in the
/// response's extensions to its rate-limit headers: they show the balance once
/// charged, where the decision's show it at admission.
#[derive(Clone, Debug)]
pub(super) struct Settled(pub(super) Vec<PolicyStatus>);

impl Settled {
    /// `policies` with each one this settled in its place.
    pub(super) fn over(&self, policies: &[PolicyStatus]) -> Vec<PolicyStatus> {
        policies
            .iter()
            .map(|policy| {
                let settled = self.0.iter().find(|s| s.name == policy.name && s.window == policy.window);
                settled.unwrap_or(policy).clone()
            })
            .collect()
    }
}

/// The measure a `response_header` cost reads: an answer without the header costs
/// 1, as a request of no stated cost; a value that is not a whole number of units is
/// `None`, charged `max`, so that a broken or hostile meter is never free.
fn header_units(value: Option<&HeaderValue>) -> Option<u64> {
    let Some(value) = value else { return Some(1) };
    value.to_str().ok()?.trim().parse().ok()
}

/// Whole milliseconds since `sent`, rounded up: an upstream that took 100 ms is
/// never charged 99.
fn millis_since(sent: Instant) -> u64 {
    u64::try_from(sent.elapsed().as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// What a forwarded request owes, from the moment it is sent: each charge is taken
/// out as its answer settles it ([`Self::at_head`], [`Self::unanswered`]), and what
/// is left when this is dropped is charged then, from a task of its own: held by the
/// response's body, the `upstream_ms` costs at its end (the body sent whole, or the
/// connection closed), and a request whose client left before the head (its future
/// dropped) is charged too, `max` for a header it never saw, as the upstream may
/// have done the work.
pub(super) struct Metering<C: Clock> {
    engine: Arc<Engine<C>>,
    owed: Vec<Owed>,
    sent: Instant,
}

impl<C: Clock> Metering<C> {
    /// What a request sent at `sent` owes; `None` if it owes nothing.
    pub(super) fn new(engine: &Arc<Engine<C>>, owed: &[Owed], sent: Instant) -> Option<Self> {
        (!owed.is_empty()).then(|| Self { engine: Arc::clone(engine), owed: owed.to_vec(), sent })
    }

    /// The charges the response head settles: each `response_header` cost its
    /// header's units (read before any is removed, as two buckets may read one), the
    /// headers then stripped from `headers`. The `upstream_ms` ones stay.
    pub(super) fn at_head(&mut self, headers: &mut HeaderMap) -> Vec<(Owed, u32)> {
        let mut charges = Vec::new();
        self.owed.retain(|owed| match &owed.cost_from().source {
            CostSource::ResponseHeader { name, .. } => {
                charges.push((owed.clone(), owed.cost_from().units(header_units(headers.get(name)))));
                false
            }
            CostSource::UpstreamMs => true,
        });
        for (owed, _) in &charges {
            if let CostSource::ResponseHeader { name, strip: true } = &owed.cost_from().source {
                headers.remove(name);
            }
        }
        charges
    }

    /// Every charge of a request the upstream never answered (it failed or timed
    /// out): a header's cost 1, as an answer without it, and the milliseconds the
    /// upstream held it.
    pub(super) fn unanswered(&mut self) -> Vec<(Owed, u32)> {
        self.charges(1)
    }

    /// What is left owed, charged now: the milliseconds since the request was sent,
    /// and `header` units for a header cost.
    fn charges(&mut self, header: u64) -> Vec<(Owed, u32)> {
        let millis = millis_since(self.sent);
        std::mem::take(&mut self.owed)
            .into_iter()
            .map(|owed| {
                let measured = match owed.cost_from().source {
                    CostSource::ResponseHeader { .. } => header,
                    CostSource::UpstreamMs => millis,
                };
                let units = owed.cost_from().units(Some(measured));
                (owed, units)
            })
            .collect()
    }

    /// Whether anything is left to charge at the end.
    pub(super) fn owes(&self) -> bool {
        !self.owed.is_empty()
    }
}

impl<C: Clock> Drop for Metering<C> {
    fn drop(&mut self) {
        if self.owed.is_empty() {
            return;
        }
        // A header never seen: `max`, as `header_units` charges an unreadable one.
        let charges = self.charges(u64::MAX);
        let engine = Arc::clone(&self.engine);
        // Dropped by the connection's task; a runtime shutting down charges nothing.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        // The response is gone: no header to show the quotas in.
        runtime.spawn(async move {
            let _quotas = engine.charge_owed(&charges).await;
        });
    }
}
