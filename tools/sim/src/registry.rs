//! The generic registry: create, update, patch and delete with the real server's metadata,
//! status-split, optimistic-concurrency, finalizer and grace-period rules.
//!
//! Time comes in as a parameter (`now`) so the rules are testable without a clock.

use std::sync::Arc;

use jiff::Timestamp;
use rand::Rng;
use serde_json::{Map, Value, json};

use crate::admit;
use crate::error::{ApiError, Cause};
use crate::ownership::{self, Id, Incoming, Operation};
use crate::resources::{self, NormalizeError, Resource, StoreKind};
use crate::selector::{dns1123_label_error, dns1123_subdomain_error};
use crate::store::{Key, Mutation, Obj, Store, View, Written, rv_of, should_delete_during_update};

/// Finalizer the GC honours to orphan dependents.
pub const ORPHAN_FINALIZER: &str = "orphan";
/// Finalizer the GC honours to delete dependents first.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// Metadata the server sets and keeps: a create drops what the client sent, an update keeps the
/// stored values (with `namespace` and `name`, which identify the object).
const SERVER_OWNED_METADATA: [&str; 5] =
    ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"];

/// Options common to writes.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    /// `dryRun=All`: validate, store nothing.
    pub dry_run: bool,
    /// `fieldValidation=Strict`: unknown fields are an error.
    pub strict: bool,
    /// The field manager the write is recorded under (`fieldManager`, else the User-Agent's
    /// prefix; empty: `unknown`).
    pub field_manager: String,
}

/// How a write records field ownership in `metadata.managedFields`.
#[derive(Debug, Clone)]
enum Track {
    /// An Update by the request's field manager, with what the body said about managedFields.
    Update(Incoming),
    /// A server-side apply: the object carries the managedFields it computed.
    Applied,
}

/// Deletion propagation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Leave dependents, dropping their owner reference.
    Orphan,
    /// Remove the owner now, dependents afterwards.
    Background,
    /// Remove dependents first.
    Foreground,
}

impl Propagation {
    /// Parses the wire name.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        match s {
            "Orphan" => Ok(Self::Orphan),
            "Background" => Ok(Self::Background),
            "Foreground" => Ok(Self::Foreground),
            other => Err(ApiError::bad_request(format!(
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
            ))),
        }
    }
}

/// `DeleteOptions`, from the body or the query.
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// Grace period override.
    pub grace: Option<i64>,
    /// Propagation; `None` = the kind's default.
    pub propagation: Option<Propagation>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `dryRun=All`.
    pub dry_run: bool,
}

impl DeleteOpts {
    /// Reads a `DeleteOptions` JSON body (kind and apiVersion optional).
    pub fn from_json(v: &Value) -> Result<Self, ApiError> {
        let mut o =
            Self { grace: v.get("gracePeriodSeconds").and_then(Value::as_i64), ..Self::default() };
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            o.propagation = Some(Propagation::parse(p)?);
        } else if let Some(orphan) = v.get("orphanDependents").and_then(Value::as_bool) {
            o.propagation =
                Some(if orphan { Propagation::Orphan } else { Propagation::Background });
        }
        o.uid = v.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_owned);
        o.resource_version =
            v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(str::to_owned);
        o.dry_run =
            v.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All"));
        Ok(o)
    }
}

/// What a delete did.
#[derive(Debug, Clone)]
pub enum Deleted {
    /// Removed; the last state.
    Gone(Arc<Obj>),
    /// Still there (grace period or finalizers); the current state.
    Pending(Arc<Obj>),
}

/// Formats a metav1.Time (second precision).
pub fn format_time(t: Timestamp) -> String {
    jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", t).unwrap_or_default()
}

/// Formats a metav1.MicroTime (six fractional digits).
pub fn format_micro_time(t: Timestamp) -> String {
    jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%S%.6fZ", t).unwrap_or_default()
}

const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `generateName` + 5 random characters, the base cut to 58 characters.
pub fn generate_name(base: &str) -> String {
    let mut rng = rand::rng();
    let base: String = base.chars().take(58).collect();
    let suffix: String =
        (0..5).map(|_| NAME_ALPHABET[rng.random_range(0..NAME_ALPHABET.len())] as char).collect();
    format!("{base}{suffix}")
}

fn meta(obj: &Value) -> &Value {
    &obj["metadata"]
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata is an object")
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

fn set_finalizers(obj: &mut Value, list: Vec<String>) {
    let m = meta_mut(obj);
    if list.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), json!(list));
    }
}

fn is_deleting(obj: &Value) -> bool {
    meta(obj).get("deletionTimestamp").is_some_and(|v| !v.is_null())
}

fn map_normalize(res: &Resource, name: &str, e: NormalizeError) -> ApiError {
    match e {
        NormalizeError::UnknownFields(_) => ApiError::bad_request(e.to_string()),
        NormalizeError::Decode(msg) => ApiError::bad_request(format!(
            "{} in body is invalid: {msg}",
            if name.is_empty() { res.kind } else { name }
        )),
    }
}

