//! Ships handler decisions to kjob-queue in batches.
//!
//! Items arrive over a bounded channel (a full channel stalls the watch streams: backpressure,
//! not memory growth), are grouped into one `Add` per batch (cut further by [`split_adds`] to
//! stay within kjob-queue's request limits; flushed at [`MAX_BATCH`] items, at
//! once when one asks for an immediate sync, else when the first of its items has lingered as
//! long as it may: see [`linger_for`]), and each batch is retried with backoff until kjob-queue
//! has it. An item that asks for a sync after a delay spends part of that delay lingering, and
//! its delay is shortened by the time it lingered, so the sync comes when it would have without
//! the linger (upstream's `AddAfter` at the event).
//! A batch asking for an immediate sync may go while another is in flight (up to
//! [`MAX_IN_FLIGHT`]), but never beside one that shares a key, and a view session phase goes
//! alone: the queue applies each key's items in the order the handlers made them (an
//! observation is never applied after a later enqueue of the same key), while a new Job's first
//! enqueue need not wait for other Jobs' pod events to land. Other batches wait for the one in
//! flight, gathering what arrives meanwhile.
//! While a batch is in flight (or waits to be retried) the sender keeps taking items off the
//! channel into its stage, up to [`STAGE_LIMIT_BYTES`]: kube-apiserver closes a watch whose client
//! stops reading for a fraction of a second, so the watch streams must not wait on an Add.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kjob_queue_client::{AddItem, ClientError, QueueClient, v1};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::handlers::{Enqueue, SessionControl};
use crate::metrics::{Metrics, ObservationLabels, QueueLabels};
use crate::view::ViewWrite;
use kjob_core::seal::{EntryKind, ViewKey};
use kjob_core::{MAX_ADD_ITEM_OPS, MAX_ADD_ITEMS, MAX_REQUEST_BYTES, ViewOp};

/// Items buffered between the informer and the sender: enough for a burst of events while one
/// batch is in flight, small enough that a stuck queue stalls the watches quickly.
pub const SEND_BUFFER: usize = 4096;
/// Most bytes (as [`item_size`] counts them) the sender stages beyond the channel while a batch
/// is in flight; past it the channel fills and the watch streams wait (backpressure).
pub const STAGE_LIMIT_BYTES: usize = 64 * 1024 * 1024;
/// Largest Add batch: keeps one Redis script run short (upstream caps per-sync work at 500 too).
pub const MAX_BATCH: usize = 500;
/// Largest Add batch in bytes as [`item_size`] estimates them (view objects): one script run
/// stays short. kjob-queue's request limit, a hard one, is kept by [`split_adds`], which cuts
/// any batch (or single item) past it into several Adds.
pub const MAX_BATCH_BYTES: usize = 2 * 1024 * 1024;
/// Shortest wait for company of a batch whose items do not ask for a sync now: what view-only
/// items and items with short delays wait. 10 ms rather than 5 made 35-40 % fewer Adds for the
/// same events (an Indexed Job of 5,000 pods: 2,828 and 3,201 against 4,795 and 4,864) and
/// ~15 % less kjob CPU.
pub const LINGER: Duration = Duration::from_millis(10);
/// Longest wait for company of an item that asks for a sync after a delay (pod events and Job
/// status updates: upstream's 1 s batch period). Its delay is shortened by what it waited, so
/// the wait costs the sync nothing; at a low event rate it merges the events of a tenth of a
/// second into one Add, where [`LINGER`] left most of them alone.
pub const MAX_LINGER: Duration = Duration::from_millis(100);
/// Part of a delay an item never spends lingering: the Add must land (and, on a retry, land
/// again) before the key is due.
pub const SEND_MARGIN: Duration = Duration::from_millis(50);
/// Most Add batches in flight at once (each retried on its own until kjob-queue has it): one,
/// plus one holding an immediate enqueue (a Job added or changed) that overtakes it.
pub const MAX_IN_FLIGHT: usize = 2;
/// First retry delay after a failed Add.
const RETRY_INITIAL: Duration = Duration::from_millis(100);
/// Longest delay between Add retries: a queue that comes back is used within this.
const RETRY_MAX: Duration = Duration::from_secs(5);
/// After shutdown is requested, how long buffered items may still be retried before the
/// watcher gives up on them (the next leader's resync repairs what is lost).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the sender.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Shutdown was requested and kjob-queue still refused the remaining items after
    /// [`DRAIN_TIMEOUT`].
    #[error("gave up on {0} buffered items at shutdown: kjob-queue unreachable")]
    Abandoned(usize),
}

/// The bounded channel from the informer to the sender.
pub fn channel() -> (mpsc::Sender<Enqueue>, mpsc::Receiver<Enqueue>) {
    mpsc::channel(SEND_BUFFER)
}

