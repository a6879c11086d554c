//! The limits every call meets before a service sees it: a global cap on calls being handled
//! at once (across every connection), refused with RESOURCE_EXHAUSTED, and the request size
//! cap answered as INVALID_ARGUMENT naming it.
//!
//! tonic caps concurrency per connection only, and by queueing, not refusing: many
//! connections (or one client opening many) could still pile up calls, each holding its
//! decoded request, until the pod runs out of memory. Here a call past
//! [`LimitLayer::new`]'s limit is refused at once with RESOURCE_EXHAUSTED (clients retry it with
//! backoff) and counted, so an overload is visible and bounded.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Semaphore;
use tonic::{Code, Status};

/// Default of `--max-concurrent-calls`: each worker holds about one call per sync slot plus
/// its long poll (6 at the default `--concurrency 5`), so 512 serves some 80 workers on one
/// replica; past it, kjob-queue replicas scale out.
pub const DEFAULT_MAX_CONCURRENT_CALLS: usize = 512;

/// The limit's handles: the calls being handled, and the refusals.
#[derive(Clone, Debug, Default)]
pub struct LimitMetrics {
    /// `kjob_queue_calls_in_flight`.
    pub in_flight: Gauge,
    /// `kjob_queue_calls_refused_total`: refused for the concurrency limit.
    pub refused: Counter,
}

/// The tower layer of the global concurrency limit and the request size answer.
#[derive(Clone, Debug)]
pub struct LimitLayer {
    permits: Arc<Semaphore>,
    max: usize,
    metrics: LimitMetrics,
}

impl LimitLayer {
    /// At most `max` calls handled at once, counted in `metrics`.
    pub fn new(max: usize, metrics: LimitMetrics) -> Self {
        Self { permits: Arc::new(Semaphore::new(max)), max, metrics }
    }
}

impl<S> tower::Layer<S> for LimitLayer {
    type Service = Limit<S>;

    fn layer(&self, inner: S) -> Limit<S> {
        Limit { inner, layer: self.clone() }
    }
}

/// The service [`LimitLayer`] wraps around the gRPC routes.
#[derive(Clone, Debug)]
pub struct Limit<S> {
    inner: S,
    layer: LimitLayer,
}

type Response = http::Response<tonic::body::Body>;

impl<S, B> tower::Service<http::Request<B>> for Limit<S>
where
    S: tower::Service<http::Request<B>, Response = Response>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let Ok(permit) = self.layer.permits.clone().try_acquire_owned() else {
            self.layer.metrics.refused.inc();
            tracing::debug!(path = req.uri().path(), "call refused: concurrency limit");
            let status = Status::resource_exhausted(format!(
                "kjob-queue is handling {} calls, its limit (--max-concurrent-calls); retry \
                 with backoff",
                self.layer.max
            ));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        let in_flight = self.layer.metrics.in_flight.clone();
        in_flight.inc();
        let call = self.inner.call(req);
        Box::pin(async move {
            let res = call.await;
            in_flight.dec();
            drop(permit);
            res.map(oversized_request)
        })
    }
}

/// tonic answers a request past the decoding limit with OUT_OF_RANGE ("decoded message length
/// too large"), which names no kjob limit and which kjob's clients would not recognise.
/// INVALID_ARGUMENT says what it is to them: this request will never pass as it is, send less
/// (the watcher's sender then sends its items one by one); RESOURCE_EXHAUSTED stays the
/// transient refusal, retried with backoff. kjob's handlers never answer OUT_OF_RANGE, so every
/// such answer is this one.
fn oversized_request(resp: Response) -> Response {
    match Status::from_header_map(resp.headers()) {
        Some(s) if s.code() == Code::OutOfRange => Status::invalid_argument(format!(
            "request too large for kjob-queue's limit of {} bytes (MAX_REQUEST_BYTES): {}",
            kjob_core::MAX_REQUEST_BYTES,
            s.message()
        ))
        .into_http(),
        _ => resp,
    }
}
