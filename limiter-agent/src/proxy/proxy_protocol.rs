//! Reading the PROXY protocol header a trusted balancer sends first on each
//! connection; the parser itself is `limiter_core::proxy_protocol`.

use tokio::io::{AsyncRead, AsyncReadExt};

use limiter_core::proxy_protocol::parse;
pub use limiter_core::proxy_protocol::{Accepted, Header, ParseError, SIGNATURE_BYTES, starts_like_header};

/// Why a connection's PROXY header was refused: the spec has the connection aborted,
/// so none of these is recoverable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyProtocolError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error("cannot read the PROXY header: {0}")]
    Io(#[from] std::io::Error),
    #[error("the connection closed before the PROXY header ended")]
    Closed,
}

/// Reads one PROXY header from the start of `io`. `buffered` is empty on entry; on
/// success it holds the bytes read past the header (the start of the client's own
/// stream, e.g. a TLS ClientHello), which the caller replays before reading `io` again.
/// Never reads more than [`Accepted::longest_header`] plus whatever one read call
/// returned past the header; never allocates more than that.
pub async fn read<R: AsyncRead + Unpin>(
    io: &mut R,
    accepted: Accepted,
    buffered: &mut Vec<u8>,
) -> Result<Header, ProxyProtocolError> {
    // One allocation of this is all a header takes, however the peer splits it.
    let limit = accepted.longest_header();
    buffered.clear();
    buffered.reserve_exact(limit);
    loop {
        if let Some((header, consumed)) = parse(buffered, accepted)? {
            buffered.drain(..consumed.min(buffered.len()));
            return Ok(header);
        }
        let room = limit.saturating_sub(buffered.len());
        // `take` keeps the read within the reserved capacity: a `Vec` at capacity grows.
        let read = (&mut *io).take(u64::try_from(room).unwrap_or(u64::MAX)).read_buf(buffered).await?;
        if read == 0 {
            return Err(ProxyProtocolError::Closed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use limiter_core::proxy_protocol::MAX_V2_BYTES;

    use super::*;

    /// A v2 PROXY header for `[2001:db8::1]:56324` → `[2001:db8::2]:443` with ALPN,
    /// authority and CRC32C TLVs, as HAProxy sends it.
    const V2_IPV6: &[u8] = b"\r\n\r\n\0\r\nQUIT\n\x21\x21\x00\x3e\
        \x20\x01\x0d\xb8\0\0\0\0\0\0\0\0\0\0\0\x01\x20\x01\x0d\xb8\0\0\0\0\0\0\0\0\0\0\0\x02\xdc\x04\x01\xbb\
        \x01\x00\x02h2\x02\x00\x0bexample.com\x03\x00\x04\xde\xad\xbe\xef";

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap_or_else(|_| panic!("{text} is not a socket address"))
    }

    fn valid_headers() -> [(&'static [u8], Header); 3] {
        [
            (b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n", Header::Proxied(addr("192.0.2.1:56324"))),
            (b"PROXY UNKNOWN\r\n", Header::Local),
            (V2_IPV6, Header::Proxied(addr("[2001:db8::1]:56324"))),
        ]
    }
    #[tokio::test]
    async fn read_leaves_the_bytes_past_the_header_buffered() {
        for (header, says) in valid_headers() {
            let stream = [header, b"\x16\x03\x01\x00\xa5client hello"].concat();
            let mut io = stream.as_slice();
            let mut buffered = Vec::new();
            let found = read(&mut io, Accepted::Any, &mut buffered).await;
            assert_eq!(found.unwrap_or_else(|e| panic!("{header:?}: {e}")), says);
            assert_eq!(buffered, b"\x16\x03\x01\x00\xa5client hello");
            assert!(io.is_empty());
        }
    }

    #[tokio::test]
    async fn read_waits_for_a_header_sent_in_pieces() {
        let header = V2_IPV6;
        let (mut client, mut server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for piece in header.chunks(5) {
                client.write_all(piece).await?;
                client.flush().await?;
                tokio::task::yield_now().await;
            }
            client.write_all(b"GET / HTTP/1.1\r\n").await?;
            // Kept open: `read` must not wait for more than the header.
            std::io::Result::Ok(client)
        });
        let mut buffered = Vec::new();
        let found = read(&mut server, Accepted::V2, &mut buffered).await;
        assert_eq!(found.unwrap_or_else(|e| panic!("{e}")), Header::Proxied(addr("[2001:db8::1]:56324")));
        let _client = writer.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("{e}"));
        let mut rest = vec![0; 16];
        let past = buffered.len();
        rest[..past].copy_from_slice(&buffered);
        server.read_exact(&mut rest[past..]).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
    }

    #[tokio::test]
    async fn read_refuses_a_connection_closed_mid_header() {
        for (header, _) in valid_headers() {
            let mut io = &header[..header.len() - 1];
            let mut buffered = Vec::new();
            let found = read(&mut io, Accepted::Any, &mut buffered).await;
            assert!(matches!(found, Err(ProxyProtocolError::Closed)), "{header:?}: {found:?}");
        }
    }

    #[tokio::test]
    async fn read_refuses_what_is_not_a_header() {
        let mut io = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".as_slice();
        let found = read(&mut io, Accepted::Any, &mut Vec::new()).await;
        assert!(matches!(found, Err(ProxyProtocolError::Parse(ParseError::NotHeader(Accepted::Any)))), "{found:?}");
    }

    #[tokio::test]
    async fn read_stops_at_the_limit_of_the_version() {
        let endless = [b"PROXY ".as_slice(), &[b'x'; 4000]].concat();
        let mut io = endless.as_slice();
        let mut buffered = Vec::new();
        let found = read(&mut io, Accepted::V1, &mut buffered).await;
        assert!(matches!(found, Err(ProxyProtocolError::Parse(ParseError::V1TooLong))), "{found:?}");
        assert_eq!(endless.len() - io.len(), Accepted::V1.longest_header());
        assert!(buffered.capacity() <= MAX_V2_BYTES);

        let mut io = endless.as_slice();
        let found = read(&mut io, Accepted::Any, &mut buffered).await;
        assert!(matches!(found, Err(ProxyProtocolError::Parse(ParseError::V1TooLong))), "{found:?}");
        assert_eq!(endless.len() - io.len(), MAX_V2_BYTES);

        // A v2 header whose address block claims MAX_V2_BYTES.
        let mut too_long = b"\r\n\r\n\0\r\nQUIT\n\x21\x11".to_vec();
        too_long.extend(u16::try_from(MAX_V2_BYTES).unwrap_or(u16::MAX).to_be_bytes());
        too_long.extend([0; MAX_V2_BYTES + 100]);
        let mut io = too_long.as_slice();
        let found = read(&mut io, Accepted::V2, &mut buffered).await;
        assert!(matches!(found, Err(ProxyProtocolError::Parse(ParseError::V2TooLong(_)))), "{found:?}");
        assert!(too_long.len() - io.len() <= MAX_V2_BYTES);
        assert!(buffered.capacity() <= MAX_V2_BYTES);
    }
}