/// Merges items for the same queue, key and view session, keeping the first one's position:
/// observations and view writes are concatenated in order, the earliest delay wins (which is
/// what the queue would do with the separate items anyway: an item already waiting keeps the
/// earlier time), the newest priority sent wins, and the merge enqueues if any part did. Session phases are never merged.
pub fn coalesce(batch: Vec<Enqueue>) -> Vec<Enqueue> {
    let mut out: Vec<Enqueue> = Vec::with_capacity(batch.len());
    type Slot = (&'static str, String, Option<Arc<str>>);
    let mut index: std::collections::HashMap<Slot, usize> =
        std::collections::HashMap::with_capacity(batch.len());
    for e in batch {
        if e.control.is_some() {
            out.push(e);
            continue;
        }
        let slot = (e.queue, e.key.clone(), e.session.clone());
        match index.get(&slot) {
            Some(&i) => {
                let merged = &mut out[i];
                if merged.observe_only {
                    merged.delay = e.delay;
                } else if !e.observe_only {
                    merged.delay = merged.delay.min(e.delay);
                }
                merged.observe_only &= e.observe_only;
                // The newest decision knows the newest priority.
                merged.priority = e.priority.or(merged.priority);
                merged.observations.extend(e.observations);
                merged.view.extend(e.view);
            }
            None => {
                index.insert(slot, out.len());
                out.push(e);
            }
        }
    }
    out
}

/// A handler decision as kjob-queue's Add takes it, its view objects sealed with `view_key` as
/// entries of the item's Job (the copy into the request is made here anyway, so the seal costs
/// an HMAC and no extra copy).
pub fn to_item(e: &Enqueue, view_key: &ViewKey) -> AddItem {
    let seal = |w: &ViewWrite| match w {
        ViewWrite::Job { uid, object, resource_version } => ViewOp::Job {
            uid: uid.clone(),
            object: view_key.seal(EntryKind::Job, &e.key, object),
            resource_version: resource_version.clone(),
        },
        ViewWrite::Pod { name, object } => ViewOp::Pod {
            name: name.clone(),
            object: view_key.seal(EntryKind::Pod, &e.key, object),
        },
        other => other.to_owned_bytes(),
    };
    AddItem {
        queue: e.queue.to_string(),
        key: e.key.clone(),
        delay: e.delay,
        observations: e.observations.clone(),
        observe_only: e.observe_only,
        cache: e.view.iter().map(seal).collect(),
        cache_session: e.session.as_deref().unwrap_or_default().to_string(),
        priority: e.priority,
    }
}

/// Framing of one protobuf field, at most: its tag and the longest length prefix of a message
/// under 4 GiB.
const FIELD_FRAMING: usize = 1 + 5;

/// At least the bytes `op` takes in an encoded Add item, its own framing included.
fn op_wire_bytes(op: &ViewOp<Vec<u8>>) -> usize {
    let fields = match op {
        ViewOp::Job { uid, object, resource_version } => {
            uid.len() + object.len() + resource_version.len()
        }
        ViewOp::Pod { name, object } => name.len() + object.len(),
        ViewOp::DeletePod { name } => name.len(),
        ViewOp::Reset { uid } => uid.len(),
        ViewOp::DeleteJob | ViewOp::Trust | ViewOp::Orphans => 0,
    };
    // Its kind, up to three length-delimited fields, and its own frame in the item.
    fields + 5 * FIELD_FRAMING
}

/// At least the bytes `o` takes in an encoded Add item.
fn observation_wire_bytes(o: &kjob_core::Observation) -> usize {
    o.job_uid.len() + o.pod_uid.len() + 4 * FIELD_FRAMING
}

/// At least the bytes `it` takes in an encoded Add without its operations: queue, key,
/// session, delay and flag, and its own frame.
fn item_base_wire_bytes(it: &AddItem) -> usize {
    it.queue.len() + it.key.len() + it.cache_session.len() + 6 * FIELD_FRAMING + 16
}

/// At least the bytes `it` takes in an encoded Add.
fn item_wire_bytes(it: &AddItem) -> usize {
    item_base_wire_bytes(it)
        + it.cache.iter().map(op_wire_bytes).sum::<usize>()
        + it.observations.iter().map(observation_wire_bytes).sum::<usize>()
}

/// The Adds that carry `items`, in order, each within kjob-queue's limits: at most
/// `max_bytes` encoded and [`MAX_ADD_ITEMS`] items, each item at most [`MAX_ADD_ITEM_OPS`]
/// operations. An item past a limit (coalesced events of one Job, a snapshot chunk of large
/// pods) goes as several pieces of the same key, applied in order: its view writes first, then
/// its observations (a worker that sees an observation also sees the pod it was made from),
/// and only the last piece enqueues. A piece that cannot fit however it is cut (one object
/// larger than `max_bytes`) comes back in the second list, to be dropped: kjob-queue would
/// refuse it.
pub fn split_adds(items: Vec<AddItem>, max_bytes: usize) -> (Vec<Vec<AddItem>>, Vec<AddItem>) {
    let (mut adds, mut oversized) = (Vec::new(), Vec::new());
    let (mut add, mut bytes) = (Vec::new(), 0);
    for item in items {
        for piece in pieces(item, max_bytes) {
            let size = item_wire_bytes(&piece);
            if size > max_bytes {
                oversized.push(piece);
                continue;
            }
            if !add.is_empty() && (bytes + size > max_bytes || add.len() >= MAX_ADD_ITEMS) {
                adds.push(std::mem::take(&mut add));
                bytes = 0;
            }
            bytes += size;
            add.push(piece);
        }
    }
    if !add.is_empty() {
        adds.push(add);
    }
    (adds, oversized)
}

/// `item` cut into pieces within [`MAX_ADD_ITEM_OPS`] and `max_bytes` (see [`split_adds`]).
fn pieces(mut item: AddItem, max_bytes: usize) -> Vec<AddItem> {
    let ops = item.cache.len() + item.observations.len();
    if ops <= MAX_ADD_ITEM_OPS && item_wire_bytes(&item) <= max_bytes {
        return vec![item];
    }
    let base = item_base_wire_bytes(&item);
    let shell = || AddItem {
        queue: item.queue.clone(),
        key: item.key.clone(),
        delay: Duration::ZERO,
        observations: Vec::new(),
        observe_only: true,
        cache: Vec::new(),
        cache_session: item.cache_session.clone(),
        priority: None,
    };
    let mut out = Vec::new();
    let (mut piece, mut bytes) = (shell(), base);
    // Whether `piece` must end before an operation of `size` bytes joins it.
    let full = |piece: &AddItem, bytes: usize, size: usize| {
        let n = piece.cache.len() + piece.observations.len();
        n > 0 && (n >= MAX_ADD_ITEM_OPS || bytes + size > max_bytes)
    };
    for op in std::mem::take(&mut item.cache) {
        let size = op_wire_bytes(&op);
        if full(&piece, bytes, size) {
            out.push(std::mem::replace(&mut piece, shell()));
            bytes = base;
        }
        bytes += size;
        piece.cache.push(op);
    }
    for o in std::mem::take(&mut item.observations) {
        let size = observation_wire_bytes(&o);
        if full(&piece, bytes, size) {
            out.push(std::mem::replace(&mut piece, shell()));
            bytes = base;
        }
        bytes += size;
        piece.observations.push(o);
    }
    // The last piece is the item's own: its delay, and its enqueue unless it only observes.
    piece.delay = item.delay;
    piece.observe_only = item.observe_only;
    piece.priority = item.priority;
    out.push(piece);
    out
}

/// Whether an item asks for a sync now (not after a delay, not only observations).
fn is_urgent(e: &Enqueue) -> bool {
    !e.observe_only && e.delay.is_zero()
}

/// How long `e` may wait in the sender for company: nothing if it asks for a sync now;
/// [`LINGER`] if it only writes observations and view objects; else its delay less
/// [`SEND_MARGIN`], between [`LINGER`] and [`MAX_LINGER`].
pub fn linger_for(e: &Enqueue) -> Duration {
    if is_urgent(e) {
        Duration::ZERO
    } else if e.observe_only {
        LINGER
    } else {
        e.delay.saturating_sub(SEND_MARGIN).clamp(LINGER, MAX_LINGER)
    }
}

/// Shortens the delay of an item that asks for a sync after one by `waited`, the time it spent
/// in the sender, so that the key is due when it would have been had it gone at once.
fn spend_delay(e: &mut Enqueue, waited: Duration) {
    if !e.observe_only {
        e.delay = e.delay.saturating_sub(waited);
    }
}

/// Bytes an item adds to a batch (view objects dominate).
fn item_size(e: &Enqueue) -> usize {
    128 + e.observations.len() * 96 + e.view.iter().map(ViewWrite::size).sum::<usize>()
}

/// What every send needs: the client, the metrics, and the flags it reports through.
#[derive(Clone)]
struct Link {
    client: QueueClient,
    metrics: Metrics,
    /// Whether the last call succeeded (readiness).
    queue_ok: Arc<AtomicBool>,
    /// Poked when kjob-queue says its Redis lost the view session.
    view_lost: Arc<Notify>,
    /// Seals the view objects sent (see [`to_item`]).
    view_key: ViewKey,
    /// Bounds how long the last items are retried.
    shutdown: CancellationToken,
    /// Set once shutdown began: retries stop at this instant.
    give_up_at: Option<Instant>,
}

/// Sends batches until the channel closes (the informer stopped). `queue_ok` reflects whether
/// the last Add succeeded, for readiness; `view_lost` is poked when kjob-queue's Redis lost the
/// view session (the informer then begins a new one). `shutdown` only bounds how long the last
/// items are retried; the loop itself ends when every sender of the channel is gone.
pub async fn run_sender(
    mut rx: mpsc::Receiver<Enqueue>,
    client: QueueClient,
    metrics: Metrics,
    queue_ok: Arc<AtomicBool>,
    view_lost: Arc<Notify>,
    view_key: ViewKey,
    shutdown: CancellationToken,
) -> Result<(), SendError> {
    let mut link =
        Link { client, metrics, queue_ok, view_lost, view_key, shutdown, give_up_at: None };
    let mut batcher = Batcher::default();
    let mut flight = InFlight::default();
    loop {
        while let Some(joined) = flight.tasks.try_join_next_with_id() {
            flight.finished(joined);
        }
        // While a send is in flight the next batch gathers what arrives (as one send at a
        // time did), unless an item asking for an immediate sync comes: that one may overtake.
        while !flight.tasks.is_empty() {
            let joined = {
                let mut next = std::pin::pin!(flight.tasks.join_next_with_id());
                batcher.stage_until_urgent(&mut rx, &mut next).await
            };
            match joined {
                Some(Some(joined)) => flight.finished(joined),
                // An urgent item is staged (or, never here, nothing was in flight).
                Some(None) | None => break,
            }
        }
        flight.check(&batcher, &rx)?;
        match batcher.next(&mut rx).await {
            None => {
                while let Some(joined) = flight.tasks.join_next_with_id().await {
                    flight.finished(joined);
                }
                return flight.check(&batcher, &rx);
            }
            Some(Next::Session(control)) => {
                // A phase orders everything around it: it waits for every batch in flight.
                flight.wait(&mut batcher, &mut rx, |_| true).await;
                flight.check(&batcher, &rx)?;
                link.send_session(control, &mut batcher, &mut rx).await?
            }
            Some(Next::Batch(mut batch)) => {
                // Only a batch asking for a sync now overtakes one in flight; the others wait
                // for it.
                let urgent = batch.iter().any(is_urgent);
                let slots = slots_of(&batch);
                let waited = !flight.tasks.is_empty();
                flight
                    .wait(&mut batcher, &mut rx, |f| {
                        !urgent || f.tasks.len() >= MAX_IN_FLIGHT || f.conflicts(&slots)
                    })
                    .await;
                flight.check(&batcher, &rx)?;
                // What arrived during the wait joins the batch (fewer, fuller Adds under
                // load), once no send is left whose keys it could share.
                if waited && flight.tasks.is_empty() {
                    batcher.top_up(&mut batch, &mut rx);
                }
                let batch = coalesce(batch);
                let slots = slots_of(&batch);
                flight.spawn(link.clone(), batch, slots);
            }
        }
    }
}

/// A queue and key: two batches in flight never share one.
type Slot = (&'static str, String);

/// The queues and keys of a batch's items.
fn slots_of(batch: &[Enqueue]) -> Vec<Slot> {
    batch.iter().map(|e| (e.queue, e.key.clone())).collect()
}

/// The batches in flight: each a task retrying its Add until kjob-queue has it, with the keys
/// it holds.
#[derive(Default)]
struct InFlight {
    tasks: tokio::task::JoinSet<Result<(), SendError>>,
    /// Each task's keys and item count.
    held: std::collections::HashMap<tokio::task::Id, (Vec<Slot>, usize)>,
    /// How many batches in flight hold each key.
    keys: std::collections::HashMap<Slot, usize>,
    /// Items given up on (shutdown with kjob-queue unreachable).
    abandoned: usize,
}

impl InFlight {
    /// Whether a batch with `slots` would share a key with one in flight.
    fn conflicts(&self, slots: &[Slot]) -> bool {
        slots.iter().any(|s| self.keys.contains_key(s))
    }

    fn hold(&mut self, id: tokio::task::Id, slots: Vec<Slot>, items: usize) {
        for s in &slots {
            *self.keys.entry(s.clone()).or_default() += 1;
        }
        self.held.insert(id, (slots, items));
    }

    fn spawn(&mut self, mut link: Link, batch: Vec<Enqueue>, slots: Vec<Slot>) {
        let items = batch.len();
        let id = self.tasks.spawn(async move { link.send_batch(batch).await }).id();
        self.hold(id, slots, items);
    }

    /// Releases the keys of a finished task.
    fn finished(
        &mut self,
        joined: Result<(tokio::task::Id, Result<(), SendError>), tokio::task::JoinError>,
    ) {
        let (id, result) = match joined {
            Ok((id, r)) => (id, r),
            // Only a panic (a bug) ends a send otherwise; its items are lost like abandoned ones.
            Err(e) => {
                tracing::error!(error = %e, "an Add task failed");
                let items = self.held.get(&e.id()).map_or(0, |h| h.1);
                (e.id(), Err(SendError::Abandoned(items)))
            }
        };
        if let Some((slots, _)) = self.held.remove(&id) {
            for s in slots {
                if let std::collections::hash_map::Entry::Occupied(mut o) = self.keys.entry(s) {
                    *o.get_mut() -= 1;
                    if *o.get() == 0 {
                        o.remove();
                    }
                }
            }
        }
        if let Err(SendError::Abandoned(n)) = result {
            self.abandoned += n;
        }
    }

    /// Waits for batches in flight to finish while `busy` holds, moving the channel's items
    /// onto the stage meanwhile.
    async fn wait(
        &mut self,
        batcher: &mut Batcher,
        rx: &mut mpsc::Receiver<Enqueue>,
        busy: impl Fn(&Self) -> bool,
    ) {
        while !self.tasks.is_empty() && busy(self) {
            if let Some(joined) = batcher.while_staging(rx, self.tasks.join_next_with_id()).await {
                self.finished(joined);
            }
        }
    }

    /// Fails once a batch was given up on, counting every item not sent.
    fn check(&self, batcher: &Batcher, rx: &mpsc::Receiver<Enqueue>) -> Result<(), SendError> {
        if self.abandoned == 0 {
            return Ok(());
        }
        let in_flight: usize = self.held.values().map(|h| h.1).sum();
        Err(SendError::Abandoned(self.abandoned + in_flight + batcher.staged_len() + rx.len()))
    }
}

/// What the sender ships next.
#[derive(Debug, PartialEq)]
enum Next {
    /// A view session phase, alone (it orders the items around it).
    Session(SessionControl),
    /// Items for one Add, not yet coalesced.
    Batch(Vec<Enqueue>),
}

/// Groups the channel's items into what the sender ships: the batching and linger rules, and
/// the stage that keeps the channel flowing while a batch is in flight; apart from the client
/// so they are tested on tokio's paused clock.
#[derive(Debug, Default)]
struct Batcher {
    /// Items taken off the channel, in order, not yet in a batch: staged while a batch was in
    /// flight, or one that ended a batch (a session phase, or one over the byte budget).
    staged: VecDeque<Enqueue>,
    /// Their [`item_size`]s, summed.
    staged_bytes: usize,
    /// How many of them ask for an immediate sync.
    staged_urgent: usize,
    /// The channel said it is closed (every sender gone).
    closed: bool,
}

impl Batcher {
    fn stage(&mut self, e: Enqueue) {
        self.staged_bytes += item_size(&e);
        self.staged_urgent += usize::from(is_urgent(&e));
        self.staged.push_back(e);
    }

    fn unstage(&mut self) -> Option<Enqueue> {
        let e = self.staged.pop_front()?;
        self.staged_bytes -= item_size(&e);
        self.staged_urgent -= usize::from(is_urgent(&e));
        Some(e)
    }

    /// Puts an item taken for a batch back at the head of the stage.
    fn put_back(&mut self, e: Enqueue) {
        self.staged_bytes += item_size(&e);
        self.staged_urgent += usize::from(is_urgent(&e));
        self.staged.push_front(e);
    }

    /// Moves channel items onto the stage until `work` ends or an item asking for an
    /// immediate sync is staged (or the stage is full and `work` ends); whether `work` ended,
    /// with its output.
    async fn stage_until_urgent<F: Future + Unpin>(
        &mut self,
        rx: &mut mpsc::Receiver<Enqueue>,
        work: &mut F,
    ) -> Option<F::Output> {
        while self.staged_urgent == 0 {
            let room = !self.closed && self.staged_bytes < STAGE_LIMIT_BYTES;
            tokio::select! {
                biased;
                out = &mut *work => return Some(out),
                item = rx.recv(), if room => match item {
                    Some(e) => self.stage(e),
                    None => self.closed = true,
                },
            }
        }
        None
    }

    /// Items held beyond the channel.
    fn staged_len(&self) -> usize {
        self.staged.len()
    }

    /// Runs `work` (an Add, a retry's wait) to its end while moving the channel's items onto the
    /// stage, so the informer never waits on the call, until the stage is full.
    async fn while_staging<F: Future>(
        &mut self,
        rx: &mut mpsc::Receiver<Enqueue>,
        work: F,
    ) -> F::Output {
        let mut work = std::pin::pin!(work);
        loop {
            let room = !self.closed && self.staged_bytes < STAGE_LIMIT_BYTES;
            tokio::select! {
                biased;
                out = &mut work => return out,
                item = rx.recv(), if room => match item {
                    Some(e) => self.stage(e),
                    None => self.closed = true,
                },
            }
        }
    }

    /// The next item: staged ones first, then the channel's; `None` once both are empty and
    /// the channel is closed, or (with `until`) when nothing arrives before it.
    async fn take(
        &mut self,
        rx: &mut mpsc::Receiver<Enqueue>,
        until: Option<Instant>,
    ) -> Option<Enqueue> {
        if let Some(e) = self.unstage() {
            return Some(e);
        }
        if self.closed {
            return None;
        }
        let got = match until {
            None => rx.recv().await,
            Some(t) => match rx.try_recv() {
                Ok(e) => Some(e),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                // tokio rounds a timer's deadline up to its next millisecond tick: a wait
                // until "now" (an urgent item ends the linger) would hold the batch ~1 ms.
                Err(mpsc::error::TryRecvError::Empty) if t <= Instant::now() => return None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    match tokio::time::timeout_at(t, rx.recv()).await {
                        Ok(got) => got,
                        Err(_) => return None,
                    }
                }
            },
        };
        if got.is_none() {
            self.closed = true;
        }
        got
    }

    /// Moves what is staged or waiting in the channel into `batch`, without waiting, up to a
    /// session phase and within the batch limits.
    fn top_up(&mut self, batch: &mut Vec<Enqueue>, rx: &mut mpsc::Receiver<Enqueue>) {
        let mut bytes: usize = batch.iter().map(item_size).sum();
        while batch.len() < MAX_BATCH {
            let next = match self.unstage() {
                Some(e) => e,
                None if self.closed => break,
                None => match rx.try_recv() {
                    Ok(e) => e,
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        self.closed = true;
                        break;
                    }
                },
            };
            let size = item_size(&next);
            if next.control.is_some() || bytes + size > MAX_BATCH_BYTES {
                self.put_back(next);
                break;
            }
            bytes += size;
            batch.push(next);
        }
    }

    /// The next session phase or batch; `None` once the channel is closed and drained.
    async fn next(&mut self, rx: &mut mpsc::Receiver<Enqueue>) -> Option<Next> {
        let first = self.take(rx, None).await?;
        if let Some(control) = first.control {
            return Some(Next::Session(control));
        }
        let mut bytes = item_size(&first);
        // A batch holding an immediate enqueue (a Job added or changed) goes at once with what
        // is already buffered; only batches of delayed items (pod events, batched for 1 s by the
        // queue anyway) wait for company, each item no longer than it may (`linger_for`).
        // Under load batches still fill: items pile up in the channel while the previous batch
        // is in flight.
        let start = Instant::now();
        let mut linger_until = start + linger_for(&first);
        // When each item was taken, to spend its wait from its delay.
        let mut taken = vec![start];
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            let Some(e) = self.take(rx, Some(linger_until)).await else { break };
            let size = item_size(&e);
            if e.control.is_some() || bytes + size > MAX_BATCH_BYTES {
                self.put_back(e);
                break;
            }
            let now = Instant::now();
            linger_until = linger_until.min(now + linger_for(&e));
            bytes += size;
            taken.push(now);
            batch.push(e);
        }
        let now = Instant::now();
        for (e, at) in batch.iter_mut().zip(taken) {
            spend_delay(e, now.saturating_duration_since(at));
        }
        Some(Next::Batch(batch))
    }
}