/// Checks kind/apiVersion/namespace of a request body against the URL, fills them in, and
/// normalises the object to the stored (core) shape.
pub fn prepare_body(
    res: &Resource,
    ns: Option<&str>,
    body: Value,
    strict: bool,
) -> Result<Value, ApiError> {
    let Value::Object(mut m) = body else {
        return Err(ApiError::bad_request("the body of the request must be a JSON object"));
    };
    let api_version = res.api_version();
    if let Some(av) = m.get("apiVersion").and_then(Value::as_str)
        && av != api_version
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({api_version})"
        )));
    }
    if let Some(k) = m.get("kind").and_then(Value::as_str)
        && k != res.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            res.kind
        )));
    }
    m.insert("apiVersion".into(), json!(api_version));
    m.insert("kind".into(), json!(res.kind));
    let mut obj = Value::Object(m);
    if let Some(ns) = ns {
        let md = meta_mut(&mut obj);
        match md.get("namespace").and_then(Value::as_str) {
            Some(b) if !b.is_empty() && b != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                md.insert("namespace".into(), json!(ns));
            }
        }
    }
    let name = meta(&obj).get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let out = if res.events_v1 {
        resources::normalize_event_v1(&obj, strict)
    } else {
        resources::normalize(res.store, &obj, strict)
    };
    out.map_err(|e| map_normalize(res, &name, e))
}

fn validate_name(res: &Resource, name: &str) -> Vec<Cause> {
    let err = if res.store == StoreKind::Namespace {
        dns1123_label_error(name)
    } else {
        dns1123_subdomain_error(name)
    };
    err.map(|e| {
        vec![Cause::new(
            "FieldValueInvalid",
            format!("Invalid value: \"{name}\": {e}"),
            "metadata.name",
        )]
    })
    .unwrap_or_default()
}

/// Creates an object. `body` is the raw request body.
pub fn create(
    store: &Store,
    res: &Resource,
    ns: Option<&str>,
    mut body: Value,
    opts: &WriteOpts,
    now: Timestamp,
) -> Result<Arc<Obj>, ApiError> {
    let incoming = ownership::take_incoming(&mut body);
    let obj = prepare_body(res, ns, body, opts.strict)?;
    create_prepared(store, res, ns, obj, opts, now, Track::Update(incoming))
}

// The managedFields of a created object: the computed ones of an apply, else an Update by the
// request's manager of every field it set (with the API defaults, as the field manager sees
// the decoded object), starting from the entries the body brought.
fn created_managed_fields(
    res: &Resource,
    obj: &mut Value,
    opts: &WriteOpts,
    now: Timestamp,
    track: Track,
) -> Option<Value> {
    let given = meta_mut(obj).remove("managedFields");
    let incoming = match track {
        Track::Applied => return given,
        Track::Update(incoming) => incoming,
    };
    let mut entries = match incoming {
        Incoming::Given(v) => ownership::decode(&v),
        Incoming::Absent | Incoming::Reset => Vec::new(),
    };
    let api_version = res.api_version();
    let id = Id::new(&opts.field_manager, Operation::Update, &api_version, Part::Main);
    let (zero, defaulted) = (ownership::zero_object(res.store), admit::create_defaults(res, obj));
    let (zero, defaulted) = (owned_shape(res, &zero), owned_shape(res, &defaulted));
    let now = format_time(now);
    let write = ownership::Write { kind: res.store, part: Part::Main, id, now: &now };
    ownership::record_update(&write, &zero, &defaulted, &mut entries, true);
    ownership::encode(entries)
}

// The object in the version it is written in, whose field names the managedFields entry uses
// (only events.k8s.io Events differ from the stored core shape).
fn owned_shape<'a>(res: &Resource, obj: &'a Value) -> std::borrow::Cow<'a, Value> {
    if res.events_v1 {
        std::borrow::Cow::Owned(resources::to_view(res, obj))
    } else {
        std::borrow::Cow::Borrowed(obj)
    }
}

