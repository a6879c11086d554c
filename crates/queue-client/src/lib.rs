//! Typed client of kjob-queue with retries and backoff.
//!
//! Its methods speak kjob's queue vocabulary ([`kjob_core::queue`]: [`Leased`], [`JobView`],
//! [`Done`], …); the wire forms stay behind them, converted in `kjob_proto::convert`.
//!
//! One [`QueueClient`] wraps one lazily connected tonic channel; clone it freely (clones share
//! the channel). Transport failures and `UNAVAILABLE` are retried with capped exponential
//! backoff plus jitter, as the [`RetryPolicy`] says (by default forever); `INVALID_ARGUMENT`,
//! `FAILED_PRECONDITION` and the other definite answers are returned at once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kjob_queue_client::ClientError> {
//! use kjob_queue_client::{AddItem, QueueClient};
//! let client = QueueClient::connect_lazy("http://127.0.0.1:50051")?;
//! client.add(vec![AddItem { queue: "job".into(), key: "default/pi".into(), ..Default::default() }]).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

mod security;

use kjob_core::events::{GateEvent, Gated};
pub use kjob_core::queue::{AddAnswer, AddItem};
pub use kjob_core::{
    CachedView, Done, DoneAnswer, FinalizerRemovals, JobExpectations, JobView, Leased,
    SetExpectations, ViewRecord, ViewWriteBack,
};
use kjob_proto::convert::millis;
pub use kjob_proto::v1;
use kjob_proto::v1::job_state_client::JobStateClient;
use kjob_proto::v1::queue_client::QueueClient as RawQueueClient;
use kjob_svc::Backoff;
pub use security::{QueueSecurity, QueueTlsArgs};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

/// Largest request sent and largest reply accepted: kjob-queue's own limits (their why is
/// there). A request past the first fails here, before it is sent.
pub use kjob_core::{MAX_REPLY_BYTES, MAX_REQUEST_BYTES};
/// How often a whole-view read begins again when the view changed under it: a view that
/// changes during two reads in a row belongs to a Job busy enough that the API server's
/// consistent LIST (the untrusted path) is the better read.
pub const VIEW_READ_ATTEMPTS: usize = 2;

/// What a paged read of a Job's shared view found ([`QueueClient::read_job_view`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ViewPages {
    /// The whole view, at one version (`next_page` empty).
    Trusted(Box<JobView>),
    /// The view is not trusted: read the API server.
    Untrusted,
    /// The view changed while its pages were read: nothing of it may be planned from.
    Moved,
}

/// Connecting to the server must not hang longer than this; a retry follows.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of a unary call, on top of the long-poll wait for Lease: Redis scripts are bounded,
/// so a healthy server answers far sooner.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of a readiness probe ([`QueueClient::answers`]): well inside a probe period.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 pings keep idle connections (a worker waiting in Lease) alive through middleboxes and
/// notice a dead server without waiting for the request timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// How failed calls are retried.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Delay before the first retry.
    pub initial_backoff: Duration,
    /// Longest delay between two attempts.
    pub max_backoff: Duration,
    /// Give up after this many retries (`None` = never give up).
    pub max_retries: Option<u32>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_retries: None,
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries (errors come back at once).
    pub fn no_retries() -> Self {
        Self { max_retries: Some(0), ..Self::default() }
    }

    /// The retry delays: initial · 2^attempt, capped at `max_backoff`; the delay actually slept
    /// is jittered ([`Backoff::jittered`]), so many clients that lost the server together do
    /// not come back in lockstep.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.initial_backoff, self.max_backoff)
    }
}

/// Errors of the queue client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The lease id is stale: the lease expired and the key may be held by someone else.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// The server refused the request as malformed (never retried).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The server or its Redis is unreachable and the retry policy gave up.
    #[error("queue unavailable: {0}")]
    Unavailable(String),
    /// The URL given to [`QueueClient::connect_lazy`] is not usable.
    #[error("invalid queue url {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// Any other gRPC status.
    #[error("queue call failed: {0}")]
    Status(Box<Status>),
}

impl ClientError {
    /// Whether retrying the same call later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, ClientError::Unavailable(_))
    }
}

