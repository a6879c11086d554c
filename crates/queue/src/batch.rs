//! Server-side batching of Done calls: concurrent Dones of one queue share one script call.
//!
//! Redis spends most of its time per script call on the call itself (parsing, the script's
//! setup, the reply), not on the few commands a Done runs, so finishing many leases in one call
//! cuts Redis CPU per item. Batching is adaptive, like a group commit: one call per queue is in
//! flight at a time, and whatever arrived meanwhile goes into the next one. A lone Done waits for
//! nothing but a call already in flight.
//!
//! The loop reaches Redis through [`DoneStore`] ([`Store`] in the service), so its batching is
//! tested on tokio's paused clock without a redis-server.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use kjob_workqueue::{Done, DoneResult, MAX_DONE_BATCH, Store, WqError};
use tokio::sync::{mpsc, oneshot};

/// Dones waiting for their batch, per queue; a full channel makes callers wait (backpressure).
const PENDING_CAPACITY: usize = 4096;
/// How long a caller waits for its batch to answer: the call in flight and its own, each
/// bounded by the store's response timeout, and a margin. A loop that does not answer by then is
/// stuck (never expected): the caller gets Unavailable (its client retries) and the stall is
/// logged, instead of every Done waiting on it for ever.
pub const REPLY_TIMEOUT: Duration =
    Duration::from_secs(kjob_workqueue::conn::RESPONSE_TIMEOUT.as_secs() * 2 + 1);

/// One result per Done (`None`: stale lease id), or the error of the whole call.
pub type DoneResults = Result<Vec<Option<DoneResult>>, WqError>;

type Reply = oneshot::Sender<DoneResults>;

/// One caller's Dones (a Done call brings one, a DoneBatch call up to [`MAX_DONE_BATCH`]).
struct Pending {
    dones: Vec<Done>,
    reply: Reply,
}

/// Hands Dones to the per-queue batch loops; cheap to clone.
#[derive(Clone)]
pub struct DoneBatcher {
    queues: HashMap<String, mpsc::Sender<Pending>>,
}

/// The receiving end of one queue's batch loop (see [`run`]).
pub struct BatchLoop {
    queue: String,
    rx: mpsc::Receiver<Pending>,
}

impl DoneBatcher {
    /// A batcher for `queues` and the loops that must run (with [`run`]) for it to answer.
    pub fn new<'a>(queues: impl IntoIterator<Item = &'a str>) -> (Self, Vec<BatchLoop>) {
        let mut map = HashMap::new();
        let mut loops = Vec::new();
        for q in queues {
            let (tx, rx) = mpsc::channel(PENDING_CAPACITY);
            map.insert(q.to_string(), tx);
            loops.push(BatchLoop { queue: q.to_string(), rx });
        }
        (Self { queues: map }, loops)
    }

    /// Finishes one lease through the batch of `queue`; `None` when the lease id is stale.
    pub async fn done(&self, queue: &str, done: Done) -> Result<Option<DoneResult>, WqError> {
        let mut r = self.done_many(queue, vec![done]).await?;
        Ok(r.pop().flatten())
    }

    /// Finishes several leases of `queue` (in order) through its batch; one result per Done,
    /// `None` when that lease id is stale. An empty list answers at once.
    pub async fn done_many(&self, queue: &str, dones: Vec<Done>) -> DoneResults {
        if dones.is_empty() {
            return Ok(Vec::new());
        }
        let tx = self
            .queues
            .get(queue)
            .ok_or_else(|| WqError::Config(format!("no batch loop for queue {queue:?}")))?;
        let (reply, rx) = oneshot::channel();
        tx.send(Pending { dones, reply })
            .await
            .map_err(|_| WqError::Unavailable("the Done batch loop has stopped".into()))?;
        match tokio::time::timeout(REPLY_TIMEOUT, rx).await {
            Ok(reply) => {
                reply.map_err(|_| WqError::Unavailable("the Done batch loop has stopped".into()))?
            }
            Err(_) => {
                tracing::error!(queue, timeout = ?REPLY_TIMEOUT, "the Done batch loop did not answer");
                Err(WqError::Unavailable(format!(
                    "the Done batch loop of queue {queue:?} did not answer in {REPLY_TIMEOUT:?}"
                )))
            }
        }
    }
}