impl Link {
    /// Sends a view session phase, retried like a batch (it orders the items around it).
    async fn send_session(
        &mut self,
        control: SessionControl,
        batcher: &mut Batcher,
        rx: &mut mpsc::Receiver<Enqueue>,
    ) -> Result<(), SendError> {
        let (session, phase) = match &control {
            SessionControl::Begin(s) => (s, v1::CacheSessionPhase::Begin),
            SessionControl::Commit(s) => (s, v1::CacheSessionPhase::Commit),
            SessionControl::End(s) => (s, v1::CacheSessionPhase::End),
        };
        let mut attempt = 0u32;
        loop {
            match batcher.while_staging(rx, self.client.cache_session(session, phase)).await {
                Ok(applied) => {
                    tracing::info!(session = %session, ?phase, applied, "view session");
                    self.queue_ok.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                Err(ClientError::InvalidArgument(msg)) => {
                    self.metrics.send_errors.inc();
                    tracing::error!(error = %msg, session = %session, "kjob-queue refused a view session phase");
                    return Ok(());
                }
                Err(e) => {
                    self.metrics.send_errors.inc();
                    self.queue_ok.store(false, Ordering::Relaxed);
                    self.wait_to_retry(&mut attempt, &e, 1, batcher, rx).await?;
                }
            }
        }
    }

    /// The delay before another attempt (with backoff); fails once the drain deadline passed.
    fn retry_delay(
        &mut self,
        attempt: &mut u32,
        e: &ClientError,
        items: usize,
    ) -> Result<Duration, SendError> {
        let delay = kjob_svc::Backoff::new(RETRY_INITIAL, RETRY_MAX).delay(*attempt);
        tracing::warn!(error = %e, attempt = *attempt, ?delay, items, "sending to kjob-queue failed; retrying");
        *attempt = attempt.saturating_add(1);
        if self.give_up_at.is_none() && self.shutdown.is_cancelled() {
            self.give_up_at = Some(Instant::now() + DRAIN_TIMEOUT);
        }
        if let Some(limit) = self.give_up_at
            && Instant::now() >= limit
        {
            return Err(SendError::Abandoned(items));
        }
        Ok(delay)
    }

    /// Sleeps `delay`; a shutdown meanwhile starts the drain deadline.
    async fn pause(&mut self, delay: Duration) {
        let shutdown = self.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled(), if self.give_up_at.is_none() => {
                self.give_up_at = Some(Instant::now() + DRAIN_TIMEOUT);
            }
        }
    }