/// Classifies a status: `true` when the call may be retried.
fn retryable(status: &Status) -> bool {
    // Transport errors surface as UNAVAILABLE (or UNKNOWN carrying a transport source);
    // DEADLINE_EXCEEDED is a call that did not get through in time. All are safe to resend:
    // Add, Lease and the expectation calls tolerate a duplicate, and a duplicate Done/Renew
    // comes back as LeaseLost, which the worker treats as "someone else owns the key now".
    // RESOURCE_EXHAUSTED is kjob-queue at its concurrency limit (it answers an oversized
    // request with INVALID_ARGUMENT): the call is refused before any work, so it is resent
    // after the policy's backoff.
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::ResourceExhausted
    ) || (status.code() == Code::Unknown && std::error::Error::source(status).is_some())
}

fn from_status(status: Status) -> ClientError {
    match status.code() {
        Code::InvalidArgument => ClientError::InvalidArgument(status.message().to_string()),
        Code::FailedPrecondition => ClientError::LeaseLost(status.message().to_string()),
        _ if retryable(&status) => {
            ClientError::Unavailable(format!("{}: {}", status.code(), status.message()))
        }
        _ => ClientError::Status(Box::new(status)),
    }
}

/// How a finished lease ends (kjob's one lease outcome; `DoneOutcome` on the wire).
pub use kjob_core::LeaseOutcome as Outcome;

/// Most items one [`QueueClient::done_many`] call takes (the server's DoneBatch limit).
pub use kjob_core::MAX_DONE_BATCH;

/// One lease to finish with [`QueueClient::done_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoneItem {
    /// Queue name.
    pub queue: String,
    /// Item key, `namespace/name`.
    pub key: String,
    /// The lease's fencing id.
    pub lease_id: String,
    /// How the lease ends.
    pub outcome: Outcome,
}

impl DoneItem {
    fn to_proto(&self) -> v1::DoneRequest {
        Done::new(&self.queue, &self.key, &self.lease_id, self.outcome).into()
    }
}

/// One result per Done, as [`QueueClient::done`] returns it.
pub type DoneResults = Vec<Result<DoneAnswer, ClientError>>;

/// What a [`QueueClient::lease_finishing`] call asks for.
#[derive(Debug, Clone, Copy)]
pub struct LeaseCall<'a> {
    /// Queue name.
    pub queue: &'a str,
    /// Most keys to lease.
    pub max_items: u32,
    /// Lease duration.
    pub lease: Duration,
    /// Long-poll wait for the first ready key.
    pub wait: Duration,
    /// Identity of the lessee.
    pub worker_id: &'a str,
    /// Job queue only: bring each key's view with these per-Job records.
    pub records: Option<&'a [&'a str]>,
    /// With `records`: the lessee caches views decoded. `Some` asks for views with their
    /// pods' names, and for the views it names (those it holds) as deltas when they can be.
    pub cached: Option<&'a [CachedView]>,
}

/// Maps one DoneBatch item result onto what [`QueueClient::done`] would have returned.
fn done_item_result(r: v1::DoneItemResult) -> Result<DoneAnswer, ClientError> {
    match Code::from(r.code) {
        Code::Ok => Ok(DoneAnswer { requeued: r.requeued, ready_unix_ms: r.ready_unix_ms }),
        code => Err(from_status(Status::new(code, r.message))),
    }
}

/// The Lease request for up to `max_items` keys of `queue` (without views).
fn lease_request(
    queue: &str,
    max_items: u32,
    lease: Duration,
    wait: Duration,
    worker_id: &str,
) -> v1::LeaseRequest {
    v1::LeaseRequest {
        queue: queue.to_string(),
        max_items,
        lease_ms: millis(lease),
        wait_ms: millis(wait),
        worker_id: worker_id.to_string(),
        ..Default::default()
    }
}

/// One unary call through [`QueueClient::call`]: `rpc!(self, queue.add(msg))` sends `msg` with
/// `add` on a clone of `self.queue`, under the retry policy, with a deadline of
/// [`REQUEST_TIMEOUT`] unless one is given.
macro_rules! rpc {
    ($self:ident, $client:ident . $method:ident ($msg:expr)) => {
        rpc!($self, $client.$method($msg), REQUEST_TIMEOUT)
    };
    ($self:ident, $client:ident . $method:ident ($msg:expr), $timeout:expr) => {
        $self.call(stringify!($method), $timeout, &$self.$client, $msg, |mut c, r| async move {
            c.$method(r).await
        })
    };
}

