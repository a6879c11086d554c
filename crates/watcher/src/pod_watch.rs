//! The pod informer's list and watch over the API server's protobuf encoding
//! (`--watch-encoding protobuf`, [`crate::kube_proto`]).
//!
//! kube-runtime's watcher speaks JSON only; this is its list-then-watch machine for pods with
//! the wire format changed, yielding the same [`Event`]s, so the informer above it is the same
//! for both encodings:
//! * a list in pages of [`PAGE_SIZE`] (a consistent read, as kube-runtime's default) gives
//!   `Init`, an `InitApply` per pod and `InitDone`;
//! * a watch from the list's resourceVersion, with bookmarks, gives `Apply` / `Delete`;
//!   bookmarks only move the resourceVersion on; a watch the server ends (its timeout) is
//!   opened again from the last resourceVersion;
//! * `410 Gone` (the resourceVersion is compacted away), as an answer or as an ERROR event,
//!   starts a new list, whose `Init` … `InitDone` the informer turns into tombstones;
//! * any other failure is returned as an error and the next poll retries where it stopped;
//!   the caller paces retries with kube-runtime's default backoff, as for the JSON watcher.
//!
//! Every request asks for protobuf with JSON as second choice, and each answer is decoded by
//! its Content-Type, so a server without protobuf (kjob-sim) is watched all the same.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http_body_util::BodyExt as _;
use kube::runtime::watcher::Event;

use crate::kube_proto::{self, ProtoError};
use crate::view::WatchedPod;

