//! The gRPC edge: validation, mapping onto the store, error codes and metrics.
//!
//! Every RPC is measured the same way: the trait method makes one [`crate::metrics::Rpc`] on
//! entry and ends it with the code of whatever the handler returned, so started / handled (by
//! code) / latency hold for every exit. The handlers (`*_rpc`) only validate, call the store
//! and map errors to precise codes.

use std::future::Future;
use std::time::Duration;

use kjob_proto::convert::outcome_from_wire;
use kjob_proto::v1;
use kjob_proto::v1::job_state_server::{self, JobState};
use kjob_proto::v1::queue_server::{self, Queue};
use kjob_svc::Shutdown;
use kjob_workqueue::budget::TokenAsk;
use kjob_workqueue::events::{EventGateConfig, GateEvent};
use kjob_workqueue::{
    Done, DoneResult, Enqueue, FinalizerRemovals, LeaseAsk, Observation, ObservationKind,
    SessionPhase, Store, SyncCounter, ViewChanges, ViewCursor, ViewDelta, ViewOp, ViewPage, Waker,
    WqError,
};
use tonic::{Request, Response, Status};

use crate::batch::DoneBatcher;
use crate::metrics::Metrics;
use crate::validate;

/// The `Queue` service's name, as in the proto package.
pub const QUEUE_SERVICE: &str = queue_server::SERVICE_NAME;
/// The `JobState` service's name (expectations, records, views, event gates).
pub const JOB_STATE_SERVICE: &str = job_state_server::SERVICE_NAME;

/// Every RPC kjob-queue serves, as (service, methods): their metrics exist from start.
pub const RPCS: [(&str, &[&str]); 2] =
    [(QUEUE_SERVICE, QUEUE_METHODS), (JOB_STATE_SERVICE, JOB_STATE_METHODS)];

/// Implements a service trait for [`QueueService`]: every RPC runs its handler under one
/// metrics handle ([`QueueService::measured`]); `$methods` lists the methods as the proto
/// names them.
macro_rules! measured_service {
    ($trait:ident, $service:expr, $methods:ident, {
        $($rpc:ident($req:ty) -> $resp:ty = $method:literal by $handler:ident;)*
    }) => {
        /// The methods of one service, as the proto names them.
        pub const $methods: &[&str] = &[$($method),*];

        #[tonic::async_trait]
        impl $trait for QueueService {
            $(async fn $rpc(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                self.measured($service, $method, self.$handler(req.into_inner())).await
            })*
        }
    };
}

measured_service!(Queue, QUEUE_SERVICE, QUEUE_METHODS, {
    add(v1::AddRequest) -> v1::AddResponse = "Add" by add_rpc;
    lease(v1::LeaseRequest) -> v1::LeaseResponse = "Lease" by lease_rpc;
    renew(v1::RenewRequest) -> v1::RenewResponse = "Renew" by renew_rpc;
    done(v1::DoneRequest) -> v1::DoneResponse = "Done" by done_rpc;
    done_batch(v1::DoneBatchRequest) -> v1::DoneBatchResponse = "DoneBatch" by done_batch_rpc;
    stats(v1::StatsRequest) -> v1::StatsResponse = "Stats" by stats_rpc;
    inspect(v1::InspectRequest) -> v1::InspectResponse = "Inspect" by inspect_rpc;
    namespaces(v1::NamespacesRequest) -> v1::NamespacesResponse = "Namespaces" by namespaces_rpc;
});

measured_service!(JobState, JOB_STATE_SERVICE, JOB_STATE_METHODS, {
    set_expectations(v1::SetExpectationsRequest) -> v1::SetExpectationsResponse
        = "SetExpectations" by set_expectations_rpc;
    lower_expectations(v1::LowerExpectationsRequest) -> v1::LowerExpectationsResponse
        = "LowerExpectations" by lower_expectations_rpc;
    get_expectations(v1::GetExpectationsRequest) -> v1::GetExpectationsResponse
        = "GetExpectations" by get_expectations_rpc;
    delete_expectations(v1::DeleteExpectationsRequest) -> v1::DeleteExpectationsResponse
        = "DeleteExpectations" by delete_expectations_rpc;
    expect_finalizer_removals(v1::ExpectFinalizerRemovalsRequest)
        -> v1::ExpectFinalizerRemovalsResponse
        = "ExpectFinalizerRemovals" by expect_finalizer_removals_rpc;
    forget_finalizer_removals(v1::ForgetFinalizerRemovalsRequest)
        -> v1::ForgetFinalizerRemovalsResponse
        = "ForgetFinalizerRemovals" by forget_finalizer_removals_rpc;
    get_record(v1::GetRecordRequest) -> v1::GetRecordResponse = "GetRecord" by get_record_rpc;
    put_record(v1::PutRecordRequest) -> v1::PutRecordResponse = "PutRecord" by put_record_rpc;
    delete_record(v1::DeleteRecordRequest) -> v1::DeleteRecordResponse
        = "DeleteRecord" by delete_record_rpc;
    get_job_view(v1::GetJobViewRequest) -> v1::GetJobViewResponse
        = "GetJobView" by get_job_view_rpc;
    put_job_view(v1::PutJobViewRequest) -> v1::PutJobViewResponse
        = "PutJobView" by put_job_view_rpc;
    cache_session(v1::CacheSessionRequest) -> v1::CacheSessionResponse
        = "CacheSession" by cache_session_rpc;
    gate_events(v1::GateEventsRequest) -> v1::GateEventsResponse
        = "GateEvents" by gate_events_rpc;
    take_api_tokens(v1::TakeApiTokensRequest) -> v1::TakeApiTokensResponse
        = "TakeApiTokens" by take_api_tokens_rpc;
    set_namespace_weights(v1::SetNamespaceWeightsRequest) -> v1::SetNamespaceWeightsResponse
        = "SetNamespaceWeights" by set_namespace_weights_rpc;
});

/// Shared state of both services.
#[derive(Clone)]
pub struct QueueService {
    store: Store,
    waker: Waker,
    dones: DoneBatcher,
    metrics: Metrics,
    shutdown: Shutdown,
    syncs: std::sync::Arc<SyncCounter>,
}