    /// Waits before another attempt while the channel's items move onto the stage.
    async fn wait_to_retry(
        &mut self,
        attempt: &mut u32,
        e: &ClientError,
        items: usize,
        batcher: &mut Batcher,
        rx: &mut mpsc::Receiver<Enqueue>,
    ) -> Result<(), SendError> {
        let delay = self
            .retry_delay(attempt, e, items)
            .map_err(|_| SendError::Abandoned(items + batcher.staged_len() + rx.len()))?;
        batcher.while_staging(rx, self.pause(delay)).await;
        Ok(())
    }

    /// Sends one batch, retrying with backoff until kjob-queue has it (runs as its own task;
    /// the sender loop keeps the channel flowing meanwhile). A batch past kjob-queue's request
    /// limits goes as several Adds, one after the other ([`split_adds`]).
    async fn send_batch(&mut self, batch: Vec<Enqueue>) -> Result<(), SendError> {
        let items: Vec<AddItem> = batch.iter().map(|e| to_item(e, &self.view_key)).collect();
        let (adds, oversized) = split_adds(items, MAX_REQUEST_BYTES);
        for it in &oversized {
            // One object larger than any request kjob-queue takes: the API server allowed it,
            // kjob-queue would refuse it. The Job's view misses it, so its worker falls back to
            // consistent reads for that Job.
            self.metrics.send_errors.inc();
            tracing::error!(key = %it.key, bytes = item_wire_bytes(it), limit = MAX_REQUEST_BYTES, "an Add item larger than kjob-queue's request limit; dropping it");
        }
        let mut left = adds.iter().map(Vec::len).sum::<usize>();
        for add in adds {
            left -= add.len();
            self.send_add(add)
                .await
                .map_err(|SendError::Abandoned(n)| SendError::Abandoned(n + left))?;
        }
        let m = &self.metrics;
        for e in &batch {
            m.enqueues.get_or_create(&QueueLabels { queue: e.queue }).inc();
            for o in &e.observations {
                m.observations.get_or_create(&ObservationLabels { kind: o.kind.label() }).inc();
            }
        }
        Ok(())
    }