/// A cheap, cloneable client of the kjob-queue `Queue` and `Expectations` services.
#[derive(Debug, Clone)]
pub struct QueueClient {
    queue: RawQueueClient<Channel>,
    job_state: JobStateClient<Channel>,
    retry: RetryPolicy,
}

impl QueueClient {
    /// Creates a plaintext client for `url` (e.g. `http://127.0.0.1:50051`, a kjob-queue run
    /// with `--insecure-no-auth`) without connecting yet; the first call connects, and later
    /// calls reconnect after failures.
    pub fn connect_lazy(url: &str) -> Result<Self, ClientError> {
        Self::connect_lazy_with(url, &QueueSecurity::Insecure)
    }

    /// [`Self::connect_lazy`] secured by `security`: mTLS for an `https://` URL, plaintext for
    /// an `http://` one; any other pairing is an error.
    pub fn connect_lazy_with(url: &str, security: &QueueSecurity) -> Result<Self, ClientError> {
        let invalid = |reason: String| ClientError::InvalidUrl { url: url.to_string(), reason };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid("expected http://host:port".into()));
        }
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| invalid(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_while_idle(true);
        if let Some(tls) = security.tls_for(url)? {
            endpoint = endpoint.tls_config(tls).map_err(|e| invalid(e.to_string()))?;
        }
        let channel = endpoint.connect_lazy();
        Ok(Self {
            queue: RawQueueClient::new(channel.clone())
                .max_decoding_message_size(MAX_REPLY_BYTES)
                .max_encoding_message_size(MAX_REQUEST_BYTES),
            job_state: JobStateClient::new(channel)
                .max_decoding_message_size(MAX_REPLY_BYTES)
                .max_encoding_message_size(MAX_REQUEST_BYTES),
            retry: RetryPolicy::default(),
        })
    }

    /// Returns the client with another retry policy.
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sends `msg` with `rpc` on a clone of `client` (deadline `timeout`) until the call
    /// succeeds, fails definitely, or the retry policy gives up.
    async fn call<C, Req, T, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        client: &C,
        msg: Req,
        rpc: impl Fn(C, Request<Req>) -> Fut,
    ) -> Result<T, ClientError>
    where
        C: Clone,
        Req: Clone,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut attempt = 0u32;
        loop {
            let mut req = Request::new(msg.clone());
            req.set_timeout(timeout);
            let res =
                tokio::time::timeout(timeout + Duration::from_secs(1), rpc(client.clone(), req))
                    .await;
            let status = match res {
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) => status,
                // Belt and braces: the grpc-timeout header normally ends the call first.
                Err(_) => Status::deadline_exceeded(format!("{what} timed out after {timeout:?}")),
            };
            if !retryable(&status) {
                return Err(from_status(status));
            }
            if self.retry.max_retries.is_some_and(|max| attempt >= max) {
                return Err(from_status(status));
            }
            let delay = self.retry.backoff().jittered(attempt);
            tracing::warn!(call = what, attempt, error = %status.message(), code = ?status.code(), ?delay, "queue call failed; retrying");
            tokio::time::sleep(delay).await;
            attempt = attempt.saturating_add(1);
        }
    }

    /// Whether the queue service answers now: one Stats call of the Job queue, not retried,
    /// within `PROBE_TIMEOUT` (2 s) (the readiness probe of every kjob-queue client).
    pub async fn answers(&self) -> bool {
        let msg = v1::StatsRequest { queue: kjob_core::JOB_QUEUE.to_string() };
        let probe = Self { retry: RetryPolicy::no_retries(), ..self.clone() };
        rpc!(probe, queue.stats(msg), PROBE_TIMEOUT).await.is_ok()
    }

    /// Finishes a lease with `outcome`. A stale id is [`ClientError::LeaseLost`].
    pub async fn done(
        &self,
        queue: &str,
        key: &str,
        lease_id: &str,
        outcome: Outcome,
    ) -> Result<DoneAnswer, ClientError> {
        self.done_as(&Done::new(queue, key, lease_id, outcome)).await
    }

    /// Leases up to `max_items` keys of `queue` (with their views and `records` when `records`
    /// is given; Job queue only) after finishing the leases of `dones` in the same call (at most
    /// [`MAX_DONE_BATCH`]), so a lessee hands in its finished leases with the call that refills
    /// its slots. Besides the leased items, one result per Done as [`Self::done`] would return
    /// it (a stale lease is [`ClientError::LeaseLost`] for that item only). An error is the
    /// call's (nothing leased; the Dones may or may not have been applied, so the caller sends
    /// them again, and any applied meanwhile come back stale).
    pub async fn lease_finishing(
        &self,
        request: LeaseCall<'_>,
        dones: Vec<Done>,
    ) -> Result<(Vec<Leased>, DoneResults), ClientError> {
        let LeaseCall { queue, max_items, lease, wait, worker_id, records, cached } = request;
        let carried = dones.len();
        let msg = v1::LeaseRequest {
            with_views: records.is_some(),
            view_records: records.unwrap_or_default().iter().map(|r| owned(r)).collect(),
            cached_views: cached.unwrap_or_default().iter().map(Into::into).collect(),
            view_names: cached.is_some(),
            dones: dones.into_iter().map(Into::into).collect(),
            ..lease_request(queue, max_items, lease, wait, worker_id)
        };
        let resp = rpc!(self, queue.lease(msg), wait + REQUEST_TIMEOUT).await?;
        if resp.done_results.len() != carried {
            return Err(ClientError::Status(Box::new(Status::internal(format!(
                "Lease answered {} Done results for {carried} Dones",
                resp.done_results.len()
            )))));
        }
        let results = resp.done_results.into_iter().map(done_item_result).collect();
        Ok((resp.items.into_iter().map(Leased::from).collect(), results))
    }

    /// Reads the whole shared view of Job `key` page by page, beginning with `first` when the
    /// caller has the first page already (a Lease brought it) or else asking for it with the
    /// per-Job `records`. The pages must all be of one version of the view and hold as many
    /// distinct pods as the view counts at that version; otherwise the view changed during the
    /// read ([`ViewPages::Moved`]: read again, or read the API server).
    pub async fn read_job_view(
        &self,
        key: &str,
        records: &[&str],
        first: Option<JobView>,
    ) -> Result<ViewPages, ClientError> {
        let view = match first {
            Some(v) => v,
            None => self.get_job_view_page(key, records, "").await?,
        };
        self.read_pages(key, view, false).await
    }

    /// [`Self::read_job_view`] for a reader that caches the view's pods by name: the pages
    /// carry `pod_names`, and with `base` (the version and epoch token of the view it holds)
    /// the answer may be a delta from it (`JobView::delta`: no pages follow; the caller
    /// applies it to what it holds and checks the count).
    pub async fn read_job_view_cached(
        &self,
        key: &str,
        records: &[&str],
        first: Option<JobView>,
        base: Option<(u64, &str)>,
    ) -> Result<ViewPages, ClientError> {
        let view = match first {
            Some(v) => v,
            None => {
                let (version, epoch) = base.map_or((None, ""), |(v, e)| (Some(v), e));
                self.get_job_view_since(key, records, version, epoch).await?
            }
        };
        if view.delta && view.trusted {
            return Ok(ViewPages::Trusted(Box::new(view)));
        }
        self.read_pages(key, view, true).await
    }

    /// The rest of a paged read begun with `view`, its first page (later pages with their
    /// pods' names when `names`).
    async fn read_pages(
        &self,
        key: &str,
        mut view: JobView,
        names: bool,
    ) -> Result<ViewPages, ClientError> {
        if view.moved {
            return Ok(ViewPages::Moved);
        }
        if !view.trusted {
            return Ok(ViewPages::Untrusted);
        }
        while !view.next_page.is_empty() {
            let page = if names {
                self.get_job_view_named_page(key, &view.next_page).await?
            } else {
                self.get_job_view_page(key, &[], &view.next_page).await?
            };
            if page.moved || (page.trusted && page.version != view.version) {
                return Ok(ViewPages::Moved);
            }
            if !page.trusted {
                return Ok(ViewPages::Untrusted);
            }
            view.pods.extend(page.pods);
            view.pod_names.extend(page.pod_names);
            view.next_page = page.next_page;
        }
        if let Some(count) = view.pod_count {
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            // HSCAN returns a pod twice when the hash was resized between pages; at one version
            // the copies are the same bytes. Sorting costs only then.
            if view.pods.len() > count && view.pod_names.len() == view.pods.len() {
                let mut named: Vec<(String, Vec<u8>)> =
                    view.pod_names.drain(..).zip(view.pods.drain(..)).collect();
                named.sort_unstable();
                named.dedup();
                (view.pod_names, view.pods) = named.into_iter().unzip();
            } else if view.pods.len() > count {
                view.pod_names.clear();
                view.pods.sort_unstable();
                view.pods.dedup();
            }
            if view.pods.len() != count {
                return Ok(ViewPages::Moved);
            }
        }
        Ok(ViewPages::Trusted(Box::new(view)))
    }

    /// The shared view of Job `key` with the per-Job `records` asked for, whole
    /// ([`Self::read_job_view`], begun again up to [`VIEW_READ_ATTEMPTS`] times while it
    /// changes under the read); `None` when it is not trusted or kept changing.
    pub async fn get_job_view(
        &self,
        key: &str,
        records: &[&str],
    ) -> Result<Option<JobView>, ClientError> {
        for _ in 0..VIEW_READ_ATTEMPTS {
            match self.read_job_view(key, records, None).await? {
                ViewPages::Trusted(v) => return Ok(Some(*v)),
                ViewPages::Untrusted => return Ok(None),
                ViewPages::Moved => {}
            }
        }
        Ok(None)
    }

    /// Finishes up to [`MAX_DONE_BATCH`] leases in one DoneBatch call, with the retry policy of
    /// [`Self::done`]. The outer error is the call's (nothing applied, or bad input); otherwise
    /// one result per item in order, as `done` would return it: a stale lease is
    /// [`ClientError::LeaseLost`] for that item only. An empty list makes no call.
    pub async fn done_many(&self, items: &[DoneItem]) -> Result<DoneResults, ClientError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let msg = v1::DoneBatchRequest { items: items.iter().map(DoneItem::to_proto).collect() };
        let resp = rpc!(self, queue.done_batch(msg)).await?;
        if resp.results.len() != items.len() {
            return Err(ClientError::Status(Box::new(Status::internal(format!(
                "DoneBatch answered {} results for {} items",
                resp.results.len(),
                items.len()
            )))));
        }
        Ok(resp.results.into_iter().map(done_item_result).collect())
    }
}