fn create_prepared(
    store: &Store,
    res: &Resource,
    ns: Option<&str>,
    mut obj: Value,
    opts: &WriteOpts,
    now: Timestamp,
    track: Track,
) -> Result<Arc<Obj>, ApiError> {
    if !meta(&obj).get("resourceVersion").and_then(Value::as_str).unwrap_or_default().is_empty() {
        return Err(ApiError::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let given = meta(&obj).get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let generate =
        meta(&obj).get("generateName").and_then(Value::as_str).unwrap_or_default().to_owned();
    if given.is_empty() && generate.is_empty() {
        return Err(ApiError::invalid_field(
            res,
            "",
            "FieldValueRequired",
            "Required value: name or generateName is required",
            "metadata.name",
        ));
    }
    // Reset what clients may not set; the server owns these.
    {
        let md = meta_mut(&mut obj);
        for k in SERVER_OWNED_METADATA {
            md.remove(k);
        }
        md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        md.insert("creationTimestamp".into(), json!(format_time(now)));
    }
    let managed = created_managed_fields(res, &mut obj, opts, now, track);
    // RetryGenerateName: a collision picks a fresh suffix a few times before giving up.
    let attempts = if given.is_empty() { 8 } else { 1 };
    let mut last_err = None;
    for _ in 0..attempts {
        let name = if given.is_empty() { generate_name(&generate) } else { given.clone() };
        let mut candidate = obj.clone();
        meta_mut(&mut candidate).insert("name".into(), json!(name));
        let causes = validate_name(res, &name);
        if !causes.is_empty() {
            return Err(ApiError::invalid(res, &name, causes));
        }
        if res.store == StoreKind::PriorityClass
            && let Some(other) =
                admit::second_default(&store.all(StoreKind::PriorityClass), &candidate)
        {
            return Err(ApiError::forbidden(format!(
                "priorityclasses.scheduling.k8s.io \"{name}\" is forbidden: PriorityClass {other} \
                 is already marked as default. Only one default can exist"
            )));
        }
        if res.store == StoreKind::Pod {
            // Admission runs before the storage generates a name: its errors name the pod by
            // its generateName then.
            let shown = if given.is_empty() { &generate } else { &given };
            admit::pod_priority(&store.all(StoreKind::PriorityClass), &mut candidate)
                .map_err(|m| ApiError::forbidden(format!("pods \"{shown}\" is forbidden: {m}")))?;
        }
        admit::on_create(res, &mut candidate).map_err(|c| ApiError::invalid(res, &name, c))?;
        ownership::set_managed(&mut candidate, managed.clone());
        let key: Key = (ns.unwrap_or_default().to_owned(), name.clone());
        if opts.dry_run {
            return check_create(store, res, ns, &key, candidate);
        }
        let result = store.mutate(res.store, &key, |cur, view| {
            if cur.is_some() {
                return Err(ApiError::already_exists(res, &key.1));
            }
            check_namespace(res, ns, &key.1, view)?;
            Ok((Mutation::Put(candidate), ()))
        });
        match result {
            Ok((Written::Created(o), ())) => return Ok(o),
            Ok((other, ())) => {
                return Err(ApiError::internal(format!("unexpected create outcome {other:?}")));
            }
            Err(e) if e.reason == "AlreadyExists" && given.is_empty() => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| ApiError::internal("name generation failed")))
}

fn check_create(
    store: &Store,
    res: &Resource,
    ns: Option<&str>,
    key: &Key,
    obj: Value,
) -> Result<Arc<Obj>, ApiError> {
    let (_, out) = store.mutate(res.store, key, |cur, view| {
        if cur.is_some() {
            return Err(ApiError::already_exists(res, &key.1));
        }
        check_namespace(res, ns, &key.1, view)?;
        Ok((Mutation::Unchanged, obj))
    })?;
    Ok(Arc::new(Obj::new(out)))
}

fn check_namespace(
    res: &Resource,
    ns: Option<&str>,
    name: &str,
    view: &View<'_>,
) -> Result<(), ApiError> {
    let Some(ns) = ns else { return Ok(()) };
    match view.namespace(ns) {
        None => Err(ApiError::namespace_not_found(ns)),
        Some(n) if is_deleting(n) => Err(ApiError::namespace_terminating(res, name, ns)),
        Some(_) => Ok(()),
    }
}

/// Which half of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The main resource.
    Main,
    /// The `/status` subresource.
    Status,
}

/// Applies the update rules (kept server-owned metadata, status split, finalizer rule,
/// generation, admission) to a new object against the stored one.
pub fn update_rules(
    res: &Resource,
    cur: &Value,
    mut new: Value,
    part: Part,
) -> Result<Value, ApiError> {
    let name = meta(cur).get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    {
        let cm = meta(cur).as_object().cloned().unwrap_or_default();
        let nm = meta_mut(&mut new);
        for k in SERVER_OWNED_METADATA.into_iter().chain(["namespace", "name"]) {
            match cm.get(k) {
                Some(v) => nm.insert(k.to_owned(), v.clone()),
                None => nm.remove(k),
            };
        }
        nm.remove("managedFields");
        nm.remove("resourceVersion");
    }
    let has_status = matches!(res.store, StoreKind::Pod | StoreKind::Job | StoreKind::Namespace);
    match part {
        Part::Main if has_status => copy_field(cur, &mut new, "status"),
        Part::Status => {
            copy_field(cur, &mut new, "spec");
            if res.store == StoreKind::Pod {
                let owners = meta(cur).get("ownerReferences").cloned();
                let nm = meta_mut(&mut new);
                match owners {
                    Some(o) => nm.insert("ownerReferences".into(), o),
                    None => nm.remove("ownerReferences"),
                };
            }
            if res.store == StoreKind::Namespace {
                let status = new.get("status").cloned();
                new = cur.clone();
                match status {
                    Some(s) => new["status"] = s,
                    None => {
                        new.as_object_mut().map(|m| m.remove("status"));
                    }
                }
                meta_mut(&mut new).remove("resourceVersion");
            }
        }
        Part::Main => {}
    }
    if is_deleting(cur) {
        let old = finalizers(cur);
        if finalizers(&new).iter().any(|f| !old.contains(f)) {
            return Err(ApiError::invalid_field(
                res,
                &name,
                "FieldValueForbidden",
                "Forbidden: no new finalizers can be added if the object is being deleted",
                "metadata.finalizers",
            ));
        }
    }
    admit::on_update(res, cur, &mut new, part).map_err(|c| ApiError::invalid(res, &name, c))?;
    if res.store == StoreKind::Job && cur.get("spec") != new.get("spec") {
        let g = meta(cur).get("generation").and_then(Value::as_i64).unwrap_or(0);
        meta_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    Ok(new)
}

fn copy_field(from: &Value, to: &mut Value, field: &str) {
    let Some(m) = to.as_object_mut() else { return };
    match from.get(field) {
        Some(v) => m.insert(field.to_owned(), v.clone()),
        None => m.remove(field),
    };
}

// Equality of two objects except `metadata.resourceVersion`, without copying either.
fn same_ignoring_rv(a: &Value, b: &Value) -> bool {
    let (Some(am), Some(bm)) = (a.as_object(), b.as_object()) else { return a == b };
    if am.len() != bm.len() {
        return false;
    }
    am.iter().all(|(k, av)| {
        let Some(bv) = bm.get(k) else { return false };
        if k != "metadata" {
            return av == bv;
        }
        let (Some(x), Some(y)) = (av.as_object(), bv.as_object()) else { return av == bv };
        let count = |m: &Map<String, Value>| m.keys().filter(|k| *k != "resourceVersion").count();
        count(x) == count(y)
            && x.iter().filter(|(k, _)| *k != "resourceVersion").all(|(k, v)| y.get(k) == Some(v))
    })
}

/// Decides an update of `cur` to `new` (already normalised): precondition, rules, no-op check.
fn decide_update(
    res: &Resource,
    cur: &Value,
    mut new: Value,
    track: Track,
    w: &UpdateCtx<'_>,
) -> Result<Mutation, ApiError> {
    let UpdateCtx { part, require_rv, opts, now } = *w;
    let name = meta(cur).get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let body_rv =
        meta(&new).get("resourceVersion").and_then(Value::as_str).unwrap_or_default().to_owned();
    if body_rv.is_empty() {
        if require_rv {
            return Err(ApiError::invalid_field(
                res,
                &name,
                "FieldValueInvalid",
                "Invalid value: 0x0: must be specified for an update",
                "metadata.resourceVersion",
            ));
        }
    } else if body_rv != rv_of(cur).to_string() {
        return Err(ApiError::conflict_modified(res, &name));
    }
    if let Some(uid) = meta(&new).get("uid").and_then(Value::as_str)
        && Some(uid) != meta(cur).get("uid").and_then(Value::as_str)
    {
        return Err(ApiError::conflict(
            res,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta(cur).get("uid").and_then(Value::as_str).unwrap_or_default()
            ),
        ));
    }
    let applied = meta_mut(&mut new).remove("managedFields");
    let mut merged = update_rules(res, cur, new, part)?;
    let managed = match track {
        Track::Applied => applied,
        Track::Update(incoming) => {
            // A write to the main resource may replace the entries (`[]` clears them); a
            // subresource write never does.
            let mut entries = match (part, incoming) {
                (Part::Main, Incoming::Reset) => Vec::new(),
                (Part::Main, Incoming::Given(v)) => {
                    let given = ownership::decode(&v);
                    if given.is_empty() { ownership::entries_of(cur) } else { given }
                }
                _ => ownership::entries_of(cur),
            };
            let api_version = res.api_version();
            let id = Id::new(&opts.field_manager, Operation::Update, &api_version, part);
            let now = format_time(now);
            let write = ownership::Write { kind: res.store, part, id, now: &now };
            let (live, new) = (owned_shape(res, cur), owned_shape(res, &merged));
            ownership::record_update(&write, &live, &new, &mut entries, false);
            ownership::encode(entries)
        }
    };
    ownership::set_managed(&mut merged, managed);
    if same_ignoring_rv(&merged, cur) {
        return Ok(Mutation::Unchanged);
    }
    Ok(Mutation::Put(merged))
}

fn written_object(w: Written) -> Option<Arc<Obj>> {
    match w {
        Written::Unchanged(o) => o,
        Written::Created(o) | Written::Updated(o) | Written::Deleted(o) => Some(o),
    }
}

/// Replaces an object (PUT). Leases may be created this way.
#[allow(clippy::too_many_arguments)]
pub fn update(
    store: &Store,
    res: &Resource,
    ns: Option<&str>,
    name: &str,
    mut body: Value,
    part: Part,
    opts: &WriteOpts,
    now: Timestamp,
) -> Result<(Arc<Obj>, bool), ApiError> {
    let incoming = ownership::take_incoming(&mut body);
    let obj = prepare_body(res, ns, body, opts.strict)?;
    let body_name = meta(&obj).get("name").and_then(Value::as_str).unwrap_or_default();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let key: Key = (ns.unwrap_or_default().to_owned(), name.to_owned());
    if store.get(res.store, &key).is_none() && res.store == StoreKind::Lease && part == Part::Main {
        let mut obj = obj;
        meta_mut(&mut obj).remove("resourceVersion");
        return create_prepared(store, res, ns, obj, opts, now, Track::Update(incoming))
            .map(|o| (o, true));
    }
    let ctx = UpdateCtx { part, require_rv: res.store == StoreKind::Lease, opts, now };
    write_with(store, res, &key, &ctx, |_| Ok((obj, Track::Update(incoming)))).map(|o| (o, false))
}

/// What an update needs besides the objects: the part written, whether the body must name a
/// resourceVersion, the request's options and the time.
#[derive(Debug, Clone, Copy)]
struct UpdateCtx<'a> {
    part: Part,
    require_rv: bool,
    opts: &'a WriteOpts,
    now: Timestamp,
}