    /// Sends one Add, retrying with backoff until kjob-queue has it.
    async fn send_add(&mut self, items: Vec<AddItem>) -> Result<(), SendError> {
        let mut attempt = 0u32;
        loop {
            let started = Instant::now();
            match self.client.add(items.clone()).await {
                Ok(resp) => {
                    if resp.view_session_lost {
                        tracing::warn!(
                            "kjob-queue's Redis lost the view session; beginning a new one"
                        );
                        self.view_lost.notify_one();
                    }
                    self.metrics.send_duration.observe(started.elapsed().as_secs_f64());
                    self.metrics.batches.inc();
                    self.queue_ok.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                Err(ClientError::InvalidArgument(msg)) if items.len() > 1 => {
                    // One bad item must not wedge the pipeline: send them one by one so only
                    // the refused ones are dropped.
                    tracing::warn!(error = %msg, items = items.len(), "kjob-queue refused a batch; sending its items one by one");
                    self.metrics.send_errors.inc();
                    let n = items.len();
                    for (i, it) in items.into_iter().enumerate() {
                        if let Err(SendError::Abandoned(k)) =
                            Box::pin(self.send_add(vec![it])).await
                        {
                            return Err(SendError::Abandoned(k + n - i - 1));
                        }
                    }
                    return Ok(());
                }
                Err(ClientError::InvalidArgument(msg)) => {
                    // Keys come from the API server, so this is a bug somewhere; retrying
                    // cannot help.
                    self.metrics.send_errors.inc();
                    tracing::error!(error = %msg, key = ?items.first().map(|it| &it.key), "kjob-queue refused an item; dropping it");
                    return Ok(());
                }
                Err(e) => {
                    self.metrics.send_errors.inc();
                    self.queue_ok.store(false, Ordering::Relaxed);
                    let delay = self.retry_delay(&mut attempt, &e, items.len())?;
                    self.pause(delay).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::{Observation, ObservationKind};
    use kjob_core::{JOB_QUEUE, ORPHAN_POD_QUEUE};

    fn e(queue: &'static str, key: &str, ms: u64, obs: &[&str]) -> Enqueue {
        Enqueue {
            queue,
            key: key.into(),
            delay: Duration::from_millis(ms),
            observations: obs
                .iter()
                .map(|p| Observation::new(ObservationKind::Creation, "j", *p))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn coalesce_merges_same_key_keeping_order_and_earliest_delay() {
        let out = coalesce(vec![
            e(JOB_QUEUE, "ns/a", 1000, &["p1"]),
            e(JOB_QUEUE, "ns/b", 0, &[]),
            e(ORPHAN_POD_QUEUE, "ns/a", 0, &[]),
            e(JOB_QUEUE, "ns/a", 0, &["p2"]),
            e(JOB_QUEUE, "ns/a", 40_000, &["p3"]),
        ]);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].key, "ns/a");
        assert_eq!(out[0].delay, Duration::ZERO);
        let pods: Vec<_> = out[0].observations.iter().map(|o| o.pod_uid.as_str()).collect();
        assert_eq!(pods, ["p1", "p2", "p3"]);
        assert_eq!((out[1].queue, out[1].key.as_str()), (JOB_QUEUE, "ns/b"));
        assert_eq!((out[2].queue, out[2].key.as_str()), (ORPHAN_POD_QUEUE, "ns/a"));
    }

    /// The exact encoded size of an Add of `items`, as kjob-queue's limit measures it.
    fn encoded(items: &[AddItem]) -> usize {
        use prost::Message;
        v1::AddRequest { items: items.iter().map(Into::into).collect() }.encoded_len()
    }

    fn pod(name: &str, bytes: usize) -> ViewOp<Vec<u8>> {
        ViewOp::Pod { name: name.into(), object: vec![b'x'; bytes] }
    }

    #[test]
    fn split_adds_cuts_items_past_the_op_limit_view_writes_first() {
        let obs = |i: usize| kjob_core::Observation {
            kind: kjob_core::ObservationKind::Creation,
            job_uid: "j".into(),
            pod_uid: format!("p{i}"),
        };
        let item = AddItem {
            queue: "job".into(),
            key: "ns/big".into(),
            delay: Duration::from_millis(700),
            observations: (0..600).map(obs).collect(),
            observe_only: false,
            cache: (0..1000).map(|i| pod(&format!("p{i}"), 10)).collect(),
            cache_session: "s".into(),
            priority: Some(7),
        };
        let small =
            AddItem { key: "ns/small".into(), cache: vec![], observations: vec![], ..item.clone() };
        let (adds, oversized) = split_adds(vec![item.clone(), small.clone()], MAX_REQUEST_BYTES);
        assert!(oversized.is_empty());
        assert_eq!(adds.len(), 1, "small enough for one Add");
        let pieces = &adds[0];
        // 1,600 operations: 512 + 488 view writes, then 24 + 512 + 64 observations.
        let shape: Vec<(usize, usize)> =
            pieces.iter().map(|p| (p.cache.len(), p.observations.len())).collect();
        assert_eq!(shape, [(512, 0), (488, 24), (0, 512), (0, 64), (0, 0)]);
        assert!(pieces.iter().all(|p| p.cache.len() + p.observations.len() <= MAX_ADD_ITEM_OPS));
        // Nothing lost or reordered; only the item's last piece enqueues, after its delay.
        let ops: Vec<_> = pieces[..4].iter().flat_map(|p| p.cache.clone()).collect();
        assert_eq!(ops, item.cache);
        let seen: Vec<_> = pieces[..4].iter().flat_map(|p| p.observations.clone()).collect();
        assert_eq!(seen, item.observations);
        assert!(pieces[..3].iter().all(|p| p.observe_only && p.delay.is_zero()));
        assert!(!pieces[3].observe_only && pieces[3].delay == Duration::from_millis(700));
        assert!(pieces[..3].iter().all(|p| p.priority.is_none()), "only the enqueue carries it");
        assert_eq!(pieces[3].priority, Some(7));
        assert!(pieces[..4].iter().all(|p| p.key == "ns/big" && p.cache_session == "s"));
        assert_eq!(pieces[4], small, "an item within the limits goes as it is");
    }

    #[test]
    fn split_adds_keeps_every_add_under_the_byte_limit() {
        let limit = 64 * 1024;
        // Thirty pods of 5 KiB in one item, two items of the same size, and one object
        // larger than the limit.
        let big = AddItem {
            queue: "job".into(),
            key: "ns/a".into(),
            observe_only: true,
            cache: (0..30).map(|i| pod(&format!("a{i}"), 5 * 1024)).collect(),
            cache_session: "s".into(),
            ..Default::default()
        };
        let b = AddItem { key: "ns/b".into(), ..big.clone() };
        let huge = AddItem { key: "ns/c".into(), cache: vec![pod("c", limit)], ..big.clone() };
        let (adds, oversized) = split_adds(vec![big.clone(), huge, b.clone()], limit);
        assert_eq!(oversized.len(), 1);
        assert_eq!(oversized[0].key, "ns/c");
        assert!(adds.len() >= 5, "{} Adds", adds.len());
        for add in &adds {
            let n = encoded(add);
            assert!(n <= limit, "an Add of {n} bytes");
        }
        // Every view write arrives once, in order.
        let ops: Vec<_> = adds.iter().flatten().flat_map(|p| p.cache.clone()).collect();
        let want: Vec<_> = big.cache.iter().chain(&b.cache).cloned().collect();
        assert_eq!(ops, want);
        // At the real limit, a batch the batcher makes goes whole.
        let (adds, _) = split_adds(vec![big, b], MAX_REQUEST_BYTES);
        assert_eq!(adds.len(), 1);
    }

    #[test]
    fn split_adds_caps_items_per_add() {
        let item = |i: usize| AddItem {
            queue: "job".into(),
            key: format!("ns/k{i}"),
            ..Default::default()
        };
        let (adds, _) = split_adds((0..MAX_ADD_ITEMS + 1).map(item).collect(), MAX_REQUEST_BYTES);
        let sizes: Vec<usize> = adds.iter().map(Vec::len).collect();
        assert_eq!(sizes, [MAX_ADD_ITEMS, 1]);
    }

    #[test]
    fn add_item_conversion() {
        let mut item = e(JOB_QUEUE, "ns/a", 1500, &["p1"]);
        item.observations[0].kind = ObservationKind::FinalizerRemoval;
        let key = ViewKey::new(&[3; 32]).unwrap();
        let p = to_item(&item, &key);
        assert_eq!(p.queue, "job");
        assert_eq!(p.delay, Duration::from_millis(1500));
        assert!(!p.observe_only);
        assert_eq!(p.observations[0].kind, ObservationKind::FinalizerRemoval);
        assert_eq!(p.observations[0].pod_uid, "p1");
        // View objects leave sealed as entries of the item's Job; other writes as they are.
        item.view = vec![
            ViewWrite::Pod { name: "p1".into(), object: Arc::from(&b"{}"[..]) },
            ViewWrite::Trust,
        ];
        let p = to_item(&item, &key);
        let ViewOp::Pod { object, .. } = &p.cache[0] else { panic!("{:?}", p.cache) };
        assert_eq!(key.open(EntryKind::Pod, "ns/a", object), Ok(&b"{}"[..]));
        assert!(key.open(EntryKind::Pod, "ns/b", object).is_err());
        assert_eq!(p.cache[1], ViewOp::Trust);
    }

    /// The batching rules on tokio's paused clock: the clock only moves when every task waits,
    /// so each wait below is exact.
    mod batching {
        use super::*;
        use std::sync::Arc;

        fn delayed(key: &str) -> Enqueue {
            e(JOB_QUEUE, key, 1000, &[])
        }

        fn urgent(key: &str) -> Enqueue {
            e(JOB_QUEUE, key, 0, &[])
        }

        fn keys(next: Option<Next>) -> Vec<String> {
            match next {
                Some(Next::Batch(b)) => b.into_iter().map(|e| e.key).collect(),
                other => panic!("expected a batch, got {other:?}"),
            }
        }

        /// Sends `items` into `tx`, each after its delay from the previous one.
        fn feed(tx: mpsc::Sender<Enqueue>, items: Vec<(u64, Enqueue)>) {
            tokio::spawn(async move {
                for (ms, item) in items {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    tx.send(item).await.unwrap();
                }
            });
        }

        fn delays(next: Option<Next>) -> Vec<(String, u64)> {
            match next {
                Some(Next::Batch(b)) => {
                    b.into_iter().map(|e| (e.key, e.delay.as_millis() as u64)).collect()
                }
                other => panic!("expected a batch, got {other:?}"),
            }
        }

        fn owned(v: &[(&str, u64)]) -> Vec<(String, u64)> {
            v.iter().map(|(k, ms)| (k.to_string(), *ms)).collect()
        }

        #[tokio::test(start_paused = true)]
        async fn a_delayed_item_waits_for_company_out_of_its_own_delay() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            // Items due in 1 s linger MAX_LINGER from the first; what comes meanwhile joins,
            // and each item's delay is shortened by what it waited, so each key is still due
            // 1 s after its item arrived.
            feed(
                tx.clone(),
                vec![(0, delayed("a")), (3, delayed("b")), (10, delayed("c")), (90, delayed("d"))],
            );
            let t0 = Instant::now();
            assert_eq!(delays(b.next(&mut rx).await), owned(&[("a", 900), ("b", 903), ("c", 913)]));
            assert_eq!(t0.elapsed(), MAX_LINGER);
            assert_eq!(delays(b.next(&mut rx).await), owned(&[("d", 900)]));
            assert_eq!(t0.elapsed(), Duration::from_millis(103) + MAX_LINGER);
            // A closed channel ends the linger at once, and then the sender.
            tx.send(delayed("e")).await.unwrap();
            drop(tx);
            let t1 = Instant::now();
            assert_eq!(delays(b.next(&mut rx).await), owned(&[("e", 1000)]));
            assert_eq!(t1.elapsed(), Duration::ZERO);
            assert_eq!(b.next(&mut rx).await, None, "closed and drained");
        }

        #[tokio::test(start_paused = true)]
        async fn the_most_impatient_item_ends_the_linger() {
            assert_eq!(linger_for(&urgent("a")), Duration::ZERO);
            assert_eq!(linger_for(&e(JOB_QUEUE, "a", 30, &[])), LINGER);
            assert_eq!(linger_for(&e(JOB_QUEUE, "a", 120, &[])), Duration::from_millis(70));
            assert_eq!(linger_for(&e(JOB_QUEUE, "a", 40_000, &[])), MAX_LINGER);
            let view_only = Enqueue::view_only("ns/v".into(), "s-1".into(), vec![]);
            assert_eq!(linger_for(&view_only), LINGER);
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            // An item due in 30 ms, 5 ms after one due in 1 s: the batch goes LINGER after it,
            // and neither key's due time moves.
            feed(tx.clone(), vec![(0, delayed("a")), (5, e(JOB_QUEUE, "s", 30, &[]))]);
            let t0 = Instant::now();
            assert_eq!(delays(b.next(&mut rx).await), owned(&[("a", 985), ("s", 20)]));
            assert_eq!(t0.elapsed(), Duration::from_millis(5) + LINGER);
            // View-only items linger LINGER and keep their (unused) delay.
            feed(tx.clone(), vec![(0, view_only.clone()), (4, delayed("b"))]);
            let t0 = Instant::now();
            assert_eq!(delays(b.next(&mut rx).await), owned(&[("ns/v", 0), ("b", 994)]));
            assert_eq!(t0.elapsed(), LINGER);
        }

        #[tokio::test(start_paused = true)]
        async fn an_urgent_item_goes_at_once_with_what_is_buffered() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            tx.send(urgent("a")).await.unwrap();
            tx.send(delayed("b")).await.unwrap();
            let t0 = Instant::now();
            assert_eq!(keys(b.next(&mut rx).await), ["a", "b"]);
            assert_eq!(t0.elapsed(), Duration::ZERO);
            // Mid-linger, an urgent item cuts the wait short.
            feed(tx, vec![(0, delayed("c")), (2, urgent("d")), (1, delayed("e"))]);
            let t0 = Instant::now();
            assert_eq!(keys(b.next(&mut rx).await), ["c", "d"]);
            assert_eq!(t0.elapsed(), Duration::from_millis(2));
            assert_eq!(keys(b.next(&mut rx).await), ["e"]);
        }

        #[tokio::test(start_paused = true)]
        async fn batches_in_flight_never_share_a_key() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            let mut f = InFlight::default();
            let slot = |k: &str| vec![(JOB_QUEUE, k.to_string())];
            // Sends of a (done at 10 ms) and b (20 ms, after giving up on its 3 items).
            let id = f
                .tasks
                .spawn(async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Ok(())
                })
                .id();
            f.hold(id, slot("ns/a"), 1);
            let id = f
                .tasks
                .spawn(async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Err(SendError::Abandoned(3))
                })
                .id();
            f.hold(id, slot("ns/b"), 3);
            assert!(f.conflicts(&slot("ns/a")) && f.conflicts(&slot("ns/b")));
            assert!(!f.conflicts(&slot("ns/c")));
            assert!(!f.conflicts(&[(ORPHAN_POD_QUEUE, "ns/a".into())]), "keys are per queue");
            // A batch holding a waits for a's send alone; the channel flows meanwhile.
            tx.send(delayed("x")).await.unwrap();
            let t0 = Instant::now();
            f.wait(&mut b, &mut rx, |f| f.conflicts(&slot("ns/a"))).await;
            assert_eq!(t0.elapsed(), Duration::from_millis(10));
            assert_eq!((b.staged_len(), f.tasks.len()), (1, 1));
            assert!(f.check(&b, &rx).is_ok());
            // A batch that may not overtake waits for every send in flight.
            f.wait(&mut b, &mut rx, |f| !f.tasks.is_empty()).await;
            assert_eq!(t0.elapsed(), Duration::from_millis(20));
            assert!(!f.conflicts(&slot("ns/b")));
            // A send given up on fails the sender, counting what was not sent.
            tx.send(delayed("y")).await.unwrap();
            assert!(matches!(f.check(&b, &rx), Err(SendError::Abandoned(5))));
        }

        #[tokio::test(start_paused = true)]
        async fn an_urgent_item_ends_the_wait_for_the_send_in_flight() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            feed(tx.clone(), vec![(2, delayed("a")), (3, urgent("b"))]);
            let t0 = Instant::now();
            let mut send = std::pin::pin!(tokio::time::sleep(Duration::from_millis(10)));
            assert!(b.stage_until_urgent(&mut rx, &mut send).await.is_none());
            assert_eq!((t0.elapsed(), b.staged_len()), (Duration::from_millis(5), 2));
            // Delayed items alone wait for the send's end.
            assert_eq!(keys(b.next(&mut rx).await), ["a", "b"]);
            feed(tx, vec![(1, delayed("c"))]);
            assert!(b.stage_until_urgent(&mut rx, &mut send).await.is_some());
            assert_eq!((t0.elapsed(), b.staged_len()), (Duration::from_millis(10), 1));
        }