impl QueueService {
    /// Wraps a connected store; Dones go through `dones` (whose loops must be running), and
    /// the job queue's are counted per namespace in `syncs` (published by the caller).
    pub fn new(
        store: Store,
        waker: Waker,
        dones: DoneBatcher,
        metrics: Metrics,
        shutdown: Shutdown,
        syncs: std::sync::Arc<SyncCounter>,
    ) -> Self {
        Self { store, waker, dones, metrics, shutdown, syncs }
    }

    /// Metrics, per-namespace sync counts and wake-ups of an applied Done of `key`.
    fn done_applied(&self, queue: &str, key: &str, d: &DoneResult) {
        if queue == kjob_core::JOB_QUEUE
            && let Some((ns, _)) = key.split_once('/')
        {
            self.syncs.record(ns, 1, d.now_ms);
        }
        let m = self.metrics.queue(queue);
        m.work_duration.observe(d.work_ms as f64 / 1000.0);
        if d.retry_delay_ms.is_some() {
            m.retries.inc();
        }
        if d.ready_at_ms.is_some_and(|t| t <= d.now_ms) {
            self.waker.poke(queue, 1);
        }
    }

    /// Runs one call of `method` under its metrics handle.
    async fn measured<T>(
        &self,
        service: &'static str,
        method: &'static str,
        handler: impl Future<Output = Result<T, Refused>>,
    ) -> Result<Response<T>, Status> {
        let rpc = self.metrics.rpc(service, method);
        let res = handler.await.map_err(|Refused(s)| s);
        if let Err(s) = &res
            && s.code() == tonic::Code::Internal
        {
            tracing::error!(method, error = %s.message(), "call failed");
        }
        rpc.end_with(res).map(Response::new)
    }
}

/// Why a handler did not answer, as the status the call ends with: `?` maps a validator's
/// message to INVALID_ARGUMENT and a store failure to UNAVAILABLE while Redis is unreachable
/// (clients retry) or INTERNAL otherwise; a precise status (a stale lease) passes as it is.
struct Refused(Status);

impl From<String> for Refused {
    fn from(msg: String) -> Self {
        Refused(Status::invalid_argument(msg))
    }
}

impl From<WqError> for Refused {
    fn from(e: WqError) -> Self {
        Refused(if e.is_unavailable() {
            Status::unavailable(e.to_string())
        } else {
            Status::internal(e.to_string())
        })
    }
}

impl From<Status> for Refused {
    fn from(s: Status) -> Self {
        Refused(s)
    }
}

/// A refused request: INVALID_ARGUMENT with `msg`.
fn invalid(msg: String) -> Refused {
    Refused::from(msg)
}

fn observation(o: &v1::Observation) -> Result<Observation, String> {
    validate::id("observation job_uid", &o.job_uid, false)?;
    validate::id("observation pod_uid", &o.pod_uid, false)?;
    let obs = Observation::try_from(o)?;
    if obs.kind == ObservationKind::FinalizerRemoval {
        validate::id("observation pod_uid", &o.pod_uid, true)?;
    }
    Ok(obs)
}

/// The checks of SetExpectations and LowerExpectations.
fn expectation_counts(key: &str, job_uid: &str, add: i64, del: i64) -> Result<(), Refused> {
    validate::key(key)?;
    validate::id("job_uid", job_uid, false)?;
    validate::count("add", add)?;
    validate::count("del", del).map_err(invalid)
}

fn set_expectations_fields(r: &v1::SetExpectationsRequest) -> Result<(), Refused> {
    expectation_counts(&r.key, &r.job_uid, r.add, r.del)?;
    pod_uids(&r.created_pod_uids)?;
    if i64::try_from(r.created_pod_uids.len()).map_or(true, |n| n > r.add) {
        return Err(invalid(format!(
            "{} created_pod_uids with add {}: add counts every created pod",
            r.created_pod_uids.len(),
            r.add
        )));
    }
    Ok(())
}

/// The checked expectations a Done carries, if any (its key filled in).
fn done_expectations(r: &v1::DoneRequest) -> Result<Option<v1::SetExpectationsRequest>, String> {
    let Some(e) = &r.expectations else { return Ok(None) };
    rides_this_done(r, "expectations", &e.key)?;
    let e = v1::SetExpectationsRequest { key: r.key.clone(), ..e.clone() };
    set_expectations_fields(&e).map_err(|Refused(s)| format!("expectations: {}", s.message()))?;
    Ok(Some(e))
}

/// The checked finalizer removals a Done carries, if any (its key made the Done's own).
fn done_finalizer_removals(r: &v1::DoneRequest) -> Result<Option<FinalizerRemovals>, String> {
    let Some(f) = &r.finalizer_removals else { return Ok(None) };
    rides_this_done(r, "finalizer_removals", &f.key)?;
    validate::id("job_uid", &f.job_uid, false).map_err(|e| format!("finalizer_removals: {e}"))?;
    pod_uids(&f.pod_uids).map_err(|Refused(s)| format!("finalizer_removals: {}", s.message()))?;
    Ok(Some(FinalizerRemovals {
        key: r.key.clone(),
        job_uid: f.job_uid.clone(),
        pod_uids: f.pod_uids.clone(),
    }))
}

fn expectations_reply(e: kjob_workqueue::Expectations) -> v1::GetExpectationsResponse {
    v1::GetExpectationsResponse {
        satisfied: e.satisfied,
        exists: e.record.is_some(),
        add: e.record.as_ref().map(|r| r.add).unwrap_or(0),
        del: e.record.as_ref().map(|r| r.del).unwrap_or(0),
        age_ms: e.age_ms,
        finalizer_removals: e.finalizer_removals,
    }
}

fn view_op(o: &v1::CacheOp) -> Result<ViewOp, String> {
    use v1::CacheOpKind as K;
    let name = |field: &str| -> Result<String, String> {
        validate::id(field, &o.name, true)?;
        Ok(o.name.clone())
    };
    let object = |field: &str| -> Result<Vec<u8>, String> {
        validate::view_object(field, &o.object, true)?;
        Ok(o.object.clone())
    };
    match K::try_from(o.kind) {
        Ok(K::Job) => {
            validate::id("cache op resource_version", &o.resource_version, true)?;
            Ok(ViewOp::Job {
                uid: name("cache op name (Job UID)")?,
                object: object("cache op object (Job)")?,
                resource_version: o.resource_version.clone(),
            })
        }
        Ok(K::DeleteJob) => Ok(ViewOp::DeleteJob),
        Ok(K::Pod) => Ok(ViewOp::Pod {
            name: name("cache op name (pod name)")?,
            object: object("cache op object (pod)")?,
        }),
        Ok(K::DeletePod) => Ok(ViewOp::DeletePod { name: name("cache op name (pod name)")? }),
        Ok(K::Reset) => Ok(ViewOp::Reset { uid: name("cache op name (Job UID)")? }),
        Ok(K::Trust) => Ok(ViewOp::Trust),
        Ok(K::Orphans) => Ok(ViewOp::Orphans),
        _ => Err(format!(
            "cache op kind {} is not one of JOB, DELETE_JOB, POD, DELETE_POD, RESET, TRUST, ORPHANS",
            o.kind
        )),
    }
}

