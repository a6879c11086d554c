//! Watch streams: newline-delimited JSON events, one per line, with selector transitions,
//! bookmarks (including the streaming-list end marker), a server timeout and 410 ERRORs.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::store::{EventType, StoreEvent, WatchStart};

/// Decides whether a stored object is visible to the watch (namespace and selectors).
pub type Filter = Arc<dyn Fn(&Value) -> bool + Send + Sync>;
/// Turns a stored object into what goes on the wire (events view, Table rows).
pub type Render = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

/// How long before the watch timeout the last bookmark is sent.
const FINAL_BOOKMARK_LEAD: Duration = Duration::from_secs(2);

/// Annotation marking the bookmark that ends a streaming list's initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Everything a watch stream needs.
pub struct WatchSpec {
    /// Store kind watched (events of other kinds only move the bookmark revision).
    pub kind: crate::resources::StoreKind,
    /// `apiVersion` of bookmark objects.
    pub api_version: String,
    /// `kind` of bookmark objects.
    pub object_kind: String,
    /// Visibility filter.
    pub filter: Filter,
    /// Wire rendering.
    pub render: Render,
    /// `render` sends stored objects as they are, so events can share one encoding.
    pub as_stored: bool,
    /// Only events after this revision are sent (`None`: start with the current objects).
    pub after: Option<u64>,
    /// Send BOOKMARK events periodically.
    pub bookmarks: bool,
    /// Streaming list: end the initial ADDED events with the end-marker bookmark.
    pub send_initial_events: bool,
    /// Period of bookmarks.
    pub bookmark_interval: Duration,
    /// Server-side end of the stream.
    pub timeout: Duration,
    /// Cancelled to close every open watch (test hook) or on shutdown.
    pub close: CancellationToken,
}

// An event line around an already encoded object.
fn line_encoded(typ: &str, object: &[u8]) -> Bytes {
    let mut buf = Vec::with_capacity(object.len() + 32);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(typ.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    buf.extend_from_slice(object);
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}

// The event line of a stored change's new state, encoding it once for all watches.
fn line_of(spec: &WatchSpec, typ: &str, e: &StoreEvent) -> Bytes {
    if !spec.as_stored {
        return line(typ, (spec.render)(&e.object));
    }
    line_encoded(typ, e.object.json())
}

fn line(typ: &str, object: Value) -> Bytes {
    let mut buf = serde_json::to_vec(&json!({"type": typ, "object": object})).unwrap_or_default();
    buf.push(b'\n');
    Bytes::from(buf)
}

/// The single ERROR line sent when the start revision was compacted away.
pub fn expired_line(asked: u64, compacted: u64) -> Bytes {
    let err = ApiError::expired(format!("too old resource version: {asked} ({compacted})"));
    line("ERROR", err.to_status())
}

fn bookmark(spec: &WatchSpec, rv: u64, end_marker: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if end_marker {
        meta["annotations"] = json!({INITIAL_EVENTS_END: "true"});
    }
    line(
        "BOOKMARK",
        json!({"kind": spec.object_kind, "apiVersion": spec.api_version, "metadata": meta}),
    )
}

// The wire event for a store change as seen through the filter, with selector transitions:
// entering the filter is ADDED, leaving it is DELETED with the old content at the new revision.
fn convert(spec: &WatchSpec, e: &StoreEvent) -> Option<Bytes> {
    if e.kind != spec.kind {
        return None;
    }
    let now = (spec.filter)(&e.object);
    match e.typ {
        EventType::Added => now.then(|| line_of(spec, "ADDED", e)),
        EventType::Deleted => now.then(|| line_of(spec, "DELETED", e)),
        EventType::Modified => {
            let before = e.prev.as_deref().is_some_and(|p| (spec.filter)(p));
            match (before, now) {
                (true, true) => Some(line_of(spec, "MODIFIED", e)),
                (false, true) => Some(line_of(spec, "ADDED", e)),
                (true, false) => {
                    let mut old = e.prev.as_deref().map_or(Value::Null, |p| p.value().clone());
                    if let Some(m) = old.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.insert("resourceVersion".into(), json!(e.rv.to_string()));
                    }
                    Some(line("DELETED", (spec.render)(&old)))
                }
                (false, false) => None,
            }
        }
    }
}

/// The body of a watch response.
pub fn stream(
    spec: WatchSpec,
    start: WatchStart,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    async_stream::stream! {
        let WatchStart { initial, replay, mut rx, rv: snapshot_rv } = start;
        let deadline = tokio::time::Instant::now() + spec.timeout;
        for obj in &initial {
            if (spec.filter)(obj) {
                if spec.as_stored {
                    yield Ok(line_encoded("ADDED", obj.json()));
                } else {
                    yield Ok(line("ADDED", (spec.render)(obj)));
                }
            }
        }
        let after = spec.after.unwrap_or(snapshot_rv);
        // Highest revision every event of which has been considered: the bookmark revision.
        let mut seen = after.max(snapshot_rv);
        if spec.send_initial_events {
            yield Ok(bookmark(&spec, snapshot_rv.max(after), true));
        }
        for e in &replay {
            if e.rv > after && let Some(b) = convert(&spec, e) {
                yield Ok(b);
            }
        }
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + spec.bookmark_interval, spec.bookmark_interval);
        // Real servers also send one bookmark shortly before the watch's own timeout, so the
        // client resumes from a recent revision.
        let final_bookmark_at = deadline.checked_sub(FINAL_BOOKMARK_LEAD).filter(|t| *t > tokio::time::Instant::now());
        let mut final_bookmark_sent = final_bookmark_at.is_none();
        loop {
            tokio::select! {
                r = rx.recv() => match r {
                    Ok(e) => {
                        if e.rv <= after {
                            continue;
                        }
                        seen = seen.max(e.rv);
                        if let Some(b) = convert(&spec, &e) {
                            yield Ok(b);
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::debug!(missed = n, "watcher fell behind; ending it with 410");
                        yield Ok(line("ERROR", ApiError::expired(format!("too old resource version: {seen} ({seen})")).to_status()));
                        break;
                    }
                    Err(RecvError::Closed) => break,
                },
                _ = ticker.tick(), if spec.bookmarks => {
                    yield Ok(bookmark(&spec, seen, false));
                }
                _ = tokio::time::sleep_until(final_bookmark_at.unwrap_or(deadline)), if spec.bookmarks && !final_bookmark_sent => {
                    final_bookmark_sent = true;
                    yield Ok(bookmark(&spec, seen, false));
                }
                _ = tokio::time::sleep_until(deadline) => break,
                _ = spec.close.cancelled() => break,
            }
        }
    }
}
