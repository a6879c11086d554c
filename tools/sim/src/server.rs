//! HTTP front of the simulator: path routing, query options, verbs, list/watch responses.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use jiff::Timestamp;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::hooks::{Faults, Metrics};
use crate::registry::{self, DeleteOpts, Deleted, Part, PatchType, WriteOpts};
use crate::resources::{self, RESOURCES, Resource, StoreKind};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Key, ListAt, ListQuery, Obj, Store};
use crate::subresources::PodCall;
use crate::watch::{self, Filter, Render, WatchSpec};
use crate::{SimConfig, discovery, table};

/// Largest request body accepted (the real server's limit is 3 MiB for objects).
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// How much of an oversized body is read and discarded before answering 413: answering while
/// the client still sends makes it see a reset connection instead of the Status.
const DRAIN_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Bound on reading a request body (a client that stops sending mid-body).
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a read asking for a future resourceVersion waits before answering 504.
const TOO_NEW_WAIT: Duration = Duration::from_secs(3);
/// Server-side watch timeout when the client gives none (real servers pick 30–60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Shared state of one simulator instance.
pub struct App {
    /// The object store.
    pub store: Arc<Store>,
    /// Start-up configuration.
    pub config: SimConfig,
    /// Injected faults and latencies.
    pub faults: Faults,
    /// Request counters.
    pub metrics: Metrics,
    /// Cancelled (and replaced) to close every open watch.
    pub watch_close: Mutex<CancellationToken>,
    /// Cancelled on shutdown.
    pub shutdown: CancellationToken,
    /// Kubelet control, when a kubelet runs.
    pub kubelet: Mutex<Option<crate::KubeletControl>>,
}

impl App {
    /// Builds the state.
    pub fn new(config: SimConfig, shutdown: CancellationToken) -> Self {
        let faults = Faults::new(config.write_latency, config.read_latency);
        Self {
            store: Arc::new(Store::new(config.history_window)),
            config,
            faults,
            metrics: Metrics::new(),
            watch_close: Mutex::new(shutdown.child_token()),
            shutdown,
            kubelet: Mutex::new(None),
        }
    }

    /// Closes every open watch stream now.
    pub fn close_watches(&self) {
        let mut guard = self.watch_close.lock();
        guard.cancel();
        *guard = self.shutdown.child_token();
    }
}

/// Parsed query string (repeated keys: last wins; `?&` and bare `?` tolerated).
#[derive(Debug, Default)]
pub struct Query(Vec<(String, String)>);

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Query {
    /// Parses a raw query string.
    pub fn parse(q: Option<&str>) -> Self {
        let pairs = q
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (percent_decode(k), percent_decode(v)),
                None => (percent_decode(p), String::new()),
            })
            .collect();
        Self(pairs)
    }

    /// The value of a parameter.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | "True"))
    }

    fn write_opts(&self, headers: &HeaderMap) -> WriteOpts {
        let user_agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok());
        WriteOpts {
            dry_run: self.get("dryRun") == Some("All"),
            strict: self.get("fieldValidation") == Some("Strict"),
            field_manager: crate::ownership::manager_name(self.get("fieldManager"), user_agent),
        }
    }
}

