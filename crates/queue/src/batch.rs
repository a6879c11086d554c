//! Server-side batching of Done calls: concurrent Dones of one queue share one script call.
//!
//! Redis spends most of its time per script call on the call itself (parsing, the script's
//! setup, the reply), not on the few commands a Done runs, so finishing many leases in one call
//! cuts Redis CPU per item. Batching is adaptive, like a group commit: one call per queue is in
//! flight at a time, and whatever arrived meanwhile goes into the next one. A lone Done waits for
//! nothing but a call already in flight.

use std::collections::HashMap;

use kjob_workqueue::{Done, DoneResult, MAX_DONE_BATCH, Store, WqError};
use tokio::sync::{mpsc, oneshot};

/// Dones waiting for their batch, per queue; a full channel makes callers wait (backpressure).
const PENDING_CAPACITY: usize = 4096;

type Reply = oneshot::Sender<Result<Vec<Option<DoneResult>>, WqError>>;

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
    pub async fn done_many(
        &self,
        queue: &str,
        dones: Vec<Done>,
    ) -> Result<Vec<Option<DoneResult>>, WqError> {
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
        rx.await.map_err(|_| WqError::Unavailable("the Done batch loop has stopped".into()))?
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

/// Runs the batch loop of one queue until every [`DoneBatcher`] clone is dropped.
pub async fn run(store: Store, batch_loop: BatchLoop) {
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
