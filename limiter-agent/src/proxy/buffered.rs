//! Request bytes held in memory before they are forwarded (a signed body is hashed
//! whole, a chunked one collected to be held to `max_body_bytes`), bounded per
//! connection and per client: an HTTP/2 connection reads up to
//! `http2.max_concurrent_streams` bodies at once, and a client opens up to
//! `max_connections_per_ip` connections, so `max_body_bytes` alone bounds nothing a
//! client cannot multiply.

use std::{
    net::IpAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};

use super::{
    body::{BodyRefused, BoxError, BuffersFull, Guarded, ProxyBody, TimedBody, full_body},
    shares::{Share, Shares},
};

/// The bytes one connection holds now.
pub(super) type ConnectionBuffered = Arc<AtomicU64>;

/// The caps a reservation grows under.
#[derive(Clone, Copy, Debug)]
pub(super) struct Caps {
    pub per_connection: u64,
    pub per_client: u64,
}

/// What one request's body holds of its connection's and its client's shares;
/// dropping it gives them back.
#[derive(Debug)]
pub(super) struct Reservation {
    client: Share,
    connection: ConnectionBuffered,
    caps: Caps,
}

/// An empty reservation of `client`'s bytes in `buffers`, on `connection`.
pub(super) fn reserve(
    buffers: &Arc<Shares>,
    client: IpAddr,
    connection: &ConnectionBuffered,
    caps: Caps,
) -> Reservation {
    Reservation { client: buffers.share(client), connection: Arc::clone(connection), caps }
}

impl Reservation {
    /// Takes `n` more bytes if both shares have room; else takes nothing.
    fn grow(&mut self, n: u64) -> Result<(), BuffersFull> {
        // A connection's requests all run on the thread that accepted it, and this
        // does not wait: nothing else moves its count between the two steps.
        let fits = |on_connection: u64| on_connection.checked_add(n).filter(|&after| after <= self.caps.per_connection);
        self.connection.fetch_update(Ordering::Relaxed, Ordering::Relaxed, fits).map_err(|_| BuffersFull)?;
        if !self.client.grow(n, self.caps.per_client) {
            self.connection.fetch_sub(n, Ordering::Relaxed);
            return Err(BuffersFull);
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.connection.fetch_sub(self.client.held(), Ordering::Relaxed);
    }
}

/// A body read into memory: each data frame grows its reservation first, and one that
/// does not fit fails the body with [`BuffersFull`].
#[derive(Debug)]
pub(super) struct Metered<B> {
    body: B,
    reservation: Reservation,
}

impl<B> Metered<B> {
    pub(super) fn new(body: B, reservation: Reservation) -> Self {
        Self { body, reservation }
    }

    /// What the bytes read so far hold, to be kept as long as they are.
    pub(super) fn into_reservation(self) -> Reservation {
        self.reservation
    }
}

impl<B: Body<Data = Bytes, Error = BoxError> + Unpin> Body for Metered<B> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = std::task::ready!(Pin::new(&mut this.body).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
            && let Err(full) = this.reservation.grow(u64::try_from(data.len()).unwrap_or(u64::MAX))
        {
            return Poll::Ready(Some(Err(Box::new(full))));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The body to forward, and its bytes when they were read for a key. One of known
/// length (already checked) streams through, unless `for_keys` asks for a body of
/// up to that many bytes and this one is; a chunked one is read in full first, so
/// that one found too large halfway is refused before the upstream has seen any
/// part of the request. What is read holds `reservation` until it is forwarded, and
/// goes upstream as it came.
pub(super) async fn forwardable(
    body: TimedBody,
    max_bytes: u64,
    reservation: Reservation,
    for_keys: Option<u64>,
) -> Result<(ProxyBody, Option<Bytes>), BodyRefused> {
    let limit = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let within_keys = |length: u64| for_keys.is_some_and(|most| length <= most);
    if let Some(length) = body.size_hint().exact()
        && !within_keys(length)
    {
        return Ok((Limited::new(body, limit).boxed(), None));
    }
    let mut metered = Metered::new(body, reservation);
    let collected =
        Limited::new(&mut metered, limit).collect().await.map_err(|error| BodyRefused::of_read(&*error, max_bytes))?;
    let bytes = collected.to_bytes();
    let read = within_keys(u64::try_from(bytes.len()).unwrap_or(u64::MAX)).then(|| bytes.clone());
    Ok((Guarded::new(full_body(bytes), metered.into_reservation()).boxed(), read))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Caps = Caps { per_connection: 100, per_client: 150 };

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|_| panic!("{text} is not an address"))
    }

    #[test]
    fn a_connection_and_a_client_hold_at_most_their_caps_and_get_them_back() {
        let buffers = Arc::new(Shares::default());
        let reserve = |client: &str, connection: &ConnectionBuffered| reserve(&buffers, ip(client), connection, CAPS);
        let (first, second) = (ConnectionBuffered::default(), ConnectionBuffered::default());
        let mut a = reserve("2001:db8::1", &first);
        a.grow(60).expect("within both");
        let mut b = reserve("2001:db8::2", &first);
        assert!(b.grow(41).is_err(), "the connection holds 60 of 100");
        b.grow(40).expect("the connection's last 40");
        // The same /64 on another connection: the client's 150 hold 100 already.
        let mut c = reserve("2001:db8::3", &second);
        assert!(c.grow(51).is_err());
        c.grow(50).expect("the client's last 50");
        // A refused grow took nothing.
        assert_eq!((first.load(Ordering::Relaxed), second.load(Ordering::Relaxed)), (100, 50));
        let mut other = reserve("2001:db8:0:1::1", &second);
        other.grow(50).expect("another client, the second connection's last 50");
        drop(a);
        drop(c);
        assert_eq!((first.load(Ordering::Relaxed), second.load(Ordering::Relaxed)), (40, 50));
        let mut d = reserve("2001:db8::4", &second);
        assert!(d.grow(51).is_err(), "the second connection holds the other client's 50");
        drop((b, other));
        d.grow(100).expect("all given back");
        drop(d);
        assert_eq!(buffers.total(), 0, "no client left behind");
    }
}
