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

type Reply = oneshot::Sender<Result<Option<DoneResult>, WqError>>;

struct Pending {
    done: Done,
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
        let tx = self
            .queues
            .get(queue)
            .ok_or_else(|| WqError::Config(format!("no batch loop for queue {queue:?}")))?;
        let (reply, rx) = oneshot::channel();
        tx.send(Pending { done, reply })
            .await
            .map_err(|_| WqError::Unavailable("the Done batch loop has stopped".into()))?;
        rx.await.map_err(|_| WqError::Unavailable("the Done batch loop has stopped".into()))?
    }
}

/// Runs the batch loop of one queue until every [`DoneBatcher`] clone is dropped.
pub async fn run(store: Store, batch_loop: BatchLoop) {
    let BatchLoop { queue, mut rx } = batch_loop;
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_DONE_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < MAX_DONE_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let dones: Vec<Done> = batch.iter().map(|p| p.done.clone()).collect();
        match store.done_many(&queue, &dones).await {
            Ok(results) => {
                for (p, r) in batch.drain(..).zip(results) {
                    // The caller may have gone away (its gRPC call was cancelled); the Done is
                    // applied all the same, as it would have been without batching.
                    let _ = p.reply.send(Ok(r));
                }
            }
            Err(e) => {
                let unavailable = e.is_unavailable();
                let msg = e.to_string();
                for p in batch.drain(..) {
                    let e = if unavailable {
                        WqError::Unavailable(msg.clone())
                    } else {
                        WqError::Protocol(msg.clone())
                    };
                    let _ = p.reply.send(Err(e));
                }
            }
        }
    }
}
