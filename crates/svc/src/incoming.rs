//! The accept loop of a gRPC listener, as a stream that ends when the listener is broken.
//!
//! tonic skips every accept error and serves on; a listener that can no longer accept (shut
//! down, closed under it) then spins quietly while the service still looks healthy. Here an
//! error that says the socket is not listening any more ends the stream, so the server returns
//! and the service's supervision ([`crate::Vital`]) stops the process. Errors of one connection
//! are skipped; others (out of file descriptors or memory) pause with backoff, as hyper does.

use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};

use crate::Backoff;

/// Pauses after resource errors of `accept` (EMFILE, ENOMEM, …): short, since connections
/// closing elsewhere free descriptors quickly, and capped so a recovered server resumes soon.
const ACCEPT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));

/// What an accept error means for the listener.
#[derive(Debug, PartialEq, Eq)]
enum AcceptError {
    /// One connection failed before it was accepted: accept the next one.
    Connection,
    /// The process is out of something (descriptors, memory): pause, then try again.
    Resources,
    /// The socket does not listen any more (`EINVAL`): nothing will ever be accepted.
    Broken,
}

fn classify(e: &std::io::Error) -> AcceptError {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
        | TimedOut => AcceptError::Connection,
        InvalidInput => AcceptError::Broken,
        _ => AcceptError::Resources,
    }
}

/// The connections of `listener`, with `TCP_NODELAY` set (small request/response messages:
/// without it, Nagle's algorithm and delayed ACKs add tens of ms to a lone call, and tonic sets
/// it only on listeners it binds itself). The stream ends, after an error log, when the
/// listener breaks.
pub fn tcp_incoming(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    futures::stream::unfold(
        (listener, ACCEPT_BACKOFF.attempts()),
        |(listener, mut pauses)| async move {
            loop {
                match listener.accept().await {
                    Ok((conn, _)) => {
                        pauses.reset();
                        if let Err(e) = conn.set_nodelay(true) {
                            tracing::debug!(error = %e, "setting TCP_NODELAY failed");
                        }
                        return Some((Ok(conn), (listener, pauses)));
                    }
                    Err(e) => match classify(&e) {
                        AcceptError::Connection => {
                            tracing::debug!(error = %e, "a connection failed before accept");
                        }
                        AcceptError::Resources => {
                            let pause = pauses.next_delay();
                            tracing::warn!(error = %e, ?pause, "accept failed; pausing");
                            tokio::time::sleep(pause).await;
                        }
                        AcceptError::Broken => {
                            tracing::error!(error = %e, "the listener cannot accept any more");
                            return None;
                        }
                    },
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use std::io::{Error, ErrorKind};

    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn accepts_until_the_listener_is_shut_down() {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let handle = std_listener.try_clone().unwrap();
        let mut conns = Box::pin(tcp_incoming(TcpListener::from_std(std_listener).unwrap()));
        let _client = TcpStream::connect(addr).await.unwrap();
        let conn = conns.next().await.unwrap().unwrap();
        assert!(conn.nodelay().unwrap());
        socket2::SockRef::from(&handle).shutdown(std::net::Shutdown::Read).unwrap();
        let end = tokio::time::timeout(Duration::from_secs(5), conns.next()).await;
        assert!(matches!(end, Ok(None)), "the stream ends when the listener breaks");
    }

    #[test]
    fn accept_errors_by_kind() {
        let k = |kind| classify(&Error::from(kind));
        assert_eq!(k(ErrorKind::ConnectionAborted), AcceptError::Connection);
        assert_eq!(k(ErrorKind::InvalidInput), AcceptError::Broken);
        assert_eq!(classify(&Error::from_raw_os_error(22)), AcceptError::Broken, "EINVAL");
        assert_eq!(classify(&Error::from_raw_os_error(24)), AcceptError::Resources, "EMFILE");
    }
}