/// Validates a Done request into the store's Done (the same checks for Done and DoneBatch).
fn done_item(r: &v1::DoneRequest) -> Result<Done, String> {
    validate::queue(&r.queue)?;
    validate::key(&r.key)?;
    validate::id("lease_id", &r.lease_id, true)?;
    validate::delay("requeue_after_ms", r.requeue_after_ms)?;
    let outcome = outcome_from_wire(r.outcome, r.requeue_after_ms)?;
    Ok(Done { key: r.key.clone(), lease_id: r.lease_id.clone(), outcome, error: r.error.clone() })
}

/// Checks the fields of a view write-back (the key aside).
fn put_job_view_fields(r: &v1::PutJobViewRequest) -> Result<(), String> {
    validate::id("job_uid", &r.job_uid, true)?;
    validate::view_object("job", &r.job, false)?;
    validate::id("resource_version", &r.resource_version, !r.job.is_empty())
}

/// Checks that what a Done carries in `field`, written for `key` (empty: the Done's own), may
/// ride it: Job queue only, and that Done's key.
fn rides_this_done(r: &v1::DoneRequest, field: &str, key: &str) -> Result<(), String> {
    if r.queue != kjob_core::JOB_QUEUE {
        return Err(format!(
            "{field} is for the {:?} queue only, not {:?}",
            kjob_core::JOB_QUEUE,
            r.queue
        ));
    }
    if !key.is_empty() && key != r.key {
        return Err(format!("{field} is for key {key:?}, not this Done's {:?}", r.key));
    }
    Ok(())
}

/// What a Done writes before it finishes its lease, checked.
struct BeforeDone<'a> {
    key: &'a str,
    /// The Job object for the key's shared view.
    view: Option<&'a v1::PutJobViewRequest>,
    /// The expectations raised after the sync's creates.
    expectations: Option<v1::SetExpectationsRequest>,
    /// The finalizer removals expected after the sync made them.
    removals: Option<FinalizerRemovals>,
}

impl<'a> BeforeDone<'a> {
    fn of(r: &'a v1::DoneRequest) -> Result<Self, String> {
        Ok(Self {
            key: &r.key,
            view: view_write_back(r)?,
            expectations: done_expectations(r)?,
            removals: done_finalizer_removals(r)?,
        })
    }
}

/// The checked view write-back a Done carries, if any.
fn view_write_back(r: &v1::DoneRequest) -> Result<Option<&v1::PutJobViewRequest>, String> {
    let Some(v) = &r.view_write_back else { return Ok(None) };
    rides_this_done(r, "view_write_back", &v.key)?;
    put_job_view_fields(v).map_err(|e| format!("view_write_back: {e}"))?;
    Ok(Some(v))
}

