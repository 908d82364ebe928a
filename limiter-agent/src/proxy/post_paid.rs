//! Post-paid costs (`cost_from`): what a request let through owes its buckets is
//! charged once its answer says how much: a response header's value when the head
//! arrives (the header then removed from the client's response, unless `strip =
//! false`), the upstream's milliseconds when the response ends.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use tokio::time::Instant;

use limiter_core::{Clock, CostSource};

use crate::limits::{Engine, Owed};

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

/// What `owed` is charged when the head arrives: each `response_header` cost its
/// header's units (read before any is removed, as two buckets may read one), the
/// headers then stripped from `headers`; and what waits for the response's end.
pub(super) fn at_head<'o>(owed: &'o [Owed], headers: &mut HeaderMap) -> (Vec<(&'o Owed, u32)>, Vec<Owed>) {
    let mut charges = Vec::new();
    let mut later = Vec::new();
    for owed in owed {
        let from = owed.cost_from();
        match &from.source {
            CostSource::ResponseHeader { name, .. } => {
                charges.push((owed, from.units(header_units(headers.get(name)))))
            }
            CostSource::UpstreamMs => later.push(owed.clone()),
        }
    }
    for (owed, _) in &charges {
        if let CostSource::ResponseHeader { name, strip: true } = &owed.cost_from().source {
            headers.remove(name);
        }
    }
    (charges, later)
}

/// What `owed` is charged for a request the upstream never answered (it failed or
/// timed out after `sent`): a header's cost 1, as an answer without it, and the
/// milliseconds the upstream held it.
pub(super) fn unanswered(owed: &[Owed], sent: Instant) -> Vec<(&Owed, u32)> {
    let millis = millis_since(sent);
    owed.iter()
        .map(|owed| {
            let from = owed.cost_from();
            let measured = match from.source {
                CostSource::ResponseHeader { .. } => 1,
                CostSource::UpstreamMs => millis,
            };
            (owed, from.units(Some(measured)))
        })
        .collect()
}

/// Held by a response's body: its `upstream_ms` costs are charged when it is dropped,
/// at the end of the body or when the connection closes, with the milliseconds since
/// the request was sent.
pub(super) struct Metering<C: Clock> {
    engine: Arc<Engine<C>>,
    owed: Vec<Owed>,
    sent: Instant,
}

impl<C: Clock> Metering<C> {
    pub(super) const fn new(engine: Arc<Engine<C>>, owed: Vec<Owed>, sent: Instant) -> Self {
        Self { engine, owed, sent }
    }
}

impl<C: Clock> Drop for Metering<C> {
    fn drop(&mut self) {
        let millis = millis_since(self.sent);
        let owed = std::mem::take(&mut self.owed);
        let engine = Arc::clone(&self.engine);
        // Dropped by the connection's task; a runtime shutting down charges nothing.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            let charges: Vec<(&Owed, u32)> =
                owed.iter().map(|owed| (owed, owed.cost_from().units(Some(millis)))).collect();
            engine.charge_owed(&charges).await;
        });
    }
}