/// Copies a store error for each of several callers (WqError is not Clone: it may wrap a
/// connection error), keeping whether it is transient.
fn share(e: &WqError) -> WqError {
    if e.is_unavailable() {
        WqError::Unavailable(e.to_string())
    } else {
        WqError::Protocol(e.to_string())
    }
}

/// Where the batch loop finishes leases: one call per chunk of at most [`MAX_DONE_BATCH`].
pub trait DoneStore: Send + Sync {
    /// Finishes `dones` of `queue` in order, as [`Store::done_many`] does.
    fn done_many(&self, queue: &str, dones: &[Done]) -> impl Future<Output = DoneResults> + Send;
}

impl DoneStore for Store {
    fn done_many(&self, queue: &str, dones: &[Done]) -> impl Future<Output = DoneResults> + Send {
        Store::done_many(self, queue, dones)
    }
}

/// Runs the batch loop of one queue until every [`DoneBatcher`] clone is dropped.
pub async fn run(store: impl DoneStore, batch_loop: BatchLoop) {
    let BatchLoop { queue, mut rx } = batch_loop;
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_DONE_BATCH);
    let mut dones: Vec<Done> = Vec::with_capacity(MAX_DONE_BATCH);
    while let Some(first) = rx.recv().await {
        let mut total = first.dones.len();
        batch.push(first);
        // Callers are taken whole, so a call may exceed MAX_DONE_BATCH by one caller's Dones;
        // it is then split into script calls of at most MAX_DONE_BATCH below.
        while total < MAX_DONE_BATCH {
            match rx.try_recv() {
                Ok(p) => {
                    total += p.dones.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        dones.clear();
        for p in &batch {
            dones.extend(p.dones.iter().cloned());
        }
        // One result slot per Done; a chunk whose script failed leaves its slots as errors.
        let mut results: Vec<Result<Option<DoneResult>, WqError>> = Vec::with_capacity(total);
        for chunk in dones.chunks(MAX_DONE_BATCH) {
            match store.done_many(&queue, chunk).await {
                Ok(r) => results.extend(r.into_iter().map(Ok)),
                Err(e) => results.extend(chunk.iter().map(|_| Err(share(&e)))),
            }
        }
        let mut results = results.into_iter();
        for p in batch.drain(..) {
            let mine: Vec<_> = results.by_ref().take(p.dones.len()).collect();
            // A caller whose Dones were split over a failed script call gets that error; the
            // ones applied in another chunk stay applied, as after a lost reply.
            let reply = mine.into_iter().collect::<Result<Vec<_>, _>>();
            // The caller may have gone away (its gRPC call was cancelled); the Dones are
            // applied all the same, as they would have been without batching.
            let _ = p.reply.send(reply);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The batch loop on tokio's paused clock, over a store whose every call takes 10 ms.

    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use kjob_workqueue::LeaseOutcome;
    use tokio::time::Instant;

    use super::*;

    const CALL: Duration = Duration::from_millis(10);

    /// Records each call (when, which keys); a lease id `stale` is refused, a key `bad` fails
    /// the whole call.
    /// Each call: when it began, and the keys it carried.
    type Calls = Arc<Mutex<Vec<(Duration, Vec<String>)>>>;

    #[derive(Clone)]
    struct SlowStore {
        calls: Calls,
        start: Instant,
    }

    impl DoneStore for SlowStore {
        async fn done_many(&self, _queue: &str, dones: &[Done]) -> DoneResults {
            let keys = dones.iter().map(|d| d.key.clone()).collect::<Vec<_>>();
            self.calls.lock().unwrap().push((self.start.elapsed(), keys));
            tokio::time::sleep(CALL).await;
            if dones.iter().any(|d| d.key == "bad") {
                return Err(WqError::Unavailable("redis down".into()));
            }
            let result = |d: &Done| {
                (d.lease_id != "stale").then_some(DoneResult {
                    work_ms: 0,
                    ready_at_ms: None,
                    now_ms: 0,
                    retry_delay_ms: None,
                })
            };
            Ok(dones.iter().map(result).collect())
        }
    }

    fn done(key: &str) -> Done {
        Done {
            key: key.into(),
            lease_id: "id".into(),
            outcome: LeaseOutcome::Forget,
            error: String::new(),
        }
    }

    /// A batcher of queue `q` whose loop runs over a [`SlowStore`].
    fn start() -> (DoneBatcher, SlowStore, tokio::task::JoinHandle<()>) {
        let store = SlowStore { calls: Arc::default(), start: Instant::now() };
        let (batcher, mut loops) = DoneBatcher::new(["q"]);
        let task = tokio::spawn(run(store.clone(), loops.pop().unwrap()));
        (batcher, store, task)
    }

    fn keys(ks: &[&str]) -> Vec<String> {
        ks.iter().map(|k| k.to_string()).collect()
    }

    /// Sends a Done of `a`, and 1 ms later (while its call runs) whatever `later` sends; both
    /// results.
    async fn behind_a_call<T>(
        b: &DoneBatcher,
        later: impl Future<Output = T>,
    ) -> (Result<Option<DoneResult>, WqError>, T) {
        let later = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            later.await
        };
        tokio::join!(b.done("q", done("a")), later)
    }

    #[tokio::test(start_paused = true)]
    async fn dones_that_arrive_during_a_call_share_the_next() {
        let (b, store, task) = start();
        let stale = Done { lease_id: "stale".into(), ..done("c") };
        let later = async {
            tokio::join!(b.done("q", done("b")), b.done("q", stale), b.done("q", done("d")))
        };
        let (first, (second, stale, fourth)) = behind_a_call(&b, later).await;
        assert!(first.unwrap().is_some() && second.unwrap().is_some() && fourth.unwrap().is_some());
        assert_eq!(stale.unwrap(), None, "a stale lease is refused alone");
        let calls = store.calls.lock().unwrap().clone();
        // A lone Done waits for nothing; the ones that came meanwhile go in one call.
        assert_eq!(calls, vec![(Duration::ZERO, keys(&["a"])), (CALL, keys(&["b", "c", "d"]))]);
        drop(b);
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_caller_is_split_into_calls_of_the_batch_limit() {
        let (b, store, _task) = start();
        let many: Vec<Done> = (0..MAX_DONE_BATCH + 50).map(|i| done(&format!("k{i}"))).collect();
        let results = b.done_many("q", many).await.unwrap();
        assert_eq!(results.len(), MAX_DONE_BATCH + 50);
        let calls = store.calls.lock().unwrap().clone();
        let sizes: Vec<(Duration, usize)> = calls.iter().map(|(t, k)| (*t, k.len())).collect();
        assert_eq!(sizes, vec![(Duration::ZERO, MAX_DONE_BATCH), (CALL, 50)]);
        assert_eq!(calls[1].1[0], format!("k{MAX_DONE_BATCH}"), "in order");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_fails_its_callers_only() {
        let (b, store, _task) = start();
        // The two callers behind the first share one call, which fails.
        let rest = async { tokio::join!(b.done("q", done("b")), b.done("q", done("bad"))) };
        let (busy, (b_res, bad)) = behind_a_call(&b, rest).await;
        assert!(busy.unwrap().is_some());
        let (b_err, bad_err) = (b_res.unwrap_err(), bad.unwrap_err());
        assert!(b_err.is_unavailable() && bad_err.is_unavailable(), "{b_err} / {bad_err}");
        assert_eq!(store.calls.lock().unwrap().len(), 2);
        // The loop carries on.
        assert!(b.done("q", done("c")).await.unwrap().is_some());
    }

    /// A store whose calls never end.
    struct StuckStore;

    impl DoneStore for StuckStore {
        async fn done_many(&self, _queue: &str, _dones: &[Done]) -> DoneResults {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_never_answers_fails_its_callers_in_bounded_time() {
        let (b, mut loops) = DoneBatcher::new(["q"]);
        let _task = tokio::spawn(run(StuckStore, loops.pop().unwrap()));
        let started = Instant::now();
        let err = b.done("q", done("a")).await.unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        assert!(err.to_string().contains("did not answer"), "{err}");
        assert_eq!(started.elapsed(), REPLY_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_queue_is_refused() {
        let (b, store, _task) = start();
        assert!(matches!(b.done("other", done("a")).await, Err(WqError::Config(_))));
        assert!(b.done_many("q", Vec::new()).await.unwrap().is_empty());
        assert!(store.calls.lock().unwrap().is_empty(), "no call for nothing");
    }
}