        #[tokio::test]
        async fn a_top_up_takes_what_waits_up_to_a_session_phase() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            b.stage(delayed("b"));
            tx.send(urgent("c")).await.unwrap();
            tx.send(Enqueue::session(SessionControl::Begin("s-1".into()))).await.unwrap();
            tx.send(delayed("d")).await.unwrap();
            let mut batch = vec![delayed("a")];
            b.top_up(&mut batch, &mut rx);
            let keys: Vec<&str> = batch.iter().map(|e| e.key.as_str()).collect();
            assert_eq!(keys, ["a", "b", "c"]);
            // The phase stays first in line, then what follows it.
            assert!(matches!(b.next(&mut rx).await, Some(Next::Session(_))));
            let mut batch = vec![];
            b.top_up(&mut batch, &mut rx);
            assert_eq!(batch.len(), 1);
            b.top_up(&mut batch, &mut rx);
            assert_eq!(batch.len(), 1, "nothing waits: no wait either");
        }

        /// The clock between two of tokio's millisecond ticks, as a real clock almost always
        /// is: a timer due "now" would fire only at the next tick, a millisecond later.
        #[tokio::test(start_paused = true)]
        async fn an_urgent_item_does_not_wait_for_the_next_timer_tick() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            tokio::time::advance(Duration::from_micros(300)).await;
            tx.send(urgent("a")).await.unwrap();
            let t0 = Instant::now();
            assert_eq!(keys(b.next(&mut rx).await), ["a"]);
            assert_eq!(t0.elapsed(), Duration::ZERO);
            // Nor does a delayed item buffered behind it.
            tokio::time::advance(Duration::from_micros(300)).await;
            tx.send(urgent("b")).await.unwrap();
            tx.send(delayed("c")).await.unwrap();
            let t0 = Instant::now();
            assert_eq!(keys(b.next(&mut rx).await), ["b", "c"]);
            assert_eq!(t0.elapsed(), Duration::ZERO);
        }

        #[tokio::test(start_paused = true)]
        async fn a_full_batch_goes_without_lingering() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            for i in 0..=MAX_BATCH {
                tx.send(delayed(&format!("k{i}"))).await.unwrap();
            }
            drop(tx);
            let t0 = Instant::now();
            assert_eq!(keys(b.next(&mut rx).await).len(), MAX_BATCH);
            assert_eq!(t0.elapsed(), Duration::ZERO);
            // The last one goes alone.
            assert_eq!(keys(b.next(&mut rx).await), [format!("k{MAX_BATCH}")]);
        }

        #[tokio::test(start_paused = true)]
        async fn session_phases_and_the_byte_budget_cut_batches() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            let session: Arc<str> = "s-1".into();
            let big = |key: &str| {
                let object: Arc<[u8]> = vec![0u8; MAX_BATCH_BYTES / 2].into();
                Enqueue::view_only(
                    key.into(),
                    session.clone(),
                    vec![ViewWrite::Pod { name: key.into(), object }],
                )
            };
            tx.send(delayed("a")).await.unwrap();
            tx.send(Enqueue::session(SessionControl::Begin(session.clone()))).await.unwrap();
            tx.send(big("b")).await.unwrap();
            tx.send(big("c")).await.unwrap();
            tx.send(big("d")).await.unwrap();
            drop(tx);
            let t0 = Instant::now();
            // The phase ends the batch before it (at once) and goes alone, in order.
            assert_eq!(keys(b.next(&mut rx).await), ["a"]);
            assert_eq!(t0.elapsed(), Duration::ZERO);
            assert_eq!(b.next(&mut rx).await, Some(Next::Session(SessionControl::Begin(session))));
            // Two halves of the budget do not fit in one Add with the item overhead.
            assert_eq!(keys(b.next(&mut rx).await), ["b"]);
            assert_eq!(keys(b.next(&mut rx).await), ["c"]);
            assert_eq!(keys(b.next(&mut rx).await), ["d"]);
            assert_eq!(b.next(&mut rx).await, None);
        }

        #[tokio::test(start_paused = true)]
        async fn the_channel_keeps_flowing_while_a_batch_is_in_flight() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            // Twice what the channel holds arrives while one Add takes a second.
            let n = 2 * SEND_BUFFER;
            let fed = tokio::spawn(async move {
                for i in 0..n {
                    tx.send(delayed(&format!("k{i}"))).await.unwrap();
                }
                Instant::now()
            });
            let t0 = Instant::now();
            b.while_staging(&mut rx, tokio::time::sleep(Duration::from_secs(1))).await;
            assert_eq!(t0.elapsed(), Duration::from_secs(1));
            // The informer never waited on the Add.
            assert_eq!(fed.await.unwrap(), t0);
            assert_eq!(b.staged_len() + rx.len(), n);
            // Staged items come out first and in order, without lingering, then the channel.
            let mut seen = Vec::new();
            while seen.len() < n {
                seen.extend(keys(b.next(&mut rx).await));
            }
            assert_eq!(t0.elapsed(), Duration::from_secs(1));
            assert_eq!(seen, (0..n).map(|i| format!("k{i}")).collect::<Vec<_>>());
            assert_eq!(b.next(&mut rx).await, None, "closed and drained");
        }

        #[tokio::test(start_paused = true)]
        async fn a_full_stage_holds_the_channel() {
            let (tx, mut rx) = channel();
            let mut b = Batcher::default();
            // Each item counts half the stage's budget (one shared buffer, so no real memory).
            let object: Arc<[u8]> = vec![0u8; STAGE_LIMIT_BYTES / 2].into();
            let session: Arc<str> = "s-1".into();
            for key in ["a", "b", "c", "d"] {
                let write = ViewWrite::Pod { name: key.into(), object: object.clone() };
                tx.send(Enqueue::view_only(key.into(), session.clone(), vec![write]))
                    .await
                    .unwrap();
            }
            b.while_staging(&mut rx, tokio::time::sleep(Duration::from_secs(1))).await;
            // Two fill the stage; the rest wait in the channel, as the watch streams then do.
            assert_eq!((b.staged_len(), rx.len()), (2, 2));
            drop(tx);
            for key in ["a", "b", "c", "d"] {
                assert_eq!(keys(b.next(&mut rx).await), [key]);
            }
            assert_eq!(b.next(&mut rx).await, None);
        }
    }
}