/// The unary calls whose wrapper only builds the request from its arguments and picks the part
/// of the reply its callers use: each entry says arguments, request and answer, and every one is
/// sent through [`QueueClient::call`] (retry policy, a deadline of [`REQUEST_TIMEOUT`] unless
/// `within` gives another).
macro_rules! unary_calls {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),*) -> $out:ty
            = $client:ident.$method:ident($msg:expr) $(within $timeout:expr)?
            => |$r:pat_param| $answer:expr;
    )*) => {
        impl QueueClient {$(
            $(#[doc = $doc])*
            pub async fn $name(&self, $($arg: $ty),*) -> Result<$out, ClientError> {
                let $r = rpc!(self, $client.$method($msg) $(, $timeout)?).await?;
                Ok($answer)
            }
        )*}
    };
}

/// A string argument as the request's owned field.
fn owned(v: &str) -> String {
    v.to_string()
}

unary_calls! {
    /// Enqueues a batch; returns once Redis has applied every item.
    fn add(items: Vec<AddItem>) -> AddAnswer
        = queue.add(v1::AddRequest { items: items.iter().map(Into::into).collect() })
        => |r| r.into();

    /// Leases up to `max_items` ready keys of `queue`, waiting up to `wait` for the first.
    fn lease(queue: &str, max_items: u32, lease: Duration, wait: Duration, worker_id: &str)
        -> Vec<Leased>
        = queue.lease(lease_request(queue, max_items, lease, wait, worker_id))
        within wait + REQUEST_TIMEOUT => |r| r.items.into_iter().map(Leased::from).collect();

    /// [`Self::lease`] of the Job queue that also brings each leased key's shared view (with
    /// the per-Job `records`), read by the queue service right after granting the lease (or,
    /// for a key an Add hands to this waiting Lease, by that Add's own script): the lessee can
    /// plan without a [`Self::get_job_view`] call. An item without a view (a read that failed)
    /// needs that call.
    fn lease_with_views(
        queue: &str, max_items: u32, lease: Duration, wait: Duration, worker_id: &str,
        records: &[&str]
    ) -> Vec<Leased>
        = queue.lease(v1::LeaseRequest {
            with_views: true,
            view_records: records.iter().map(|r| owned(r)).collect(),
            ..lease_request(queue, max_items, lease, wait, worker_id)
        }) within wait + REQUEST_TIMEOUT => |r| r.items.into_iter().map(Leased::from).collect();

    /// Extends a lease; returns the new deadline (Unix ms). A stale id is
    /// [`ClientError::LeaseLost`].
    fn renew(queue: &str, key: &str, lease_id: &str, lease: Duration) -> i64
        = queue.renew(v1::RenewRequest {
            queue: owned(queue), key: owned(key), lease_id: owned(lease_id), lease_ms: millis(lease)
        }) => |r| r.deadline_unix_ms;

    /// [`Self::done`] that first writes a Job object back into the key's shared view (as
    /// [`Self::put_job_view`] would; Job queue only), in the same call.
    fn done_writing_back(
        queue: &str, key: &str, lease_id: &str, outcome: Outcome,
        view_write_back: Option<ViewWriteBack>
    ) -> DoneAnswer
        = queue.done(Done {
            view_write_back, ..Done::new(queue, key, lease_id, outcome)
        }.into()) => |r| r.into();

    /// Sends a Done built by the caller (e.g. one carrying expectations).
    fn done_as(done: &Done) -> DoneAnswer
        = queue.done(done.clone().into()) => |r| r.into();

    /// Replaces the expectations of Job `key` (UID `job_uid`).
    fn set_expectations(key: &str, job_uid: &str, add: i64, del: i64) -> ()
        = job_state.set_expectations(v1::SetExpectationsRequest {
            key: owned(key), job_uid: owned(job_uid), add, del, created_pod_uids: Vec::new()
        }) => |_| ();

    /// Replaces the expectations of Job `key` after its sync created the pods `created` (their
    /// UIDs; `add` counts them and any create of unknown outcome): the created pods the
    /// watcher has observed already are not expected.
    fn set_expectations_created(
        key: &str, job_uid: &str, add: i64, del: i64, created: &[String]
    ) -> ()
        = job_state.set_expectations(v1::SetExpectationsRequest {
            key: owned(key), job_uid: owned(job_uid), add, del, created_pod_uids: created.to_vec()
        }) => |_| ();

    /// Lowers existing expectations of Job `key` by `add`/`del` (no-op without a record).
    fn lower_expectations(key: &str, job_uid: &str, add: i64, del: i64) -> ()
        = job_state.lower_expectations(v1::LowerExpectationsRequest {
            key: owned(key), job_uid: owned(job_uid), add, del
        }) => |_| ();

    /// Reads the expectations of Job `key` as seen by a Job with UID `job_uid`.
    fn get_expectations(key: &str, job_uid: &str) -> JobExpectations
        = job_state.get_expectations(v1::GetExpectationsRequest {
            key: owned(key), job_uid: owned(job_uid)
        }) => |r| r.into();

    /// Deletes the expectations, finalizer-removal set and records of Job `key`.
    fn delete_expectations(key: &str) -> ()
        = job_state.delete_expectations(v1::DeleteExpectationsRequest { key: owned(key) })
        => |_| ();

    /// Adds pod UIDs whose tracking-finalizer removal is in flight for Job `key`.
    fn expect_finalizer_removals(key: &str, job_uid: &str, pod_uids: Vec<String>) -> ()
        = job_state.expect_finalizer_removals(v1::ExpectFinalizerRemovalsRequest {
            key: owned(key), job_uid: owned(job_uid), pod_uids
        }) => |_| ();

    /// Drops pod UIDs from Job `key`'s in-flight finalizer-removal set (their removals failed);
    /// returns how many were in it.
    fn forget_finalizer_removals(key: &str, pod_uids: Vec<String>) -> u32
        = job_state.forget_finalizer_removals(v1::ForgetFinalizerRemovalsRequest {
            key: owned(key), pod_uids
        }) => |r| r.forgotten;

    /// Reads the record `name` of Job `key`.
    fn get_record(key: &str, name: &str) -> Option<Vec<u8>>
        = job_state.get_record(v1::GetRecordRequest { key: owned(key), name: owned(name) })
        => |r| r.found.then_some(r.value);

    /// Writes the record `name` of Job `key`, optionally expiring after `ttl`.
    fn put_record(key: &str, name: &str, value: Vec<u8>, ttl: Option<Duration>) -> ()
        = job_state.put_record(v1::PutRecordRequest {
            key: owned(key), name: owned(name), value, ttl_ms: ttl.map(millis).unwrap_or(0)
        }) => |_| ();

    /// Removes record `name` of Job `key`; whether it existed.
    fn delete_record(key: &str, name: &str) -> bool
        = job_state.delete_record(v1::DeleteRecordRequest { key: owned(key), name: owned(name) })
        => |r| r.deleted;

    /// Reads one page of the shared view of Job `key`: the first (`page` empty, with the
    /// per-Job `records` asked for) or the one a page's `next_page` names. See
    /// [`Self::read_job_view`] for the whole view.
    fn get_job_view_page(key: &str, records: &[&str], page: &str) -> JobView
        = job_state.get_job_view(v1::GetJobViewRequest {
            key: owned(key), records: records.iter().map(|r| owned(r)).collect(), paged: true,
            page: owned(page), ..Default::default()
        }) => |r| r.into();

    /// A later page (`page`, a page's `next_page`) of the shared view of Job `key`, with its
    /// pods' names.
    fn get_job_view_named_page(key: &str, page: &str) -> JobView
        = job_state.get_job_view(v1::GetJobViewRequest {
            key: owned(key), paged: true, page: owned(page), with_names: true,
            ..Default::default()
        }) => |r| r.into();

    /// The first page of the shared view of Job `key` with its pods' names, or, with
    /// `base_version` (and the `base_epoch` token of the read that gave it), a delta from
    /// that version when the view's change log can say. See [`Self::read_job_view_cached`].
    fn get_job_view_since(
        key: &str, records: &[&str], base_version: Option<u64>, base_epoch: &str
    ) -> JobView
        = job_state.get_job_view(v1::GetJobViewRequest {
            key: owned(key), records: records.iter().map(|r| owned(r)).collect(), paged: true,
            base_version, base_epoch: owned(base_epoch), with_names: true, ..Default::default()
        }) => |r| r.into();

    /// Writes back a Job object (as the API server returned it) into the shared view of `key`,
    /// and acknowledges `orphans_handled` orphan notices; returns whether the object was stored.
    fn put_job_view(
        key: &str, job_uid: &str, job: Vec<u8>, resource_version: &str, orphans_handled: u64
    ) -> bool
        = job_state.put_job_view(v1::PutJobViewRequest {
            key: owned(key), job_uid: owned(job_uid), job, resource_version: owned(resource_version),
            orphans_handled
        }) => |r| r.stored;

    /// Begins, commits or ends a watcher's view session; returns whether it applied.
    fn cache_session(session: &str, phase: v1::CacheSessionPhase) -> bool
        = job_state.cache_session(v1::CacheSessionRequest {
            session: owned(session), phase: phase as i32
        }) => |r| r.applied;

    /// Passes a batch of events through the shared aggregator and spam filter; one answer per
    /// event, in order.
    fn gate_events(events: Vec<GateEvent>) -> Vec<Gated>
        = job_state.gate_events(v1::GateEventsRequest {
            events: events.into_iter().map(Into::into).collect()
        }) => |r| r.events.into_iter().map(Into::into).collect();

    /// Takes up to `want` tokens of the workers' shared API budget (`qps`/`burst` total) for
    /// requests in `namespace`, reporting the `throttled` 429s got since the last call.
    fn take_api_tokens(namespace: &str, want: u32, qps: f64, burst: u32, throttled: u32)
        -> v1::TakeApiTokensResponse
        = job_state.take_api_tokens(v1::TakeApiTokensRequest {
            namespace: owned(namespace), want, qps, burst, throttled
        }) => |r| r;

    /// Replaces the fair lease's namespace weights (namespaces not in `weights` get 1);
    /// returns how many namespaces are weighted other than 1 now.
    fn set_namespace_weights(weights: std::collections::HashMap<String, u32>) -> u32
        = job_state.set_namespace_weights(v1::SetNamespaceWeightsRequest { weights })
        => |r| r.weighted;

    /// Reports the depth of each part of `queue`.
    fn stats(queue: &str) -> v1::StatsResponse
        = queue.stats(v1::StatsRequest { queue: owned(queue) }) => |r| r;

    /// Reports what `queue` knows about `keys`.
    fn inspect(queue: &str, keys: Vec<String>) -> v1::InspectResponse
        = queue.inspect(v1::InspectRequest { queue: owned(queue), keys }) => |r| r;

    /// Reports `queue` per namespace, deepest first (at most `limit`; of `namespace` only when
    /// it is not empty), with its `oldest_keys` longest waiting ready keys.
    fn namespaces(queue: &str, namespace: &str, limit: u32, oldest_keys: u32)
        -> v1::NamespacesResponse
        = queue.namespaces(v1::NamespacesRequest {
            queue: owned(queue), namespace: owned(namespace), limit, oldest_keys
        }) => |r| r;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            max_retries: None,
        };
        let b = p.backoff();
        let got: Vec<u128> = (0..6).map(|a| b.delay(a).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
        for a in 0..8 {
            let j = b.jittered(a);
            assert!(j <= b.delay(a) && j >= b.delay(a) / 2, "{a}: {j:?}");
        }
    }

    #[test]
    fn done_item_results_map_like_done() {
        let ok = v1::DoneItemResult {
            code: 0,
            message: String::new(),
            requeued: true,
            ready_unix_ms: 7,
        };
        let r = done_item_result(ok).unwrap();
        assert_eq!((r.requeued, r.ready_unix_ms), (true, 7));
        let stale = v1::DoneItemResult { code: 9, message: "gone".into(), ..Default::default() };
        assert!(matches!(done_item_result(stale), Err(ClientError::LeaseLost(m)) if m == "gone"));
        let other = v1::DoneItemResult { code: 13, message: "x".into(), ..Default::default() };
        assert!(matches!(done_item_result(other), Err(ClientError::Status(_))));
    }

    #[test]
    fn status_mapping() {
        assert!(matches!(
            from_status(Status::invalid_argument("bad key")),
            ClientError::InvalidArgument(m) if m == "bad key"
        ));
        assert!(matches!(
            from_status(Status::failed_precondition("stale")),
            ClientError::LeaseLost(_)
        ));
        assert!(matches!(
            from_status(Status::unavailable("redis down")),
            ClientError::Unavailable(_)
        ));
        assert!(matches!(from_status(Status::not_found("x")), ClientError::Status(_)));
        assert!(retryable(&Status::unavailable("x")));
        assert!(retryable(&Status::resource_exhausted("x")));
        assert!(!retryable(&Status::invalid_argument("x")));
        assert!(!retryable(&Status::failed_precondition("x")));
    }

    #[test]
    fn refuses_bad_urls() {
        assert!(matches!(
            QueueClient::connect_lazy("127.0.0.1:50051"),
            Err(ClientError::InvalidUrl { .. })
        ));
    }

    #[tokio::test]
    async fn unreachable_server_is_unavailable_after_the_policy_gives_up() {
        // A port nothing listens on: bind, learn the port, close.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let client = QueueClient::connect_lazy(&format!("http://127.0.0.1:{port}"))
            .unwrap()
            .with_retry_policy(RetryPolicy {
                initial_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_millis(20),
                max_retries: Some(2),
            });
        let started = std::time::Instant::now();
        let err = client.stats("job").await.unwrap_err();
        assert!(err.is_transient(), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