/// A request for a resource path.
#[derive(Debug)]
struct Target {
    res: &'static Resource,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_target(segs: &[&str]) -> Option<Target> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let find = |plural: &str| Resource::find(group, version, plural);
    match rest {
        ["namespaces", ns, plural, tail @ ..] if find(plural).is_some_and(|r| r.namespaced()) => {
            let res = find(plural)?;
            match tail {
                [] => Some(Target { res, ns: Some((*ns).to_owned()), name: None, sub: None }),
                [name] => Some(Target {
                    res,
                    ns: Some((*ns).to_owned()),
                    name: Some((*name).to_owned()),
                    sub: None,
                }),
                [name, sub] => Some(Target {
                    res,
                    ns: Some((*ns).to_owned()),
                    name: Some((*name).to_owned()),
                    sub: Some((*sub).to_owned()),
                }),
                _ => None,
            }
        }
        [plural, tail @ ..] => {
            let res = find(plural)?;
            match tail {
                [] => Some(Target { res, ns: None, name: None, sub: None }),
                [name] if !res.namespaced() => {
                    Some(Target { res, ns: None, name: Some((*name).to_owned()), sub: None })
                }
                [name, sub] if !res.namespaced() => Some(Target {
                    res,
                    ns: None,
                    name: Some((*name).to_owned()),
                    sub: Some((*sub).to_owned()),
                }),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Entry point for every request.
pub async fn handle(app: Arc<App>, req: Request<Body>) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let query = Query::parse(parts.uri.query());
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["sim", ..] => {
            let body = axum::body::to_bytes(body, MAX_BODY_BYTES).await.unwrap_or_default();
            return crate::hooks::handle(&app, &parts.method, &segs[1..], &body);
        }
        ["metrics"] => return app.metrics.render(),
        ["healthz" | "livez" | "readyz"] => return (StatusCode::OK, "ok").into_response(),
        _ => {}
    }
    if let Some(resp) = discovery::handle(&parts.method, &segs, &query) {
        return resp;
    }
    let Some(target) = parse_target(&segs) else {
        return ApiError::path_not_found().into_response();
    };
    let verb = verb_of(&parts.method, &target, &query);
    let resource_label = target.res.qualified();
    let agent = crate::hooks::agent_of(&parts.headers);
    if let Some(err) =
        app.faults.injected_error().or_else(|| app.faults.quota_error(verb, &resource_label))
    {
        app.metrics.count(verb, &resource_label, err.code, &agent);
        return err.into_response();
    }
    let is_write = !matches!(verb, "get" | "list" | "watch");
    let latency = if is_write {
        app.faults.write_latency(&resource_label)
    } else {
        app.faults.read_latency()
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let body = match read_body(body).await {
        Ok(b) => b,
        Err(e) => {
            app.metrics.count(verb, &resource_label, e.code, &agent);
            return e.into_response();
        }
    };
    let resp =
        match dispatch(&app, &parts.method, &parts.headers, &query, &target, verb, body).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        };
    app.metrics.count(verb, &resource_label, resp.status().as_u16(), &agent);
    resp
}

// The request body up to MAX_BODY_BYTES; a larger one is drained (up to DRAIN_BODY_BYTES) and
// refused with 413.
async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map(|f| f.into_data()) else {
                return Err(ApiError::bad_request("error reading the request body"));
            };
            let Ok(data) = data else { continue };
            seen += data.len();
            if seen > DRAIN_BODY_BYTES {
                break;
            }
            if seen <= MAX_BODY_BYTES {
                buf.extend_from_slice(&data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Ok(Ok(())) if seen <= MAX_BODY_BYTES => Ok(buf.freeze()),
        Ok(Ok(())) => Err(ApiError::too_large("request body too large")),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError::bad_request("timed out reading the request body")),
    }
}

fn verb_of(method: &Method, t: &Target, q: &Query) -> &'static str {
    // A watch parameter on a named GET is a get, as in the real server.
    let named = t.name.is_some();
    resources::request_verb(method.as_str(), named, !named && q.flag("watch")).unwrap_or("other")
}

fn json_response(code: StatusCode, v: &Value, content_type: &'static str) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut resp = (code, body).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn parse_body(body: &Bytes, yaml_ok: bool) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the body of the request was empty"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(e) if yaml_ok => serde_yaml::from_slice::<Value>(body).map_err(|ye| {
            ApiError::bad_request(format!("error decoding YAML: {ye} (as JSON: {e})"))
        }),
        Err(e) => {
            Err(ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}")))
        }
    }
}

/// How objects are rendered on the way out, from the Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Full,
    Table,
    PartialMeta,
}

fn format_of(headers: &HeaderMap) -> Format {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let first = accept.split(',').next().unwrap_or_default();
    if first.contains("as=Table") {
        Format::Table
    } else if first.contains("as=PartialObjectMetadata") {
        Format::PartialMeta
    } else {
        Format::Full
    }
}