/// Pods per list page: client-go's pager default, as kube-runtime's.
pub const PAGE_SIZE: u32 = 500;
/// How long the server keeps a watch open before ending it: kube-runtime's default (client-go
/// picks 5–10 minutes at random; a fixed value keeps restarts predictable).
pub const WATCH_TIMEOUT_SECS: u32 = 290;
/// Silence after which a watch counts as dead: the server's timeout and a margin for a
/// bookmark or the close to arrive (kube-runtime's margin).
const WATCH_IDLE: Duration = Duration::from_secs(WATCH_TIMEOUT_SECS as u64 + 5);
/// Longest wait for a list page's whole answer: a page of 500 pods is about a megabyte.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a list or watch failed (the stream goes on; the next poll retries).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The request failed (connection, TLS, timeout).
    #[error("request: {0}")]
    Request(#[from] kube::Error),
    /// The server answered with a failure.
    #[error("{code} {reason}: {message}")]
    Status {
        /// HTTP or Status code.
        code: u16,
        /// Status reason.
        reason: String,
        /// Status message.
        message: String,
    },
    /// An answer did not decode as protobuf.
    #[error(transparent)]
    Proto(#[from] ProtoError),
    /// An answer did not decode as JSON.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The watch went silent past [`WATCH_IDLE`], or a list page past [`LIST_TIMEOUT`].
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// The body broke off.
    #[error("body: {0}")]
    Body(String),
}

/// Where the machine is.
enum Phase {
    /// Next: `Init`, then the first page.
    Start,
    /// Next: the page after `continue_token` (`None` for the first).
    Listing { continue_token: Option<String> },
    /// Listed up to `rv`: next, a watch from it.
    Listed { rv: String },
    /// Reading a watch opened at or after `rv`.
    Watching { rv: String, body: BoxedBody, buf: BytesMut, protobuf: bool },
}

type BoxedBody = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

/// What is listed and watched, and how.
struct Target {
    client: kube::Client,
    /// `/api/v1/pods` or `/api/v1/namespaces/<ns>/pods`.
    path: String,
    /// Ask for protobuf (else JSON only).
    protobuf: bool,
}

/// The pods' list-and-watch machine.
struct PodWatch {
    target: Target,
    phase: Phase,
    ready: VecDeque<Event<WatchedPod>>,
}

/// The pod events of `namespace` (all when `None`), listed and watched as protobuf when
/// `protobuf`, else as JSON; an endless stream, as kube-runtime's watcher.
pub fn watch_pods(
    client: kube::Client,
    namespace: Option<&str>,
    protobuf: bool,
) -> impl Stream<Item = Result<Event<WatchedPod>, WatchError>> + Send + use<> {
    let path = match namespace {
        Some(ns) => format!("/api/v1/namespaces/{ns}/pods"),
        None => "/api/v1/pods".to_string(),
    };
    let target = Target { client, path, protobuf };
    let w = PodWatch { target, phase: Phase::Start, ready: VecDeque::new() };
    futures::stream::unfold(w, |mut w| async move {
        let next = w.next().await;
        Some((next, w))
    })
}

/// A JSON list answer.
#[derive(serde::Deserialize)]
struct JsonList {
    #[serde(default)]
    metadata: JsonListMeta,
    #[serde(default)]
    items: Vec<WatchedPod>,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonListMeta {
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

/// A JSON watch event, its object decoded once its type is known.
#[derive(serde::Deserialize)]
struct JsonEvent<'a> {
    #[serde(rename = "type")]
    type_: String,
    #[serde(borrow)]
    object: &'a serde_json::value::RawValue,
}

/// A failure's Status, as JSON.
#[derive(Default, serde::Deserialize)]
struct JsonStatus {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

const GONE: u16 = 410;

impl PodWatch {
    async fn next(&mut self) -> Result<Event<WatchedPod>, WatchError> {
        loop {
            if let Some(ev) = self.ready.pop_front() {
                return Ok(ev);
            }
            match std::mem::replace(&mut self.phase, Phase::Start) {
                Phase::Start => {
                    self.phase = Phase::Listing { continue_token: None };
                    return Ok(Event::Init);
                }
                Phase::Listing { continue_token } => {
                    let page = match self.target.list(continue_token.as_deref()).await {
                        Ok(page) => page,
                        Err(e) => {
                            // A continue token that expired (410) restarts the list.
                            self.phase = if is_gone(&e) {
                                Phase::Start
                            } else {
                                Phase::Listing { continue_token }
                            };
                            return Err(e);
                        }
                    };
                    self.ready.extend(page.items.into_iter().map(Event::InitApply));
                    self.phase = if page.continue_token.is_empty() {
                        self.ready.push_back(Event::InitDone);
                        Phase::Listed { rv: page.resource_version }
                    } else {
                        Phase::Listing { continue_token: Some(page.continue_token) }
                    };
                }
                Phase::Listed { rv } => match self.target.open_watch(&rv).await {
                    Ok((body, protobuf)) => {
                        self.phase = Phase::Watching { rv, body, buf: BytesMut::new(), protobuf }
                    }
                    Err(e) => {
                        self.phase = if is_gone(&e) { Phase::Start } else { Phase::Listed { rv } };
                        return Err(e);
                    }
                },
                Phase::Watching { mut rv, mut body, mut buf, protobuf } => {
                    match read_event(&mut rv, &mut body, &mut buf, protobuf).await {
                        Ok(Some(ev)) => {
                            self.phase = Phase::Watching { rv, body, buf, protobuf };
                            return Ok(ev);
                        }
                        // The server closed the watch (its timeout): open it again.
                        Ok(None) => self.phase = Phase::Listed { rv },
                        Err(e) => {
                            self.phase =
                                if is_gone(&e) { Phase::Start } else { Phase::Listed { rv } };
                            return Err(e);
                        }
                    }
                }
            }
        }
    }
}

impl Target {
    fn request(
        &self,
        query: &str,
        accept: &'static str,
    ) -> Result<http::Request<kube::client::Body>, WatchError> {
        http::Request::get(format!("{}?{query}", self.path))
            .header(http::header::ACCEPT, accept)
            .body(kube::client::Body::from(Vec::new()))
            .map_err(|e| WatchError::Request(kube::Error::HttpError(e)))
    }

    /// Sends `request`; a failure's Status becomes [`WatchError::Status`].
    async fn send(
        &self,
        request: http::Request<kube::client::Body>,
    ) -> Result<(http::response::Parts, kube::client::Body, bool), WatchError> {
        let response = self.client.send(request).await?;
        let (parts, body) = response.into_parts();
        let protobuf = kube_proto::is_protobuf(
            parts.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
        );
        if parts.status.is_success() {
            return Ok((parts, body, protobuf));
        }
        let code = parts.status.as_u16();
        let bytes = tokio::time::timeout(LIST_TIMEOUT, body.collect())
            .await
            .map_err(|_| WatchError::TimedOut(LIST_TIMEOUT))?
            .map_err(|e| WatchError::Body(e.to_string()))?
            .to_bytes();
        Err(status_error(&bytes, protobuf, code))
    }

    async fn list(&self, continue_token: Option<&str>) -> Result<kube_proto::PodPage, WatchError> {
        let mut query = format!("limit={PAGE_SIZE}");
        if let Some(token) = continue_token {
            query.push_str("&continue=");
            query.push_str(&encode_query(token));
        }
        let accept = if self.protobuf { kube_proto::ACCEPT_LIST } else { "application/json" };
        let (_, body, protobuf) = self.send(self.request(&query, accept)?).await?;
        let bytes = tokio::time::timeout(LIST_TIMEOUT, body.collect())
            .await
            .map_err(|_| WatchError::TimedOut(LIST_TIMEOUT))?
            .map_err(|e| WatchError::Body(e.to_string()))?
            .to_bytes();
        if protobuf {
            return Ok(kube_proto::decode_pod_list(bytes)?);
        }
        let list: JsonList = serde_json::from_slice(&bytes)?;
        Ok(kube_proto::PodPage {
            items: list.items,
            resource_version: list.metadata.resource_version.unwrap_or_default(),
            continue_token: list.metadata.continue_token.unwrap_or_default(),
        })
    }

    async fn open_watch(&self, rv: &str) -> Result<(BoxedBody, bool), WatchError> {
        let query = format!(
            "watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_SECS}\
             &resourceVersion={}",
            encode_query(rv)
        );
        let accept =
            if self.protobuf { kube_proto::ACCEPT_WATCH } else { "application/json;stream=watch" };
        let (_, body, protobuf) = self.send(self.request(&query, accept)?).await?;
        let stream = body.into_data_stream().map(|r| r.map_err(|e| e.to_string()));
        Ok((Box::pin(stream), protobuf))
    }
}

/// The next event of the watch (bookmarks and non-Gone ERROR events are consumed here);
/// `None` when the server ended the watch.
async fn read_event(
    rv: &mut String,
    body: &mut BoxedBody,
    buf: &mut BytesMut,
    protobuf: bool,
) -> Result<Option<Event<WatchedPod>>, WatchError> {
    loop {
        let event = if protobuf { proto_event(buf)? } else { json_event(buf)? };
        if let Some((ty, pod)) = event {
            match (ty.as_str(), pod) {
                (_, Decoded::Failure(e)) => {
                    if is_gone(&e) {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "pod watch: an ERROR event; watching on");
                }
                ("BOOKMARK", Decoded::Pod(p)) => {
                    *rv = p.metadata.resource_version.unwrap_or_default();
                }
                (ty, Decoded::Pod(p)) => {
                    if let Some(v) = &p.metadata.resource_version {
                        rv.clone_from(v);
                    }
                    return Ok(Some(match ty {
                        "DELETED" => Event::Delete(*p),
                        _ => Event::Apply(*p),
                    }));
                }
            }
            continue;
        }
        match tokio::time::timeout(WATCH_IDLE, body.next()).await {
            Err(_) => return Err(WatchError::TimedOut(WATCH_IDLE)),
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => return Err(WatchError::Body(e)),
            Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
        }
    }
}

fn proto_event(buf: &mut BytesMut) -> Result<Option<(String, Decoded)>, WatchError> {
    let Some(frame) = kube_proto::next_frame(buf)? else { return Ok(None) };
    let (ty, object) = kube_proto::decode_watch_event(frame)?;
    let decoded = if ty == "ERROR" {
        let s = kube_proto::decode_status(object)?;
        Decoded::Failure(WatchError::Status {
            code: s.code.and_then(|c| u16::try_from(c).ok()).unwrap_or_default(),
            reason: s.reason.unwrap_or_default(),
            message: s.message.unwrap_or_default(),
        })
    } else {
        Decoded::Pod(Box::new(kube_proto::decode_pod(object)?))
    };
    Ok(Some((ty, decoded)))
}

/// A watch event's object: a pod, or an ERROR event's Status.
enum Decoded {
    Pod(Box<WatchedPod>),
    Failure(WatchError),
}

/// The next newline-terminated JSON event off the front of `buf`, if it holds one.
fn json_event(buf: &mut BytesMut) -> Result<Option<(String, Decoded)>, WatchError> {
    let line = loop {
        let Some(end) = buf.iter().position(|b| *b == b'\n') else { return Ok(None) };
        let line = buf.split_to(end + 1);
        if !line.trim_ascii().is_empty() {
            break line;
        }
    };
    let ev: JsonEvent<'_> = serde_json::from_slice(line.trim_ascii())?;
    let decoded = if ev.type_ == "ERROR" {
        let s: JsonStatus = serde_json::from_str(ev.object.get())?;
        Decoded::Failure(WatchError::Status { code: s.code, reason: s.reason, message: s.message })
    } else {
        Decoded::Pod(Box::new(serde_json::from_str(ev.object.get())?))
    };
    Ok(Some((ev.type_, decoded)))
}

/// A failed answer's Status as an error (the HTTP code when the body is no Status).
fn status_error(body: &[u8], protobuf: bool, http_code: u16) -> WatchError {
    let (code, reason, message) = if protobuf {
        match kube_proto::decode_status(Bytes::copy_from_slice(body)) {
            Ok(s) => (
                s.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(http_code),
                s.reason.unwrap_or_default(),
                s.message.unwrap_or_default(),
            ),
            Err(_) => (http_code, String::new(), String::from_utf8_lossy(body).into_owned()),
        }
    } else {
        match serde_json::from_slice::<JsonStatus>(body) {
            Ok(s) => (if s.code == 0 { http_code } else { s.code }, s.reason, s.message),
            Err(_) => (http_code, String::new(), String::from_utf8_lossy(body).into_owned()),
        }
    };
    WatchError::Status { code, reason, message }
}

fn is_gone(e: &WatchError) -> bool {
    matches!(e, WatchError::Status { code: GONE, .. })
}

/// Percent-encodes a query value (continue tokens are base64, with `=`, `+` and `/`).
fn encode_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_events_come_off_the_buffer_line_by_line() {
        let mut buf = BytesMut::from(
            &br#"{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}}
{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"old"}}
{"type":"BOOKM"#[..],
        );
        let Some((ty, Decoded::Pod(p))) = json_event(&mut buf).unwrap() else { panic!() };
        assert_eq!((ty.as_str(), p.metadata.name.as_deref()), ("ADDED", Some("a")));
        let Some((_, Decoded::Failure(e))) = json_event(&mut buf).unwrap() else { panic!() };
        assert!(is_gone(&e), "{e}");
        assert!(json_event(&mut buf).unwrap().is_none(), "a partial line waits");
    }

    #[test]
    fn failures_keep_their_code() {
        let json = br#"{"kind":"Status","code":410,"reason":"Expired","message":"too old"}"#;
        assert!(is_gone(&status_error(json, false, 410)));
        let e = status_error(b"bad gateway", false, 502);
        assert!(matches!(e, WatchError::Status { code: 502, .. }), "{e}");
        assert_eq!(encode_query("a+b/c=="), "a%2Bb%2Fc%3D%3D");
    }
}