fn stale_done_message(r: &v1::DoneRequest) -> String {
    format!(
        "lease {} of {} is not held any more (expired or superseded); nothing changed",
        r.lease_id, r.key
    )
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl QueueService {
    async fn add_rpc(&self, r: v1::AddRequest) -> Result<v1::AddResponse, Refused> {
        let items = r.items;
        validate::add_items(items.len())?;
        // Validate everything first: a batch is applied whole or refused whole.
        let mut per_queue: Vec<(&str, Vec<Enqueue>)> = Vec::new();
        for (i, it) in items.iter().enumerate() {
            let at = |e: String| format!("item {i} ({:?}): {e}", it.key);
            validate::key(&it.key).map_err(at)?;
            validate::queue(&it.queue).map_err(at)?;
            validate::delay("delay_ms", it.delay_ms).map_err(at)?;
            validate::add_item_ops(it.cache.len(), it.observations.len()).map_err(at)?;
            let observations = match it.observations.iter().map(observation).collect() {
                Ok(o) => o,
                Err(e) => return Err(invalid(at(e))),
            };
            let view = match it.cache.iter().map(view_op).collect::<Result<Vec<_>, _>>() {
                Ok(v) => v,
                Err(e) => return Err(invalid(at(e))),
            };
            if !view.is_empty() {
                if it.queue != kjob_core::JOB_QUEUE {
                    return Err(invalid(at(format!(
                        "cache writes go with the {:?} queue only",
                        kjob_core::JOB_QUEUE
                    ))));
                }
                validate::id("cache_session", &it.cache_session, true).map_err(at)?;
            }
            let e = Enqueue {
                key: it.key.clone(),
                delay: ms(it.delay_ms),
                observations,
                observe_only: it.observe_only,
                view,
                session: it.cache_session.clone(),
                priority: it.priority,
            };
            match per_queue.iter_mut().find(|(q, _)| *q == it.queue) {
                Some((_, v)) => v.push(e),
                None => per_queue.push((it.queue.as_str(), vec![e])),
            }
        }
        // One script per queue: on the job queue each item's observations are applied in the
        // same script as its enqueue, so a worker that leases the key sees them.
        let (mut added, mut view_session_lost) = (0, false);
        for (queue, batch) in per_queue {
            // Leases what becomes ready to this replica's waiting lessees in the same script.
            let r = self.waker.add(&self.store, queue, batch).await?;
            added += r.added;
            view_session_lost |= r.view_lost;
            let m = self.metrics.queue(queue);
            m.adds.inc_by(u64::from(r.accepted_now));
            m.retries.inc_by(u64::from(r.delayed));
        }
        Ok(v1::AddResponse { added, view_session_lost })
    }

    async fn lease_rpc(&self, r: v1::LeaseRequest) -> Result<v1::LeaseResponse, Refused> {
        validate::queue(&r.queue)?;
        validate::lease(r.max_items, r.lease_ms, r.wait_ms)?;
        validate::id("worker_id", &r.worker_id, false)?;
        let with_views = r.with_views && r.queue == kjob_core::JOB_QUEUE;
        // A lessee that caches views decoded wants their pods' names, and deltas of those
        // it holds.
        let view_names = with_views && (r.view_names || !r.cached_views.is_empty());
        if with_views {
            view_records(&r.view_records)?;
            cached_views(&r.cached_views)?;
        }
        if r.dones.len() > validate::MAX_DONE_BATCH {
            return Err(invalid(format!(
                "a Lease carries at most {} dones, got {}",
                validate::MAX_DONE_BATCH,
                r.dones.len()
            )));
        }
        // The lessee's finished leases first: their keys may be ready again for this very call.
        let done_results = self.apply_dones(&r.dones, "dones item").await?;
        let ask = LeaseAsk {
            worker: &r.worker_id,
            n: r.max_items,
            lease: ms(r.lease_ms),
            wait: ms(r.wait_ms),
            view_records: with_views.then_some(r.view_records.as_slice()),
        };
        let batch = tokio::select! {
            res = self.waker.lease_for(&self.store, &r.queue, ask) => {
                Some(res?)
            }
            // Draining: a long poll answers "nothing" rather than holding up the shutdown.
            _ = self.shutdown.cancelled() => None,
        };
        let m = self.metrics.queue(&r.queue);
        let leased = match batch {
            Some(b) => {
                // Delayed items promoted by the lease script are adds (client-go counts an
                // AddAfter's add when it fires); reaped leases are the reaper's work done here.
                m.adds.inc_by(u64::from(b.promoted));
                self.metrics.count_reaped(&r.queue, b.reaped, b.poisoned);
                b.items
            }
            None => Vec::new(),
        };
        m.leases.inc_by(leased.len() as u64);
        m.handoff_views.inc_by(leased.iter().filter(|it| it.view.is_some()).count() as u64);
        let hist = &m.queue_duration;
        let lease_ms = i64::try_from(r.lease_ms).unwrap_or(i64::MAX);
        let mut items = leased
            .into_iter()
            .map(|it| {
                let now = it.deadline_ms - lease_ms;
                hist.observe((now - it.enqueued_ms).max(0) as f64 / 1000.0);
                v1::LeasedItem {
                    key: it.key,
                    lease_id: it.lease_id,
                    requeues: it.requeues,
                    deadline_unix_ms: it.deadline_ms,
                    enqueued_unix_ms: it.enqueued_ms,
                    // An Add's hand-off read the view in its own script, with the names,
                    // version and epoch a caching lessee keeps.
                    view: it.view.map(|v| handoff_reply(v, view_names)),
                    lease_expiries: it.expiries,
                    done_raises_expectations: true,
                    done_expects_finalizer_removals: true,
                }
            })
            .collect::<Vec<_>>();
        if with_views {
            let unread: Vec<usize> =
                (0..items.len()).filter(|&i| items[i].view.is_none()).collect();
            if !unread.is_empty() {
                let keys: Vec<&str> = unread.iter().map(|&i| items[i].key.as_str()).collect();
                let bases: Vec<Option<(u64, &str)>> = keys
                    .iter()
                    .map(|k| {
                        let c = r.cached_views.iter().find(|c| c.key == *k)?;
                        Some((c.version, c.epoch.as_str()))
                    })
                    .collect();
                let views = self.leased_views(&keys, &bases, &r.view_records, view_names).await;
                for (i, view) in unread.into_iter().zip(views) {
                    items[i].view = view;
                }
            }
            // Views ride along while the reply stays under the cap; the lessees of the rest
            // read them with GetJobView (paged), as after a failed read.
            let mut room = validate::MAX_REPLY_BYTES - validate::LEASE_REPLY_ROOM;
            for it in &mut items {
                let len = it.view.as_ref().map_or(0, prost::Message::encoded_len);
                if len > room {
                    it.view = None;
                } else {
                    room -= len;
                }
            }
        }
        Ok(v1::LeaseResponse { items, done_results })
    }

    async fn renew_rpc(&self, r: v1::RenewRequest) -> Result<v1::RenewResponse, Refused> {
        validate::queue(&r.queue)?;
        validate::key(&r.key)?;
        validate::id("lease_id", &r.lease_id, true)?;
        validate::lease_ms_ok(r.lease_ms)?;
        match self.store.renew(&r.queue, &r.key, &r.lease_id, ms(r.lease_ms)).await {
            Ok(Some(deadline)) => {
                self.waker.fence().note_lease(ms(r.lease_ms));
                Ok(v1::RenewResponse { deadline_unix_ms: deadline })
            }
            Ok(None) => {
                self.metrics.queue(&r.queue).stale.inc();
                Err(Status::failed_precondition(format!(
                    "lease {} of {} is not held any more (expired or superseded)",
                    r.lease_id, r.key
                ))
                .into())
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn done_rpc(&self, r: v1::DoneRequest) -> Result<v1::DoneResponse, Refused> {
        let done = done_item(&r)?;
        self.land_all(&[BeforeDone::of(&r)?]).await?;
        match self.dones.done(&r.queue, done).await {
            Ok(Some(d)) => {
                self.done_applied(&r.queue, &r.key, &d);
                Ok(v1::DoneResponse {
                    requeued: d.ready_at_ms.is_some(),
                    ready_unix_ms: d.ready_at_ms.unwrap_or(0),
                })
            }
            Ok(None) => {
                self.metrics.queue(&r.queue).stale.inc();
                Err(Status::failed_precondition(stale_done_message(&r)).into())
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn done_batch_rpc(
        &self,
        r: v1::DoneBatchRequest,
    ) -> Result<v1::DoneBatchResponse, Refused> {
        validate::done_batch_len(r.items.len())?;
        let results = self.apply_dones(&r.items, "item").await?;
        Ok(v1::DoneBatchResponse { results })
    }

    /// Validates `items` (all of them first: a malformed one refuses the call and changes
    /// nothing; `what` names an item in the message), then finishes their leases: one result
    /// per item, in order. The batch of DoneBatch and the Dones a Lease call carries.
    async fn apply_dones(
        &self,
        items: &[v1::DoneRequest],
        what: &str,
    ) -> Result<Vec<v1::DoneItemResult>, Refused> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut per_queue: Vec<(&str, Vec<usize>, Vec<Done>)> = Vec::new();
        for (i, it) in items.iter().enumerate() {
            let done =
                done_item(it).map_err(|e| invalid(format!("{what} {i} ({:?}): {e}", it.key)))?;
            match per_queue.iter_mut().find(|(q, _, _)| *q == it.queue) {
                Some((_, idx, v)) => {
                    idx.push(i);
                    v.push(done);
                }
                None => per_queue.push((it.queue.as_str(), vec![i], vec![done])),
            }
        }
        let writes = items
            .iter()
            .enumerate()
            .map(|(i, it)| {
                BeforeDone::of(it).map_err(|e| invalid(format!("{what} {i} ({:?}): {e}", it.key)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // What the Dones carry lands before any lease of the batch is finished.
        self.land_all(&writes).await?;
        let mut results = vec![v1::DoneItemResult::default(); items.len()];
        // The queues' batches run concurrently: each goes through its queue's batch loop and
        // shares a script call with whatever other Dones of that queue arrived meanwhile.
        let calls = per_queue.into_iter().map(|(queue, idx, dones)| async move {
            (queue, idx, self.dones.done_many(queue, dones).await)
        });
        for (queue, idx, res) in futures::future::join_all(calls).await {
            // A failed script call fails the whole RPC: the client retries it, and items that
            // were applied meanwhile (another queue's) then come back stale, as a retried Done.
            let outcomes = res?;
            for (i, outcome) in idx.into_iter().zip(outcomes) {
                results[i] = match outcome {
                    Some(d) => {
                        self.done_applied(queue, &items[i].key, &d);
                        v1::DoneItemResult {
                            code: tonic::Code::Ok as i32,
                            message: String::new(),
                            requeued: d.ready_at_ms.is_some(),
                            ready_unix_ms: d.ready_at_ms.unwrap_or(0),
                        }
                    }
                    None => {
                        self.metrics.queue(queue).stale.inc();
                        v1::DoneItemResult {
                            code: tonic::Code::FailedPrecondition as i32,
                            message: stale_done_message(&items[i]),
                            requeued: false,
                            ready_unix_ms: 0,
                        }
                    }
                };
            }
        }
        Ok(results)
    }

    async fn stats_rpc(&self, r: v1::StatsRequest) -> Result<v1::StatsResponse, Refused> {
        validate::queue(&r.queue)?;
        let s = self.store.stats(&r.queue).await?;
        Ok(v1::StatsResponse {
            ready: s.ready,
            delayed: s.delayed,
            leased: s.leased,
            dirty: s.dirty,
            oldest_ready_age_ms: s
                .oldest_ready_ms
                .map(|t| u64::try_from(s.now_ms - t).unwrap_or(0))
                .unwrap_or(0),
            failing: s.failing,
        })
    }

    async fn inspect_rpc(&self, r: v1::InspectRequest) -> Result<v1::InspectResponse, Refused> {
        validate::queue(&r.queue)?;
        if r.keys.len() > validate::MAX_LIST {
            return Err(invalid(format!("at most {} keys per Inspect", validate::MAX_LIST)));
        }
        for k in &r.keys {
            validate::key(k).map_err(|e| format!("{k:?}: {e}"))?;
        }
        let views = self.store.inspect(&r.queue, &r.keys).await?;
        let keys = views
            .into_iter()
            .map(|v| v1::KeyState {
                key: v.key,
                state: v.state.as_str().to_string(),
                ready_unix_ms: v.ready_ms.or(v.delayed_ms).unwrap_or(0),
                requeues: v.requeues,
                dirty: v.dirty,
                lease_holder: v.holder,
                lease_deadline_unix_ms: v.lease_deadline_ms.unwrap_or(0),
            })
            .collect();
        Ok(v1::InspectResponse { keys })
    }

    async fn namespaces_rpc(
        &self,
        r: v1::NamespacesRequest,
    ) -> Result<v1::NamespacesResponse, Refused> {
        validate::queue(&r.queue)?;
        validate::namespace(&r.namespace, true)?;
        let limit = validate::namespaces(r.limit, r.oldest_keys)?;
        let only = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
        let (all, oldest) = futures::future::try_join(
            self.store.namespaces(&r.queue),
            self.store.oldest_ready(&r.queue, only, r.oldest_keys),
        )
        .await?;
        let now = all.now_ms;
        let age = |t: Option<i64>| t.map_or(0, |t| u64::try_from(now - t).unwrap_or(0));
        let rows = crate::tenants::by_depth(all.namespaces);
        let total_namespaces = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        let namespaces = rows
            .into_iter()
            .filter(|s| only.is_none_or(|ns| s.namespace == ns))
            .take(limit as usize)
            .map(|s| v1::NamespaceDepth {
                oldest_ready_age_ms: age(s.oldest_ready_ms),
                namespace: s.namespace,
                ready: s.ready,
                delayed: s.delayed,
                leased: s.leased,
                syncs_per_second: s.syncs_per_second,
            })
            .collect();
        let oldest_ready = oldest
            .keys
            .into_iter()
            .map(|k| v1::WaitingKey {
                ready_age_ms: u64::try_from(oldest.now_ms - k.ready_ms).unwrap_or(0),
                key: k.key,
            })
            .collect();
        Ok(v1::NamespacesResponse {
            namespaces,
            total_namespaces,
            truncated: all.truncated,
            oldest_ready,
        })
    }

    async fn set_expectations_rpc(
        &self,
        r: v1::SetExpectationsRequest,
    ) -> Result<v1::SetExpectationsResponse, Refused> {
        set_expectations_fields(&r)?;
        self.set_expectations(&r).await?;
        Ok(v1::SetExpectationsResponse {})
    }

    /// Writes what Dones carry, concurrently, before their leases are finished: whoever leases
    /// a key next plans from its view and expectations. The finalizer removals of them all go
    /// in one script call.
    async fn land_all(&self, writes: &[BeforeDone<'_>]) -> Result<(), Refused> {
        let removals = writes.iter().filter_map(|w| w.removals.as_ref());
        let expect_removals = async {
            self.store.expect_finalizer_removals_done(removals).await.map_err(Refused::from)
        };
        let (landed, expected) = futures::future::join(
            futures::future::join_all(writes.iter().map(|w| self.land(w))),
            expect_removals,
        )
        .await;
        landed.into_iter().collect::<Result<Vec<()>, Refused>>()?;
        expected.map(drop)
    }

    /// Writes a Done's view and expectations, concurrently.
    async fn land(&self, w: &BeforeDone<'_>) -> Result<(), Refused> {
        let view = async {
            match w.view {
                Some(v) => self.write_back(w.key, v).await.map(drop),
                None => Ok(()),
            }
        };
        let raise = async {
            match &w.expectations {
                Some(e) => self.set_expectations(e).await,
                None => Ok(()),
            }
        };
        let (written, raised) = futures::future::join(view, raise).await;
        written.and(raised)
    }

    /// Applies a checked SetExpectations (the plain one, or the one raised after the creates).
    async fn set_expectations(&self, r: &v1::SetExpectationsRequest) -> Result<(), Refused> {
        if r.created_pod_uids.is_empty() {
            self.store.set_expectations(&r.key, &r.job_uid, r.add, r.del).await?;
        } else {
            let (key, uid, uids) = (&r.key, &r.job_uid, &r.created_pod_uids);
            self.store.set_expectations_created(key, uid, r.add, r.del, uids).await?;
        }
        Ok(())
    }

    async fn lower_expectations_rpc(
        &self,
        r: v1::LowerExpectationsRequest,
    ) -> Result<v1::LowerExpectationsResponse, Refused> {
        expectation_counts(&r.key, &r.job_uid, r.add, r.del)?;
        self.store.lower_expectations(&r.key, &r.job_uid, r.add, r.del).await?;
        Ok(v1::LowerExpectationsResponse {})
    }

    async fn get_expectations_rpc(
        &self,
        r: v1::GetExpectationsRequest,
    ) -> Result<v1::GetExpectationsResponse, Refused> {
        validate::key(&r.key)?;
        validate::id("job_uid", &r.job_uid, false)?;
        let e = self.store.get_expectations(&r.key, &r.job_uid).await?;
        Ok(expectations_reply(e))
    }

    async fn delete_expectations_rpc(
        &self,
        r: v1::DeleteExpectationsRequest,
    ) -> Result<v1::DeleteExpectationsResponse, Refused> {
        validate::key(&r.key)?;
        self.store.delete_expectations(&r.key).await?;
        Ok(v1::DeleteExpectationsResponse {})
    }

    async fn forget_finalizer_removals_rpc(
        &self,
        r: v1::ForgetFinalizerRemovalsRequest,
    ) -> Result<v1::ForgetFinalizerRemovalsResponse, Refused> {
        validate::key(&r.key)?;
        pod_uids(&r.pod_uids)?;
        let forgotten = self.store.forget_finalizer_removals(&r.key, &r.pod_uids).await?;
        Ok(v1::ForgetFinalizerRemovalsResponse { forgotten })
    }

    async fn delete_record_rpc(
        &self,
        r: v1::DeleteRecordRequest,
    ) -> Result<v1::DeleteRecordResponse, Refused> {
        validate::key(&r.key)?;
        validate::id("name", &r.name, true)?;
        let deleted = self.store.delete_record(&r.key, &r.name).await?;
        Ok(v1::DeleteRecordResponse { deleted })
    }

    async fn expect_finalizer_removals_rpc(
        &self,
        r: v1::ExpectFinalizerRemovalsRequest,
    ) -> Result<v1::ExpectFinalizerRemovalsResponse, Refused> {
        validate::key(&r.key)?;
        validate::id("job_uid", &r.job_uid, false)?;
        pod_uids(&r.pod_uids)?;
        self.store.expect_finalizer_removals(&r.key, &r.job_uid, &r.pod_uids).await?;
        Ok(v1::ExpectFinalizerRemovalsResponse {})
    }

    async fn get_record_rpc(
        &self,
        r: v1::GetRecordRequest,
    ) -> Result<v1::GetRecordResponse, Refused> {
        validate::key(&r.key)?;
        validate::id("name", &r.name, true)?;
        let v = self.store.get_record(&r.key, &r.name).await?;
        Ok(v1::GetRecordResponse { found: v.is_some(), value: v.unwrap_or_default() })
    }

    async fn put_record_rpc(
        &self,
        r: v1::PutRecordRequest,
    ) -> Result<v1::PutRecordResponse, Refused> {
        validate::key(&r.key)?;
        validate::id("name", &r.name, true)?;
        validate::delay("ttl_ms", r.ttl_ms)?;
        if r.value.len() > validate::MAX_RECORD_BYTES {
            return Err(invalid(format!(
                "record is {} bytes; the limit is {}",
                r.value.len(),
                validate::MAX_RECORD_BYTES
            )));
        }
        let ttl = (r.ttl_ms > 0).then(|| ms(r.ttl_ms));
        if !self.store.put_record(&r.key, &r.name, &r.value, ttl).await? {
            return Err(invalid(format!(
                "{} already has {} records, the limit (MAX_RECORDS_PER_JOB); record {:?} is a \
                 new one",
                r.key,
                validate::MAX_RECORDS_PER_JOB,
                r.name
            )));
        }
        Ok(v1::PutRecordResponse {})
    }

    async fn get_job_view_rpc(
        &self,
        r: v1::GetJobViewRequest,
    ) -> Result<v1::GetJobViewResponse, Refused> {
        validate::key(&r.key)?;
        view_records(&r.records)?;
        let from = if r.page.is_empty() {
            None
        } else {
            let cursor = ViewCursor::parse(&r.page).ok_or_else(|| {
                invalid(format!("page {:?} is not a next_page GetJobView answered", r.page))
            })?;
            if !r.records.is_empty() {
                return Err(invalid("records are read with a view's first page only".into()));
            }
            Some(cursor)
        };
        // A delta read: what changed since the caller's version, when the change log can say;
        // else the first page of a full read.
        if let Some(base) = r.base_version {
            if from.is_some() {
                return Err(invalid("a delta read (base_version) reads no later page".into()));
            }
            epoch_token(&r.base_epoch)?;
            let budget = validate::VIEW_PAGE_BYTES;
            let delta =
                self.store.get_job_view_delta(&r.key, &r.records, base, &r.base_epoch, budget);
            match delta.await? {
                ViewDelta::Untrusted => return Ok(v1::GetJobViewResponse::default()),
                ViewDelta::Changes(c) => {
                    // Bounded by the page budget; the object and records come on top, as on
                    // a first page: should they pass the cap, the full read's check answers.
                    let reply = delta_reply(*c);
                    if prost::Message::encoded_len(&reply) <= validate::MAX_REPLY_BYTES {
                        return Ok(reply);
                    }
                }
                ViewDelta::Full => {}
            }
        }
        // A caller that does not page (older than paged views) gets the whole view in one
        // reply, or, when that would not fit, an untrusted one: it then reads the API server,
        // which is slower but right.
        let paged = r.paged || from.is_some() || r.base_version.is_some();
        let names = r.with_names || r.base_version.is_some();
        let budget = if paged { validate::VIEW_PAGE_BYTES } else { validate::WHOLE_VIEW_BYTES };
        let page = self.store.get_job_view_page(&r.key, &r.records, from, budget).await?;
        let reply = match page {
            ViewPage::Pods(p) if !paged && p.next.is_some() => {
                tracing::debug!(
                    key = r.key,
                    pods = p.pod_count,
                    "a view too large for one reply, asked for whole: answered untrusted"
                );
                v1::GetJobViewResponse::default()
            }
            ViewPage::Moved if !paged => v1::GetJobViewResponse::default(),
            page => page_reply(page, names),
        };
        // A first page is bounded by construction (see VIEW_PAGE_BYTES); should records and
        // expectations ever make one larger, no reply above the cap leaves: untrusted instead.
        if prost::Message::encoded_len(&reply) > validate::MAX_REPLY_BYTES {
            tracing::warn!(
                key = r.key,
                "a view page is larger than the reply cap; answered untrusted"
            );
            return Ok(v1::GetJobViewResponse::default());
        }
        Ok(reply)
    }

    /// The views of freshly leased Job keys, read concurrently (pipelined on one connection),
    /// each only when it fits in one page. A view that cannot be read, or is larger, is left
    /// out: its lessee asks with GetJobView, and the leases already granted are returned
    /// whatever happens here.
    /// A key with a base (`(version, epoch)` its lessee holds) is read as a delta when the
    /// change log can say; with `names`, every view carries its pods' names.
    async fn leased_views(
        &self,
        keys: &[&str],
        bases: &[Option<(u64, &str)>],
        records: &[String],
        names: bool,
    ) -> Vec<Option<v1::GetJobViewResponse>> {
        /// Reads of one view begun again when a write landed between its HSCAN chunks (a
        /// view of more than one chunk, its pods updated by the watcher while it ran): a read
        /// here is cheaper than the lessee's GetJobView round trip (a CI run's 400-pod Job
        /// with 100 pods running saw one such race).
        const MOVED_ATTEMPTS: usize = 3;
        let reads = keys.iter().zip(bases).map(|(key, base)| async move {
            if let Some((version, epoch)) = base {
                let budget = validate::VIEW_PAGE_BYTES;
                match self.store.get_job_view_delta(key, records, *version, epoch, budget).await {
                    Ok(ViewDelta::Changes(c)) => return Ok(Err(delta_reply(*c))),
                    Ok(ViewDelta::Untrusted) => return Ok(Ok(ViewPage::Untrusted)),
                    Ok(ViewDelta::Full) => {}
                    Err(e) => return Err(e),
                }
            }
            let mut attempt = 1;
            loop {
                let res = self
                    .store
                    .get_job_view_page(key, records, None, validate::VIEW_PAGE_BYTES)
                    .await;
                if !matches!(res, Ok(ViewPage::Moved)) || attempt == MOVED_ATTEMPTS {
                    return res.map(Ok);
                }
                attempt += 1;
            }
        });
        futures::future::join_all(reads)
            .await
            .into_iter()
            .zip(keys)
            .map(|(res, key)| match res {
                // A delta, read whole in one script.
                Ok(Err(delta)) => Some(delta),
                Ok(Ok(ViewPage::Pods(p))) if p.next.is_some() => None,
                Ok(Ok(ViewPage::Moved)) => None,
                Ok(Ok(page)) => Some(page_reply(page, names)),
                Err(e) => {
                    tracing::debug!(key, error = %e, "reading a leased key's view failed");
                    None
                }
            })
            .collect()
    }

    async fn put_job_view_rpc(
        &self,
        r: v1::PutJobViewRequest,
    ) -> Result<v1::PutJobViewResponse, Refused> {
        validate::key(&r.key)?;
        put_job_view_fields(&r)?;
        let stored = self.write_back(&r.key, &r).await?;
        Ok(v1::PutJobViewResponse { stored })
    }

    /// Stores a checked view write-back of `key`; whether the object was stored.
    async fn write_back(&self, key: &str, r: &v1::PutJobViewRequest) -> Result<bool, Refused> {
        let stored = self
            .store
            .put_job_view(key, &r.job_uid, &r.job, &r.resource_version, r.orphans_handled)
            .await?;
        Ok(stored)
    }

    async fn cache_session_rpc(
        &self,
        r: v1::CacheSessionRequest,
    ) -> Result<v1::CacheSessionResponse, Refused> {
        validate::id("session", &r.session, true)?;
        let phase = match v1::CacheSessionPhase::try_from(r.phase) {
            Ok(v1::CacheSessionPhase::Begin) => SessionPhase::Begin,
            Ok(v1::CacheSessionPhase::Commit) => SessionPhase::Commit,
            Ok(v1::CacheSessionPhase::End) => SessionPhase::End,
            _ => {
                return Err(invalid(format!("phase {} is not one of BEGIN, COMMIT, END", r.phase)));
            }
        };
        let applied = self.store.view_session(&r.session, phase).await?;
        Ok(v1::CacheSessionResponse { applied })
    }

    async fn gate_events_rpc(
        &self,
        r: v1::GateEventsRequest,
    ) -> Result<v1::GateEventsResponse, Refused> {
        validate::gate_batch(r.events.len())?;
        let events = r
            .events
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                validate::gate_event(
                    i,
                    &e.object_key,
                    [
                        ("spam_key", &e.spam_key),
                        ("aggregate_key", &e.aggregate_key),
                        ("event_key", &e.event_key),
                    ],
                    &e.message,
                )?;
                Ok(GateEvent {
                    object_key: e.object_key,
                    spam_key: e.spam_key,
                    aggregate_key: e.aggregate_key,
                    event_key: e.event_key,
                    message: e.message,
                })
            })
            .collect::<Result<Vec<_>, Refused>>()?;
        let gated = self.store.gate_events(&events, &EventGateConfig::default()).await?;
        Ok(v1::GateEventsResponse {
            events: gated
                .into_iter()
                .map(|g| v1::GatedEvent {
                    dropped: g.dropped,
                    aggregated: g.aggregated,
                    key: g.key,
                    message: g.message,
                })
                .collect(),
        })
    }
}

impl QueueService {
    async fn take_api_tokens_rpc(
        &self,
        r: v1::TakeApiTokensRequest,
    ) -> Result<v1::TakeApiTokensResponse, Refused> {
        validate::api_tokens(&r.namespace, r.want, r.qps, r.burst)?;
        let ask = TokenAsk {
            namespace: &r.namespace,
            want: r.want,
            qps: r.qps,
            burst: r.burst,
            throttled: r.throttled,
        };
        let g = self.store.take_api_tokens(&ask).await?;
        self.metrics.api_budget(&g, r.throttled);
        Ok(v1::TakeApiTokensResponse {
            granted: g.granted,
            wait_ms: g.wait.as_millis() as u64,
            rate: g.rate,
            active_namespaces: g.active_namespaces,
            slowed: g.slowed,
        })
    }

    async fn set_namespace_weights_rpc(
        &self,
        r: v1::SetNamespaceWeightsRequest,
    ) -> Result<v1::SetNamespaceWeightsResponse, Refused> {
        validate::namespace_weights(&r.weights)?;
        let weights = r.weights.into_iter().collect();
        let weighted = self.store.replace_namespace_weights(&weights).await?;
        Ok(v1::SetNamespaceWeightsResponse { weighted })
    }
}

/// Checks a list of pod UIDs.
fn pod_uids(uids: &[String]) -> Result<(), Refused> {
    if uids.len() > validate::MAX_LIST {
        return Err(invalid(format!("at most {} pod UIDs per call", validate::MAX_LIST)));
    }
    for p in uids {
        validate::id("pod_uid", p, true)?;
    }
    Ok(())
}

/// Checks the per-Job record names a view read asks for.
fn view_records(records: &[String]) -> Result<(), Refused> {
    if records.len() > validate::MAX_VIEW_RECORDS {
        return Err(invalid(format!(
            "{} records asked for; the limit is {}",
            records.len(),
            validate::MAX_VIEW_RECORDS
        )));
    }
    for name in records {
        validate::id("record name", name, true)?;
    }
    Ok(())
}

/// Checks a Lease's cached views: at most [`validate::MAX_CACHED_VIEWS`], valid keys and
/// tokens.
fn cached_views(views: &[v1::CachedView]) -> Result<(), Refused> {
    if views.len() > validate::MAX_CACHED_VIEWS {
        return Err(invalid(format!(
            "{} cached views named; the limit is {}",
            views.len(),
            validate::MAX_CACHED_VIEWS
        )));
    }
    for v in views {
        validate::key(&v.key)?;
        epoch_token(&v.epoch)?;
    }
    Ok(())
}

/// Checks an epoch token a caller names (one kjob-queue answered: hex digits).
fn epoch_token(token: &str) -> Result<(), Refused> {
    if token.len() > validate::MAX_EPOCH_TOKEN || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid(format!("epoch {token:?} is not a token GetJobView answered")));
    }
    Ok(())
}

/// A delta read as the wire answers it.
fn delta_reply(c: ViewChanges) -> v1::GetJobViewResponse {
    let mut reply = view_reply(Some(c.head));
    let (pod_names, pods) = c.changed.into_iter().unzip();
    reply.pods = pods;
    reply.pod_names = pod_names;
    reply.removed = c.removed;
    reply.delta = true;
    reply.delta_base = c.base;
    reply.version = c.version;
    reply.pod_count = Some(c.pod_count);
    reply.epoch = c.epoch;
    reply
}

/// A page of a view read as the wire answers it; with `names`, the pods' names too.
fn page_reply(page: ViewPage, names: bool) -> v1::GetJobViewResponse {
    match page {
        ViewPage::Untrusted => v1::GetJobViewResponse::default(),
        ViewPage::Moved => v1::GetJobViewResponse { moved: true, ..Default::default() },
        ViewPage::Pods(p) => {
            let mut reply = match p.head {
                Some(head) => view_reply(Some(*head)),
                None => v1::GetJobViewResponse { trusted: true, ..Default::default() },
            };
            reply.pods = p.pods;
            if names {
                reply.pod_names = p.names;
            }
            reply.epoch = p.epoch;
            reply.version = p.version;
            reply.pod_count = Some(p.pod_count);
            reply.next_page = p.next.map(|c| c.token()).unwrap_or_default();
            reply
        }
    }
}

/// A view an Add's hand-off read whole in its script, as the wire answers it; with `names`
/// (a lessee that caches views decoded) its pods' names, version, count and epoch token, as a
/// one-page read brings them.
fn handoff_reply(view: Option<kjob_workqueue::JobView>, names: bool) -> v1::GetJobViewResponse {
    let Some(mut view) = view else { return view_reply(None) };
    let named = view.named.take();
    let mut reply = view_reply(Some(view));
    if let (true, Some(n)) = (names, named) {
        reply.pod_count = Some(reply.pods.len() as u64);
        reply.pod_names = n.names;
        reply.version = n.version;
        reply.epoch = n.epoch;
    }
    reply
}

/// A view read as the wire answers it: untrusted (`None`) is an empty, untrusted reply.
fn view_reply(view: Option<kjob_workqueue::JobView>) -> v1::GetJobViewResponse {
    match view {
        Some(v) => v1::GetJobViewResponse {
            trusted: true,
            job: v.job,
            pods: v.pods,
            orphans_seen: v.orphans_seen,
            orphans_handled: v.orphans_handled,
            expectations: Some(expectations_reply(v.expectations)),
            job_uid: v.uid,
            records: v
                .records
                .into_iter()
                .map(|(name, value)| v1::ViewRecord { name, value })
                .collect(),
            // Whole (an Add's hand-off, read in its script): no pages, nothing to count.
            ..Default::default()
        },
        None => v1::GetJobViewResponse::default(),
    }
}