fn partial_meta(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

fn render_fn(res: &'static Resource, format: Format) -> Render {
    let now = Timestamp::now();
    match format {
        Format::Full => Arc::new(move |o: &Value| resources::to_view(res, o)),
        Format::PartialMeta => Arc::new(partial_meta),
        Format::Table => {
            Arc::new(move |o: &Value| table::table(res, &[resources::to_view(res, o)], None, now))
        }
    }
}

async fn dispatch(
    app: &Arc<App>,
    method: &Method,
    headers: &HeaderMap,
    q: &Query,
    t: &Target,
    verb: &str,
    body: Bytes,
) -> Result<Response, ApiError> {
    let res = t.res;
    let ns = t.ns.as_deref();
    let now = Timestamp::now();
    let store = &app.store;
    let format = format_of(headers);
    match (verb, t.name.as_deref(), t.sub.as_deref()) {
        ("list", None, None) => list(app, q, t, format).await,
        ("watch", None, None) => watch(app, q, t, format),
        ("get", Some(name), None | Some("status")) => {
            wait_for_rv(store, q.get("resourceVersion")).await?;
            let key: Key = (ns.unwrap_or_default().to_owned(), name.to_owned());
            let obj = store.get(res.store, &key).ok_or_else(|| ApiError::not_found(res, name))?;
            Ok(render_one(res, &obj, format, StatusCode::OK))
        }
        ("create", None, None) => {
            let obj = registry::create(
                store,
                res,
                ns,
                parse_body(&body, false)?,
                &q.write_opts(headers),
                now,
            )?;
            Ok(render_one(res, &obj, Format::Full, StatusCode::CREATED))
        }
        ("create", Some(name), Some(sub @ ("binding" | "eviction")))
            if res.store == StoreKind::Pod =>
        {
            let pod = PodCall { store, ns: ns.unwrap_or_default(), name, now };
            let body = parse_body(&body, false)?;
            if sub == "binding" { pod.bind(&body) } else { pod.evict(&body) }?;
            Ok(json_response(StatusCode::CREATED, &success_status(None), "application/json"))
        }
        ("update", Some(name), None | Some("status")) => {
            let part = if t.sub.is_some() { Part::Status } else { Part::Main };
            if part == Part::Status && !res.subresources.contains(&"status") {
                return Err(ApiError::path_not_found());
            }
            let (obj, created) = registry::update(
                store,
                res,
                ns,
                name,
                parse_body(&body, false)?,
                part,
                &q.write_opts(headers),
                now,
            )?;
            let code = if created { StatusCode::CREATED } else { StatusCode::OK };
            Ok(render_one(res, &obj, Format::Full, code))
        }
        ("update", Some(name), Some("finalize")) if res.store == StoreKind::Namespace => {
            let obj =
                crate::subresources::finalize_namespace(store, name, &parse_body(&body, false)?)?;
            Ok(render_one(res, &obj, Format::Full, StatusCode::OK))
        }
        ("patch", Some(name), None | Some("status")) => {
            let part = if t.sub.is_some() { Part::Status } else { Part::Main };
            if part == Part::Status && !res.subresources.contains(&"status") {
                return Err(ApiError::path_not_found());
            }
            let ct =
                headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
            let ptype =
                PatchType::from_content_type(ct).ok_or_else(ApiError::unsupported_media_type)?;
            let patch_body = parse_body(&body, ptype == PatchType::Apply)?;
            let (obj, created) = registry::patch(
                store,
                res,
                ns,
                name,
                ptype,
                &patch_body,
                part,
                q.get("fieldManager"),
                q.flag("force"),
                &q.write_opts(headers),
                now,
            )?;
            let code = if created { StatusCode::CREATED } else { StatusCode::OK };
            Ok(render_one(res, &obj, Format::Full, code))
        }
        ("delete", Some(name), None) => {
            let opts = delete_opts(q, &body)?;
            let out = registry::delete(store, res, ns, name, &opts, now)?;
            Ok(delete_response(res, out))
        }
        ("deletecollection", None, None) => {
            let opts = delete_opts(q, &body)?;
            let filter = make_filter(res, q, t.ns.clone())?;
            let page = store.list(ListQuery::of(res.store, ns), &*filter)?;
            let mut deleted = Vec::new();
            for obj in page.items {
                let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                let ons = obj["metadata"]["namespace"].as_str().map(str::to_owned);
                match registry::delete(store, res, ons.as_deref(), &name, &opts, now) {
                    Ok(Deleted::Gone(o) | Deleted::Pending(o)) => {
                        deleted.push(resources::to_view(res, &o))
                    }
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            let list = list_object(res, deleted, store.current_rv(), None, None);
            Ok(json_response(StatusCode::OK, &list, "application/json"))
        }
        _ => {
            let _ = method;
            Err(ApiError::method_not_allowed())
        }
    }
}

fn success_status(details: Option<Value>) -> Value {
    let mut v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"});
    if let Some(d) = details {
        v["details"] = d;
    }
    v
}

fn delete_opts(q: &Query, body: &Bytes) -> Result<DeleteOpts, ApiError> {
    // A non-empty body wins; otherwise the query parameters carry the options.
    if !body.is_empty() {
        let v: Value =
            serde_json::from_slice(body).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if v.as_object().is_some_and(|m| !m.is_empty()) {
            return DeleteOpts::from_json(&v);
        }
    }
    let mut v = json!({});
    if let Some(g) = q.get("gracePeriodSeconds") {
        v["gracePeriodSeconds"] =
            json!(g.parse::<i64>().map_err(|e| ApiError::bad_request(e.to_string()))?);
    }
    if let Some(p) = q.get("propagationPolicy") {
        v["propagationPolicy"] = json!(p);
    }
    if let Some(o) = q.get("orphanDependents") {
        v["orphanDependents"] = json!(o == "true");
    }
    if q.get("dryRun") == Some("All") {
        v["dryRun"] = json!(["All"]);
    }
    DeleteOpts::from_json(&v)
}

fn delete_response(res: &'static Resource, out: Deleted) -> Response {
    match out {
        Deleted::Gone(o) if res.store != StoreKind::Pod => {
            let mut details = json!({"name": o["metadata"]["name"], "kind": res.plural, "uid": o["metadata"]["uid"]});
            if !res.group.is_empty() {
                details["group"] = json!(res.group);
            }
            json_response(StatusCode::OK, &success_status(Some(details)), "application/json")
        }
        Deleted::Gone(o) | Deleted::Pending(o) => render_one(res, &o, Format::Full, StatusCode::OK),
    }
}

const TABLE_CT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

fn render_one(res: &'static Resource, obj: &Obj, format: Format, code: StatusCode) -> Response {
    if format == Format::Full && !res.events_v1 {
        // Stored objects are their own view: send the stored encoding.
        return bytes_response(code, obj.json().clone(), "application/json");
    }
    let view = resources::to_view(res, obj);
    match format {
        Format::Full => json_response(code, &view, "application/json"),
        Format::PartialMeta => json_response(code, &partial_meta(&view), "application/json"),
        Format::Table => {
            let rv = view["metadata"]["resourceVersion"].as_str().map(str::to_owned);
            json_response(code, &table::table(res, &[view], rv, Timestamp::now()), TABLE_CT)
        }
    }
}

fn bytes_response(code: StatusCode, body: Bytes, content_type: &'static str) -> Response {
    let mut resp = (code, body).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// Lists whose items take more than this many bytes are streamed in chunks of about this size
/// instead of being copied into one buffer first.
const LIST_CHUNK: usize = 256 * 1024;

/// A list body made of the stored encodings of its items, in the field order of an API
/// server's list (`kind`, `apiVersion`, `metadata`, `items`). Every item carries its own
/// resourceVersion in its bytes, so nothing is re-encoded per request.
fn stored_list_body(shell: &Value, items: Vec<Arc<Obj>>) -> Body {
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"{\"kind\":");
    // Writing a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut head, &shell["kind"]);
    head.extend_from_slice(b",\"apiVersion\":");
    let _ = serde_json::to_writer(&mut head, &shell["apiVersion"]);
    head.extend_from_slice(b",\"metadata\":");
    let _ = serde_json::to_writer(&mut head, &shell["metadata"]);
    head.extend_from_slice(b",\"items\":[");
    const TAIL: &[u8] = b"]}";
    let size: usize = items.iter().map(|o| o.json().len() + 1).sum();
    if size <= LIST_CHUNK {
        let mut body = head;
        body.reserve(size + TAIL.len());
        for (i, o) in items.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(o.json());
        }
        body.extend_from_slice(TAIL);
        return Body::from(body);
    }
    // Large: chunks are filled lazily as the client reads, so a 30 MB list is never held as
    // one more copy next to the stored encodings.
    let mut items = items.into_iter().enumerate();
    let mut head = Some(head);
    let mut done = false;
    let chunks = std::iter::from_fn(move || {
        if done {
            return None;
        }
        let mut buf = head.take().unwrap_or_default();
        buf.reserve(LIST_CHUNK);
        while buf.len() < LIST_CHUNK {
            match items.next() {
                Some((i, o)) => {
                    if i > 0 {
                        buf.push(b',');
                    }
                    buf.extend_from_slice(o.json());
                }
                None => {
                    buf.extend_from_slice(TAIL);
                    done = true;
                    break;
                }
            }
        }
        Some(Ok::<_, std::convert::Infallible>(Bytes::from(buf)))
    });
    Body::from_stream(futures::stream::iter(chunks))
}

fn list_object(
    res: &Resource,
    items: Vec<Value>,
    rv: u64,
    cont: Option<String>,
    remaining: Option<usize>,
) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
        if let Some(r) = remaining {
            meta["remainingItemCount"] = json!(r);
        }
    }
    json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(), "metadata": meta, "items": items})
}