// Runs `make_new(current)` and the update decision under the store lock.
fn write_with(
    store: &Store,
    res: &Resource,
    key: &Key,
    ctx: &UpdateCtx<'_>,
    make_new: impl FnOnce(&Value) -> Result<(Value, Track), ApiError>,
) -> Result<Arc<Obj>, ApiError> {
    let opts = ctx.opts;
    let (written, ()) = store.mutate(res.store, key, |cur, _| {
        let cur = cur.ok_or_else(|| ApiError::not_found(res, &key.1))?;
        let (new, track) = make_new(cur)?;
        let m = decide_update(res, cur, new, track, ctx)?;
        if opts.dry_run {
            return match m {
                Mutation::Put(_) => Ok((Mutation::Unchanged, ())),
                other => Ok((other, ())),
            };
        }
        Ok((m, ()))
    })?;
    written_object(written).ok_or_else(|| ApiError::not_found(res, &key.1))
}

/// The patch types the server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 6902 JSON patch.
    Json,
    /// RFC 7386 merge patch.
    Merge,
    /// Strategic merge patch.
    Strategic,
    /// Server-side apply.
    Apply,
}

impl PatchType {
    /// From the request Content-Type.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or_default().trim() {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// Patches an object. Server-side apply creates it when absent; returns (object, created).
#[allow(clippy::too_many_arguments)]
pub fn patch(
    store: &Store,
    res: &Resource,
    ns: Option<&str>,
    name: &str,
    ptype: PatchType,
    patch_body: &Value,
    part: Part,
    field_manager: Option<&str>,
    force: bool,
    opts: &WriteOpts,
    now: Timestamp,
) -> Result<(Arc<Obj>, bool), ApiError> {
    let key: Key = (ns.unwrap_or_default().to_owned(), name.to_owned());
    if ptype == PatchType::Apply {
        if field_manager.is_none_or(str::is_empty) {
            return Err(ApiError::invalid_field(
                res,
                name,
                "FieldValueRequired",
                "Required value: is required for apply patch",
                "fieldManager",
            ));
        }
        if store.get(res.store, &key).is_none() && part == Part::Main {
            let manager = field_manager.unwrap_or_default();
            let obj = applied_object(res, None, patch_body, manager, part, force, now)?;
            let obj = prepare_body(res, ns, obj, opts.strict)?;
            return create_prepared(store, res, ns, obj, opts, now, Track::Applied)
                .map(|o| (o, true));
        }
    }
    let obj =
        write_with(store, res, &key, &UpdateCtx { part, require_rv: false, opts, now }, |cur| {
            let view = resources::to_view(res, cur);
            let (patched, track) = match ptype {
                PatchType::Apply => {
                    let manager = field_manager.unwrap_or_default();
                    let obj =
                        applied_object(res, Some(&view), patch_body, manager, part, force, now)?;
                    (obj, Track::Applied)
                }
                other => {
                    let mut patched = admit::patch_object(res, &view, other, patch_body)
                        .map_err(|e| e.into_api_error(res, name))?;
                    let incoming = ownership::take_incoming(&mut patched);
                    (patched, Track::Update(incoming))
                }
            };
            let mut new = prepare_body(res, ns, patched, opts.strict)?;
            // A patch that does not name a resourceVersion is last-writer-wins.
            if meta(&new)
                .get("resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty()
            {
                meta_mut(&mut new).insert("resourceVersion".into(), json!(rv_of(cur).to_string()));
            }
            Ok((new, track))
        })?;
    Ok((obj, false))
}

// A server-side apply of `config` by `fieldManager` onto `live` (as served; `None` to create):
// the merged object with the fields the manager gave up removed and its managedFields
// recorded, or the conflicts as the real server's 409.
fn applied_object(
    res: &Resource,
    live: Option<&Value>,
    config: &Value,
    field_manager: &str,
    part: Part,
    force: bool,
    now: Timestamp,
) -> Result<Value, ApiError> {
    let name = config.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let mut merged = crate::patch::apply(live, config, field_manager, force, res.kind)
        .map_err(|e| admit::PatchFailure(e).into_api_error(res, name))?;
    meta_mut(&mut merged).remove("managedFields");
    let mut entries = live.map(ownership::entries_of).unwrap_or_default();
    let api_version = res.api_version();
    let id = Id::new(field_manager, Operation::Apply, &api_version, part);
    let now = format_time(now);
    let write = ownership::Write { kind: res.store, part, id, now: &now };
    let mut obj = ownership::record_apply(&write, live, merged, config, &mut entries, force)
        .map_err(|c| ownership::conflict_error(&c))?;
    ownership::set_managed(&mut obj, ownership::encode(entries));
    ownership::update_last_applied(&mut obj, config, field_manager);
    Ok(obj)
}

/// Deletes an object following the generic registry's algorithm.
pub fn delete(
    store: &Store,
    res: &Resource,
    ns: Option<&str>,
    name: &str,
    opts: &DeleteOpts,
    now: Timestamp,
) -> Result<Deleted, ApiError> {
    let key: Key = (ns.unwrap_or_default().to_owned(), name.to_owned());
    let (written, pending) = store.mutate(res.store, &key, |cur, _| {
        let cur = cur.ok_or_else(|| ApiError::not_found(res, name))?;
        let m = decide_delete(res, cur, opts, now)?;
        let pending = !matches!(m, Mutation::Remove | Mutation::PutThenRemove(_))
            && !matches!(&m, Mutation::Put(o) if should_delete_during_update(o));
        if opts.dry_run {
            return Ok((Mutation::Unchanged, pending));
        }
        Ok((m, pending))
    })?;
    let obj = written_object(written).ok_or_else(|| ApiError::not_found(res, name))?;
    Ok(if pending { Deleted::Pending(obj) } else { Deleted::Gone(obj) })
}

/// The grace period a pod deletion gets (0 for unscheduled or finished pods).
pub fn pod_grace(pod: &Value, asked: Option<i64>) -> i64 {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
    let scheduled =
        pod.pointer("/spec/nodeName").and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    if !scheduled || phase == "Succeeded" || phase == "Failed" {
        return 0;
    }
    let g = asked
        .or_else(|| pod.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64))
        .unwrap_or(30);
    if g < 0 { 1 } else { g }
}

/// Default propagation of a resource: batch/v1 Jobs orphan for backward compatibility.
pub fn default_propagation(res: &Resource) -> Propagation {
    if res.store == StoreKind::Job { Propagation::Orphan } else { Propagation::Background }
}

fn decide_delete(
    res: &Resource,
    cur: &Value,
    opts: &DeleteOpts,
    now: Timestamp,
) -> Result<Mutation, ApiError> {
    let name = meta(cur).get("name").and_then(Value::as_str).unwrap_or_default();
    let cur_uid = meta(cur).get("uid").and_then(Value::as_str).unwrap_or_default();
    if let Some(uid) = &opts.uid
        && uid != cur_uid
    {
        return Err(ApiError::conflict(
            res,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_uid}"
            ),
        ));
    }
    if let Some(rv) = &opts.resource_version
        && *rv != rv_of(cur).to_string()
    {
        return Err(ApiError::conflict(
            res,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                rv_of(cur)
            ),
        ));
    }
    let graceful = res.store == StoreKind::Pod;
    let grace = if graceful { pod_grace(cur, opts.grace) } else { 0 };
    if is_deleting(cur) {
        // Only a shorter grace period is accepted once deletion started.
        let cur_grace =
            meta(cur).get("deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
        if graceful && grace < cur_grace {
            let mut obj = cur.clone();
            let md = meta_mut(&mut obj);
            md.insert(
                "deletionTimestamp".into(),
                json!(format_time(now + jiff::SignedDuration::from_secs(grace))),
            );
            md.insert("deletionGracePeriodSeconds".into(), json!(grace));
            return Ok(Mutation::Put(obj));
        }
        return Ok(Mutation::Unchanged);
    }
    if res.store == StoreKind::Namespace {
        // Namespaces always terminate through the namespace controller (spec.finalizers).
        let mut obj = cur.clone();
        let md = meta_mut(&mut obj);
        md.insert("deletionTimestamp".into(), json!(format_time(now)));
        md.insert("deletionGracePeriodSeconds".into(), json!(0));
        obj["status"]["phase"] = json!("Terminating");
        if obj.pointer("/spec/finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty)
            && finalizers(&obj).is_empty()
        {
            return Ok(Mutation::PutThenRemove(obj));
        }
        return Ok(Mutation::Put(obj));
    }
    let mut obj = cur.clone();
    let mut fins = finalizers(&obj);
    match opts.propagation.unwrap_or_else(|| default_propagation(res)) {
        Propagation::Orphan => {
            fins.retain(|f| f != FOREGROUND_FINALIZER);
            if !fins.iter().any(|f| f == ORPHAN_FINALIZER) {
                fins.push(ORPHAN_FINALIZER.into());
            }
        }
        Propagation::Foreground => {
            fins.retain(|f| f != ORPHAN_FINALIZER);
            if !fins.iter().any(|f| f == FOREGROUND_FINALIZER) {
                fins.push(FOREGROUND_FINALIZER.into());
            }
        }
        Propagation::Background => {
            fins.retain(|f| f != ORPHAN_FINALIZER && f != FOREGROUND_FINALIZER)
        }
    }
    set_finalizers(&mut obj, fins.clone());
    if meta(cur).get("generation").and_then(Value::as_i64).is_some_and(|g| g > 0) {
        let g = meta(cur)["generation"].as_i64().unwrap_or(0);
        meta_mut(&mut obj).insert("generation".into(), json!(g + 1));
    }
    let md = meta_mut(&mut obj);
    md.insert(
        "deletionTimestamp".into(),
        json!(format_time(now + jiff::SignedDuration::from_secs(grace))),
    );
    md.insert("deletionGracePeriodSeconds".into(), json!(grace));
    if !fins.is_empty() || grace > 0 {
        return Ok(Mutation::Put(obj));
    }
    if graceful {
        return Ok(Mutation::PutThenRemove(obj));
    }
    Ok(Mutation::Remove)
}

/// Removes one finalizer (GC and namespace controller); no-op when absent or gone.
pub fn remove_finalizer(
    store: &Store,
    kind: StoreKind,
    key: &Key,
    finalizer: &str,
) -> Result<(), ApiError> {
    let res = kind.resource();
    let r = store.mutate(kind, key, |cur, _| {
        let Some(cur) = cur else { return Ok((Mutation::Unchanged, ())) };
        let mut fins = finalizers(cur);
        if !fins.iter().any(|f| f == finalizer) {
            return Ok((Mutation::Unchanged, ()));
        }
        fins.retain(|f| f != finalizer);
        let mut obj = (**cur).clone();
        set_finalizers(&mut obj, fins);
        Ok((Mutation::Put(obj), ()))
    });
    r.map(|_| ()).map_err(|e| {
        tracing::warn!(resource = res.plural, name = %key.1, error = %e, "removing finalizer failed");
        e
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::RESOURCES;

    fn now() -> Timestamp {
        "2025-01-01T00:00:00Z".parse().unwrap()
    }

    fn res(kind: StoreKind) -> &'static Resource {
        kind.resource()
    }

    /// `create` in namespace `ns` (none for cluster-scoped kinds) with default options, at
    /// [`now`].
    fn create_in(
        store: &Store,
        kind: StoreKind,
        ns: Option<&str>,
        body: Value,
    ) -> Result<Arc<Obj>, ApiError> {
        create(store, res(kind), ns, body, &WriteOpts::default(), now())
    }

    /// `update` of `name` in namespace `ns` with default options, at [`now`].
    fn update_in(
        store: &Store,
        kind: StoreKind,
        name: &str,
        body: Value,
        part: Part,
    ) -> Result<(Arc<Obj>, bool), ApiError> {
        update(store, res(kind), Some("ns"), name, body, part, &WriteOpts::default(), now())
    }

    fn setup() -> Store {
        let store = Store::new(1000);
        create_in(&store, StoreKind::Namespace, None, json!({"metadata": {"name": "ns"}})).unwrap();
        store
    }

    fn pod(store: &Store, name: &str, node: Option<&str>, finalizers: &[&str]) -> Arc<Obj> {
        let mut body = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        if let Some(n) = node {
            body["spec"]["nodeName"] = json!(n);
        }
        if !finalizers.is_empty() {
            body["metadata"]["finalizers"] = json!(finalizers);
        }
        create_in(store, StoreKind::Pod, Some("ns"), body).unwrap()
    }

    #[test]
    fn create_sets_server_metadata_and_conflicts_on_duplicates() {
        let store = setup();
        let p = pod(&store, "p", None, &[]);
        assert_eq!(p["metadata"]["creationTimestamp"], "2025-01-01T00:00:00Z");
        assert_eq!(p["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert_eq!(p["status"]["phase"], "Pending");
        let body = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
        let err = create_in(&store, StoreKind::Pod, Some("ns"), body).unwrap_err();
        assert_eq!((err.code, err.reason), (409, "AlreadyExists"));
        assert_eq!(err.message, "pods \"p\" already exists");
    }

    #[test]
    fn create_in_missing_or_terminating_namespace() {
        let store = setup();
        let body = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
        let err = create_in(&store, StoreKind::Pod, Some("nope"), body.clone()).unwrap_err();
        assert_eq!(err.code, 404);
        delete(&store, res(StoreKind::Namespace), None, "ns", &DeleteOpts::default(), now())
            .unwrap();
        let err = create_in(&store, StoreKind::Pod, Some("ns"), body).unwrap_err();
        assert_eq!((err.code, err.reason), (403, "Forbidden"));
    }

    #[test]
    fn generate_name_uses_base_and_suffix() {
        let store = setup();
        let body = json!({"metadata": {"generateName": "pi-"}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
        let p = create_in(&store, StoreKind::Pod, Some("ns"), body).unwrap();
        let name = p["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("pi-") && name.len() == 8, "{name}");
        assert!(name[3..].bytes().all(|b| NAME_ALPHABET.contains(&b)));
    }

    #[test]
    fn stale_update_conflicts_and_status_is_split() {
        let store = setup();
        let p = pod(&store, "p", None, &[]);
        let mut stale = (*p).clone();
        stale["metadata"]["labels"] = json!({"a": "b"});
        stale["status"]["phase"] = json!("Running");
        let (u, _) = update_in(&store, StoreKind::Pod, "p", stale.clone(), Part::Main).unwrap();
        assert_eq!(u["metadata"]["labels"]["a"], "b");
        assert_eq!(u["status"]["phase"], "Pending", "main-resource writes keep the stored status");
        let err = update_in(&store, StoreKind::Pod, "p", stale.clone(), Part::Main).unwrap_err();
        assert_eq!((err.code, err.reason), (409, "Conflict"));
        let mut s = (*u).clone();
        s["status"]["phase"] = json!("Running");
        s["spec"]["nodeName"] = json!("ignored");
        let (u2, _) = update_in(&store, StoreKind::Pod, "p", s, Part::Status).unwrap();
        assert_eq!(u2["status"]["phase"], "Running");
        assert!(u2["spec"].get("nodeName").is_none(), "status writes keep the stored spec");
    }

    #[test]
    fn noop_update_keeps_rv() {
        let store = setup();
        let p = pod(&store, "p", None, &[]);
        let (u, _) = update_in(&store, StoreKind::Pod, "p", (*p).clone(), Part::Main).unwrap();
        assert_eq!(rv_of(&u), rv_of(&p));
    }

    #[test]
    fn lease_put_creates_and_requires_rv() {
        let store = setup();
        let body = json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}});
        let (l, created) =
            update_in(&store, StoreKind::Lease, "l", body.clone(), Part::Main).unwrap();
        assert!(created);
        assert_eq!(l["spec"]["holderIdentity"], "a");
        let err = update_in(&store, StoreKind::Lease, "l", body, Part::Main).unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn pod_deletion_flows() {
        let store = setup();
        let pr = res(StoreKind::Pod);
        // Unscheduled: removed at once.
        pod(&store, "a", None, &[]);
        assert!(matches!(
            delete(&store, pr, Some("ns"), "a", &DeleteOpts::default(), now()).unwrap(),
            Deleted::Gone(_)
        ));
        // Scheduled: graceful, stays with deletionTimestamp = now + 30 s.
        pod(&store, "b", Some("n1"), &[]);
        let Deleted::Pending(b) =
            delete(&store, pr, Some("ns"), "b", &DeleteOpts::default(), now()).unwrap()
        else {
            panic!("graceful delete must keep the pod")
        };
        assert_eq!(b["metadata"]["deletionTimestamp"], "2025-01-01T00:00:30Z");
        assert_eq!(b["metadata"]["deletionGracePeriodSeconds"], 30);
        // A second delete with grace 0 removes it.
        let force = DeleteOpts { grace: Some(0), ..Default::default() };
        assert!(matches!(
            delete(&store, pr, Some("ns"), "b", &force, now()).unwrap(),
            Deleted::Gone(_)
        ));
        // Finalizers keep a pod; removing the last one deletes it.
        pod(&store, "c", None, &["example.com/f"]);
        assert!(matches!(
            delete(&store, pr, Some("ns"), "c", &DeleteOpts::default(), now()).unwrap(),
            Deleted::Pending(_)
        ));
        let key = ("ns".to_owned(), "c".to_owned());
        remove_finalizer(&store, StoreKind::Pod, &key, "example.com/f").unwrap();
        assert!(store.get(StoreKind::Pod, &key).is_none());
    }

    #[test]
    fn job_delete_defaults_to_orphan_and_bumps_generation() {
        let store = setup();
        let jr = res(StoreKind::Job);
        let key: Key = ("ns".into(), "j".into());
        store
            .mutate(StoreKind::Job, &key, |_, _| {
                Ok((Mutation::Put(json!({"metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1}})), ()))
            })
            .unwrap();
        let Deleted::Pending(j) =
            delete(&store, jr, Some("ns"), "j", &DeleteOpts::default(), now()).unwrap()
        else {
            panic!("orphan finalizer must keep the job")
        };
        assert_eq!(j["metadata"]["finalizers"], json!([ORPHAN_FINALIZER]));
        assert_eq!(j["metadata"]["generation"], 2);
        let bg = DeleteOpts { propagation: Some(Propagation::Background), ..Default::default() };
        // Already deleting: a second delete changes nothing.
        assert!(matches!(
            delete(&store, jr, Some("ns"), "j", &bg, now()).unwrap(),
            Deleted::Pending(_)
        ));
        let _ = RESOURCES.len();
    }

    #[test]
    fn precondition_failures_conflict() {
        let store = setup();
        pod(&store, "p", None, &[]);
        let opts = DeleteOpts { uid: Some("other".into()), ..Default::default() };
        let err = delete(&store, res(StoreKind::Pod), Some("ns"), "p", &opts, now()).unwrap_err();
        assert_eq!(err.code, 409);
        assert!(
            err.message.contains("Precondition failed: UID in precondition: other"),
            "{}",
            err.message
        );
    }

    #[test]
    fn no_new_finalizers_while_deleting() {
        let store = setup();
        let p = pod(&store, "p", None, &["a.io/x"]);
        delete(&store, res(StoreKind::Pod), Some("ns"), "p", &DeleteOpts::default(), now())
            .unwrap();
        let mut body = (*store.get(StoreKind::Pod, &("ns".into(), "p".into())).unwrap()).clone();
        body["metadata"]["finalizers"] = json!(["a.io/x", "b.io/y"]);
        let err = update_in(&store, StoreKind::Pod, "p", body, Part::Main).unwrap_err();
        assert_eq!(err.code, 422);
        let _ = p;
    }
}