fn make_filter(res: &'static Resource, q: &Query, ns: Option<String>) -> Result<Filter, ApiError> {
    let label = match q.get("labelSelector") {
        Some(s) if !s.is_empty() => {
            Some(LabelSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?)
        }
        _ => None,
    };
    let field = match q.get("fieldSelector") {
        Some(s) if !s.is_empty() => {
            let f = FieldSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?;
            f.validate_for(res.plural).map_err(|e| ApiError::bad_request(e.to_string()))?;
            Some(f)
        }
        _ => None,
    };
    Ok(Arc::new(move |o: &Value| {
        if let Some(ns) = &ns
            && o["metadata"]["namespace"].as_str() != Some(ns.as_str())
        {
            return false;
        }
        if let Some(l) = &label
            && !l.matches_object(o)
        {
            return false;
        }
        field.as_ref().is_none_or(|f| f.matches(o))
    }))
}

fn encode_continue(rv: u64, key: &Key) -> String {
    let raw = format!("{rv}\u{0}{}\u{0}{}", key.0, key.1);
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Option<(u64, Key)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let s = String::from_utf8(bytes?).ok()?;
    let mut it = s.split('\u{0}');
    let rv = it.next()?.parse().ok()?;
    Some((rv, (it.next()?.to_owned(), it.next()?.to_owned())))
}

async fn wait_for_rv(store: &Store, rv: Option<&str>) -> Result<(), ApiError> {
    let Some(asked) = rv.filter(|s| !s.is_empty() && *s != "0") else { return Ok(()) };
    let asked: u64 = asked
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {asked}")))?;
    let deadline = tokio::time::Instant::now() + TOO_NEW_WAIT;
    loop {
        let cur = store.current_rv();
        if asked <= cur {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::too_large_rv(asked, cur));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn list(app: &Arc<App>, q: &Query, t: &Target, format: Format) -> Result<Response, ApiError> {
    let res = t.res;
    let store = &app.store;
    let rv = q.get("resourceVersion").unwrap_or_default();
    let rv_match = q.get("resourceVersionMatch").unwrap_or_default();
    let cont = q.get("continue").unwrap_or_default();
    if q.flag("sendInitialEvents") {
        return Err(ApiError::invalid_list_options(
            "sendInitialEvents",
            "Forbidden: sendInitialEvents is forbidden for list",
        ));
    }
    if !rv_match.is_empty() {
        if rv.is_empty() {
            return Err(ApiError::invalid_list_options(
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if !cont.is_empty() {
            return Err(ApiError::invalid_list_options(
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if rv_match != "Exact" && rv_match != "NotOlderThan" {
            return Err(ApiError::invalid_list_options(
                "resourceVersionMatch",
                &format!(
                    "Unsupported value: \"{rv_match}\": supported values: \"Exact\", \"NotOlderThan\""
                ),
            ));
        }
        if rv_match == "Exact" && rv == "0" {
            return Err(ApiError::invalid_list_options(
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if !cont.is_empty() && !rv.is_empty() && rv != "0" {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    let mut limit = q.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0);
    let filter = make_filter(res, q, t.ns.clone())?;
    let ns = t.ns.as_deref();
    // An equality requirement lets the store read its label index instead of scanning.
    let selector = q.get("labelSelector").and_then(|s| LabelSelector::parse(s).ok());
    let required = selector.as_ref().and_then(LabelSelector::required_label);
    let (page, list_rv) = if !cont.is_empty() {
        let (crv, key) = decode_continue(cont)
            .ok_or_else(|| ApiError::bad_request("continue key is not valid: malformed token"))?;
        if crv < store.compacted_rv() {
            return Err(ApiError::expired(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
            ));
        }
        let q = ListQuery::of(res.store, ns).after(Some(&key)).limit(limit).labeled(required);
        (store.list(q, &*filter)?, crv)
    } else {
        let at = if rv.is_empty() || rv == "0" {
            if rv == "0" {
                // The watch cache serves RV=0 lists whole: limit is ignored.
                limit = None;
            }
            ListAt::Latest
        } else {
            let n: u64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
            if rv_match == "Exact" || (rv_match.is_empty() && limit.is_some()) {
                ListAt::Exact(n)
            } else {
                wait_for_rv(store, Some(rv)).await?;
                ListAt::Latest
            }
        };
        let q = ListQuery::of(res.store, ns).limit(limit).at(at).labeled(required);
        let page = store.list(q, &*filter)?;
        let rv = page.rv;
        (page, rv)
    };
    let cont_token = page.next.as_ref().map(|k| encode_continue(list_rv, k));
    let has_selectors = q.get("labelSelector").is_some_and(|s| !s.is_empty())
        || q.get("fieldSelector").is_some_and(|s| !s.is_empty());
    let remaining = if has_selectors { None } else { Some(page.remaining) };
    if format == Format::Full && !res.events_v1 {
        // Stored objects are their own view: the body is their stored encodings joined.
        let shell = list_object(res, Vec::new(), list_rv, cont_token, remaining);
        let mut resp = stored_list_body(&shell, page.items).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Ok(resp);
    }
    let views: Vec<Value> = page.items.iter().map(|o| resources::to_view(res, o)).collect();
    match format {
        Format::Table => {
            let mut tbl = table::table(res, &views, Some(list_rv.to_string()), Timestamp::now());
            if let Some(c) = cont_token {
                tbl["metadata"]["continue"] = json!(c);
            }
            Ok(json_response(StatusCode::OK, &tbl, TABLE_CT))
        }
        Format::PartialMeta => {
            let mut list = list_object(
                res,
                views.iter().map(partial_meta).collect(),
                list_rv,
                cont_token,
                remaining,
            );
            list["kind"] = json!("PartialObjectMetadataList");
            list["apiVersion"] = json!("meta.k8s.io/v1");
            Ok(json_response(StatusCode::OK, &list, "application/json"))
        }
        Format::Full => Ok(json_response(
            StatusCode::OK,
            &list_object(res, views, list_rv, cont_token, remaining),
            "application/json",
        )),
    }
}

fn watch(app: &Arc<App>, q: &Query, t: &Target, format: Format) -> Result<Response, ApiError> {
    let res = t.res;
    let rv = q.get("resourceVersion").unwrap_or_default();
    let rv_match = q.get("resourceVersionMatch").unwrap_or_default();
    let send_initial = q.flag("sendInitialEvents");
    let bookmarks = q.flag("allowWatchBookmarks");
    if send_initial {
        if !bookmarks {
            return Err(ApiError::invalid_list_options(
                "allowWatchBookmarks",
                "Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
        if rv_match != "NotOlderThan" {
            return Err(ApiError::invalid_list_options(
                "resourceVersionMatch",
                "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
    } else if !rv_match.is_empty() {
        return Err(ApiError::invalid_list_options(
            "resourceVersionMatch",
            "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    let after = if send_initial || rv.is_empty() || rv == "0" {
        None
    } else {
        Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?,
        )
    };
    let filter = make_filter(res, q, t.ns.clone())?;
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let content_type = if format == Format::Table { TABLE_CT } else { "application/json" };
    let start = match app.store.watch(res.store, t.ns.as_deref(), after) {
        Ok(s) => s,
        Err(compacted) => {
            // Too old: HTTP 200 and one ERROR event, so clients relist instead of retrying.
            let line = watch::expired_line(after.unwrap_or_default(), compacted);
            return Ok(streaming(Body::from(line), content_type));
        }
    };
    let spec = WatchSpec {
        kind: res.store,
        api_version: res.api_version(),
        object_kind: res.kind.to_owned(),
        filter,
        render: render_fn(res, format),
        as_stored: format == Format::Full && !res.events_v1,
        after,
        bookmarks,
        send_initial_events: send_initial,
        bookmark_interval: app.config.bookmark_interval,
        timeout,
        close: app.watch_close.lock().clone(),
    };
    Ok(streaming(Body::from_stream(watch::stream(spec, start)), content_type))
}

fn streaming(body: Body, content_type: &'static str) -> Response {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    resp
}

/// Every served resource (for discovery).
pub fn served() -> &'static [Resource] {
    &RESOURCES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_tolerates_leading_ampersand_and_decodes() {
        let q = Query::parse(Some("&labelSelector=a%3Db%2Cc&limit=500&watch"));
        assert_eq!(q.get("labelSelector"), Some("a=b,c"));
        assert_eq!(q.get("limit"), Some("500"));
        assert_eq!(q.get("watch"), Some(""));
        assert_eq!(Query::parse(Some("")).get("x"), None);
    }

    #[test]
    fn continue_tokens_round_trip() {
        let key = ("ns".to_owned(), "p-1".to_owned());
        assert_eq!(decode_continue(&encode_continue(42, &key)), Some((42, key)));
        assert_eq!(decode_continue("zz"), None);
    }

    #[test]
    fn targets_parse() {
        let t = parse_target(&["api", "v1", "namespaces", "a", "pods", "p", "status"]).unwrap();
        assert_eq!(
            (t.res.plural, t.ns.as_deref(), t.name.as_deref(), t.sub.as_deref()),
            ("pods", Some("a"), Some("p"), Some("status"))
        );
        let t = parse_target(&["api", "v1", "namespaces", "a"]).unwrap();
        assert_eq!((t.res.plural, t.name.as_deref()), ("namespaces", Some("a")));
        let t = parse_target(&["api", "v1", "namespaces", "a", "finalize"]).unwrap();
        assert_eq!(t.sub.as_deref(), Some("finalize"));
        let t = parse_target(&["apis", "batch", "v1", "jobs"]).unwrap();
        assert!(t.ns.is_none() && t.name.is_none());
        assert!(parse_target(&["apis", "batch", "v1", "jobs", "x"]).is_none());
        assert!(parse_target(&["apis", "apps", "v1", "deployments"]).is_none());
    }
}
