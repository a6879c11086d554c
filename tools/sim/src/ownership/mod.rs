//! Server-side-apply field ownership (`metadata.managedFields`), as kube-apiserver's field
//! manager and structured-merge-diff keep it.
//!
//! * An Update (create, PUT, JSON/merge/strategic patch) gives its manager the fields it adds or
//!   changes; every other manager loses them, and fields it removes leave every manager. No
//!   conflicts.
//! * An Apply makes the manager's Apply entry exactly the applied configuration's fields;
//!   changing a field another manager owns is a conflict (409) unless forced, which takes it;
//!   fields the manager applied before and no longer applies are removed from the object unless
//!   some other manager owns them.
//! * Entries are keyed by (manager, operation, apiVersion, subresource); empty ones are dropped;
//!   `metadata.{name,namespace,uid,...}`, `apiVersion` and `kind` are never owned; the
//!   strategy's reset fields (`status` on the main resource, `spec` on `/status`) are ignored.
//!
//! Sets are computed only on writes, from the JSON documents the registry already holds.

pub mod schema;
pub mod set;

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::registry::Part;
use crate::resources::StoreKind;
use schema::{ListType, ObjType, atomic_elements, key_default, list_type, null_fields, obj_type};
use set::{Pe, Scalar, Set, display_path};

/// The operation an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// Server-side apply.
    Apply,
    /// Any other write.
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The field manager.
    pub manager: String,
    /// Apply or Update.
    pub operation: Operation,
    /// The apiVersion the fields are expressed in.
    pub api_version: String,
    /// When the manager last changed the object (metav1.Time), if it did.
    pub time: Option<String>,
    /// `status` for writes to the status subresource, else empty.
    pub subresource: String,
    /// The owned fields.
    pub fields: Set,
}

impl Entry {
    fn is(&self, id: &Id<'_>) -> bool {
        self.manager == id.manager
            && self.operation == id.operation
            && self.api_version == id.api_version
            && self.subresource == id.subresource
    }

    /// How conflict messages name this manager (apimachinery's `printManager`).
    fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s = format!("{s} with subresource {:?}", self.subresource);
        }
        if self.operation == Operation::Update {
            s = match &self.time {
                Some(t) => format!("{s} using {} at {t}", self.api_version),
                None => format!("{s} using {}", self.api_version),
            };
        }
        s
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation.as_str()));
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), self.fields.to_fields_v1());
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), json!(self.subresource));
        }
        Value::Object(m)
    }

    fn from_json(v: &Value) -> Option<Entry> {
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let operation = match v.get("operation").and_then(Value::as_str) {
            Some("Apply") => Operation::Apply,
            Some("Update") => Operation::Update,
            _ => return None,
        };
        if v.get("fieldsType").and_then(Value::as_str).is_some_and(|t| t != "FieldsV1") {
            return None;
        }
        let fields = match v.get("fieldsV1") {
            Some(f) => Set::from_fields_v1(f)?,
            None => Set::default(),
        };
        Some(Entry {
            manager: text("manager"),
            operation,
            api_version: text("apiVersion"),
            time: v.get("time").and_then(Value::as_str).map(str::to_owned),
            subresource: text("subresource"),
            fields,
        })
    }
}

/// Who writes: the identity of an entry.
#[derive(Debug, Clone, Copy)]
pub struct Id<'a> {
    /// The field manager.
    pub manager: &'a str,
    /// Apply or Update.
    pub operation: Operation,
    /// The resource's apiVersion.
    pub api_version: &'a str,
    /// `status` or empty.
    pub subresource: &'a str,
}

impl<'a> Id<'a> {
    /// The identity of a write to `part` of a resource served at `api_version`.
    pub fn new(manager: &'a str, operation: Operation, api_version: &'a str, part: Part) -> Self {
        let subresource = if part == Part::Status { "status" } else { "" };
        let manager = if manager.is_empty() { "unknown" } else { manager };
        Id { manager, operation, api_version, subresource }
    }
}

/// The field manager of a request: `fieldManager` if given, else the User-Agent up to its first
/// `/`, printable characters only, at most 128 bytes (the real server's `prefixFromUserAgent`).
pub fn manager_name(field_manager: Option<&str>, user_agent: Option<&str>) -> String {
    if let Some(m) = field_manager.filter(|m| !m.is_empty()) {
        return m.to_owned();
    }
    let prefix = user_agent.unwrap_or_default().split('/').next().unwrap_or_default();
    let mut out = String::new();
    for c in prefix.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > 128 {
            break;
        }
        out.push(c);
    }
    out
}

/// What a request body said about managedFields.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// Nothing (or an empty list on create): keep the live entries.
    Absent,
    /// `managedFields: []` (or one empty entry): drop every entry.
    Reset,
    /// Entries to use instead of the live ones.
    Given(Value),
}

/// Takes `metadata.managedFields` out of a request body.
pub fn take_incoming(body: &mut Value) -> Incoming {
    let Some(v) = body
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .and_then(|m| m.shift_remove("managedFields"))
    else {
        return Incoming::Absent;
    };
    match &v {
        Value::Array(a) if a.is_empty() => Incoming::Reset,
        Value::Array(a) if a.len() == 1 && a[0].as_object().is_some_and(Map::is_empty) => {
            Incoming::Reset
        }
        Value::Array(_) => Incoming::Given(v),
        _ => Incoming::Absent,
    }
}

/// Decodes the entries of an object's `metadata.managedFields` (none when absent or invalid, as
/// the real server treats undecodable entries).
pub fn entries_of(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields").map(decode).unwrap_or_default()
}

/// Decodes a `managedFields` list (none when any entry is invalid).
pub fn decode(v: &Value) -> Vec<Entry> {
    let Some(list) = v.as_array() else { return Vec::new() };
    list.iter().map(Entry::from_json).collect::<Option<Vec<_>>>().unwrap_or_default()
}

/// The `metadata.managedFields` of `entries`, sorted as the real server sorts them (Apply
/// before Update, then by time, manager, apiVersion, subresource); `None` when no entry owns
/// anything.
pub fn encode(mut entries: Vec<Entry>) -> Option<Value> {
    entries.retain(|e| !e.fields.is_empty());
    if entries.is_empty() {
        return None;
    }
    entries.sort_by(|a, b| {
        (a.operation, &a.time, &a.manager, &a.api_version, &a.subresource).cmp(&(
            b.operation,
            &b.time,
            &b.manager,
            &b.api_version,
            &b.subresource,
        ))
    });
    Some(Value::Array(entries.iter().map(Entry::to_json).collect()))
}

/// Sets (or, for `None`, removes) `obj`'s `metadata.managedFields`.
pub fn set_managed(obj: &mut Value, managed: Option<Value>) {
    let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    match managed {
        Some(m) => md.insert("managedFields".into(), m),
        None => md.shift_remove("managedFields"),
    };
}

/// The empty object of a kind as the Go types serialise it: the structs that are never
/// omitted, so that a create does not count them as added (no `.` for them).
pub fn zero_object(kind: StoreKind) -> Value {
    match kind {
        StoreKind::Job => {
            json!({"metadata": {}, "spec": {"template": {"metadata": {}, "spec": {}}}, "status": {}})
        }
        StoreKind::Lease => json!({"metadata": {}, "spec": {}}),
        StoreKind::PriorityClass => json!({"metadata": {}}),
        StoreKind::Event => json!({"metadata": {}, "involvedObject": {}, "source": {}}),
        StoreKind::Pod | StoreKind::Namespace => json!({"metadata": {}, "spec": {}, "status": {}}),
    }
}

/// A write being recorded: of which kind and part, by whom, when (metav1.Time).
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    /// The kind written.
    pub kind: StoreKind,
    /// The main resource or `/status`.
    pub part: Part,
    /// The entry it is recorded under.
    pub id: Id<'a>,
    /// The time entries it changes get.
    pub now: &'a str,
}

/// Records an Update `w` that turned `live` into `new` (both without regard to their
/// managedFields) in `entries`. `create`: the object is new, so it is tracked even when no
/// entry exists yet; otherwise an object without entries stays untracked (the real server's
/// skip-non-applied rule).
pub fn record_update(
    w: &Write<'_>,
    live: &Value,
    new: &Value,
    entries: &mut Vec<Entry>,
    create: bool,
) {
    let Write { kind, part, id, now } = *w;
    if entries.is_empty() && !create {
        return;
    }
    let cmp = compare_except(kind, live, new, reset_fields(kind, part));
    let changed = cmp.added.union(&cmp.modified);
    for e in entries.iter_mut() {
        e.fields = e.fields.difference(&changed).difference(&cmp.removed);
    }
    let mut mine = changed;
    strip_meta(&mut mine);
    entries.retain(|e| !e.fields.is_empty());
    if mine.is_empty() {
        return;
    }
    match entries.iter_mut().find(|e| e.is(&id)) {
        Some(e) => {
            e.fields.union_with(mine);
            e.time = Some(now.to_owned());
        }
        None => entries.push(Entry {
            manager: id.manager.to_owned(),
            operation: Operation::Update,
            api_version: id.api_version.to_owned(),
            time: Some(now.to_owned()),
            subresource: id.subresource.to_owned(),
            fields: mine,
        }),
    }
    cap_update_managers(entries);
}

/// One field another manager owns and an Apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The owner, as conflict messages print it.
    pub manager: String,
    /// The path, as `.spec.x`.
    pub path: String,
}

/// The 409 the real server answers an Apply with conflicts (`details.causes` of type
/// FieldManagerConflict, one per field).
pub fn conflict_error(conflicts: &[Conflict]) -> ApiError {
    let message = if let [c] = conflicts {
        format!("Apply failed with 1 conflict: conflict with {}: {}", c.manager, c.path)
    } else {
        let mut managers: Vec<&str> = conflicts.iter().map(|c| c.manager.as_str()).collect();
        managers.sort();
        managers.dedup();
        let mut lines = Vec::new();
        for m in managers {
            lines.push(format!("conflicts with {m}:"));
            lines.extend(
                conflicts.iter().filter(|c| c.manager == m).map(|c| format!("- {}", c.path)),
            );
        }
        format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            json!({"reason": "FieldManagerConflict", "message": format!("conflict with {}", c.manager), "field": c.path})
        })
        .collect();
    ApiError::apply_conflict(message, causes)
}

/// Records an Apply `w` of `config` onto `live` (`None` on create), where `merged` is `live`
/// with `config` merged in. Returns the merged object with the fields the manager gave up
/// removed, or the conflicts (when not `force`).
pub fn record_apply(
    w: &Write<'_>,
    live: Option<&Value>,
    mut merged: Value,
    config: &Value,
    entries: &mut Vec<Entry>,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    let Write { kind, part, id, now } = *w;
    let reset = reset_fields(kind, part);
    let mut applied = to_field_set(kind, config);
    for p in reset {
        applied.remove_subtree(&Pe::Field((*p).to_owned()));
    }
    let last = entries.iter().find(|e| e.is(&id)).map(|e| e.fields.clone());
    match entries.iter_mut().find(|e| e.is(&id)) {
        Some(e) => e.fields = applied,
        None => entries.push(Entry {
            manager: id.manager.to_owned(),
            operation: Operation::Apply,
            api_version: id.api_version.to_owned(),
            time: None,
            subresource: id.subresource.to_owned(),
            fields: applied,
        }),
    }
    if let Some(last) = last.filter(|l| !l.is_empty()) {
        let mut owned = Set::default();
        for e in entries.iter() {
            owned.union_with(e.fields.clone());
        }
        let gone = ensure_named(&last, &mut Vec::new(), ObjType::Struct).difference(&ensure_named(
            &owned,
            &mut Vec::new(),
            ObjType::Struct,
        ));
        remove_items(kind, &mut Vec::new(), &mut merged, &gone);
    }
    let zero = zero_object(kind);
    let base = live.unwrap_or(&zero);
    let cmp = compare_except(kind, base, &merged, reset);
    let changed = cmp.added.union(&cmp.modified);
    let mut conflicts = Vec::new();
    for e in entries.iter().filter(|e| !e.is(&id)) {
        conflicts.extend(e.fields.intersection(&changed).paths().into_iter().map(|p| (e, p)));
    }
    if !force && !conflicts.is_empty() {
        // kubectl's server-side apply may take, without force, what its client-side apply set
        // and nobody changed since (apimachinery's lastAppliedManager).
        if id.manager == "kubectl"
            && let Some(allowed) =
                live.and_then(|l| allowed_by_last_applied(kind, l, id.api_version))
        {
            conflicts.retain(|(_, p)| !allowed.has_path(p));
        }
        if !conflicts.is_empty() {
            let conflicts = conflicts
                .into_iter()
                .map(|(e, p)| Conflict { manager: e.describe(), path: display_path(&p) })
                .collect();
            return Err(conflicts);
        }
    }
    for e in entries.iter_mut() {
        if e.is(&id) {
            strip_meta(&mut e.fields);
        } else {
            e.fields = e.fields.difference(&changed).difference(&cmp.removed);
        }
    }
    entries.retain(|e| !e.fields.is_empty());
    if live.is_none_or(|l| !same_ignoring_managed_fields(l, &merged))
        && let Some(e) = entries.iter_mut().find(|e| e.is(&id))
    {
        e.time = Some(now.to_owned());
    }
    Ok(merged)
}

fn same_ignoring_managed_fields(a: &Value, b: &Value) -> bool {
    fn meta_eq(x: Option<&Value>, y: Option<&Value>) -> bool {
        match (x.and_then(Value::as_object), y.and_then(Value::as_object)) {
            (Some(p), Some(q)) => {
                let n = |m: &Map<String, Value>| m.keys().filter(|k| *k != "managedFields").count();
                n(p) == n(q)
                    && p.iter()
                        .filter(|(k, _)| *k != "managedFields")
                        .all(|(k, v)| q.get(k) == Some(v))
            }
            _ => x == y,
        }
    }
    let (Some(am), Some(bm)) = (a.as_object(), b.as_object()) else { return a == b };
    am.len() == bm.len()
        && am.iter().all(|(k, v)| {
            if k == "metadata" { meta_eq(Some(v), bm.get(k)) } else { bm.get(k) == Some(v) }
        })
}

// The fields of the client-side apply annotation of `live` whose values are still as applied,
// or `None` without a usable annotation (none, not JSON, another apiVersion).
fn allowed_by_last_applied(kind: StoreKind, live: &Value, api_version: &str) -> Option<Set> {
    let text = live.pointer("/metadata/annotations")?.get(LAST_APPLIED)?.as_str()?;
    let last: Value = serde_json::from_str(text).ok()?;
    if last.get("apiVersion").and_then(Value::as_str) != Some(api_version) {
        return None;
    }
    let cmp = compare(kind, &last, live);
    Some(
        to_field_set(kind, &last)
            .difference(&cmp.modified)
            .difference(&cmp.added)
            .difference(&cmp.removed),
    )
}

/// Update entries the real server keeps per object; older ones merge into `ancient-changes`.
const MAX_UPDATE_MANAGERS: usize = 10;
const ANCIENT_CHANGES: &str = "ancient-changes";

// Merges the oldest Update entries into one `ancient-changes` entry per apiVersion until at most
// MAX_UPDATE_MANAGERS remain (apimachinery's capManagersManager).
fn cap_update_managers(entries: &mut Vec<Entry>) {
    let updates = entries.iter().filter(|e| e.operation == Operation::Update).count();
    if updates <= MAX_UPDATE_MANAGERS {
        return;
    }
    let mut order: Vec<usize> =
        (0..entries.len()).filter(|i| entries[*i].operation == Operation::Update).collect();
    order.sort_by(|a, b| {
        let (x, y) = (&entries[*a], &entries[*b]);
        (&x.time, &x.manager).cmp(&(&y.time, &y.manager))
    });
    let is_bucket = |e: &Entry, version: &str| {
        e.manager == ANCIENT_CHANGES
            && e.operation == Operation::Update
            && e.api_version == version
            && e.subresource.is_empty()
    };
    let mut excess = updates - MAX_UPDATE_MANAGERS;
    let mut first: Vec<(String, usize)> = Vec::new();
    let mut merged = Vec::new();
    for i in order {
        if excess == 0 {
            break;
        }
        let version = entries[i].api_version.clone();
        let Some(&(_, first_of_version)) = first.iter().find(|(v, _)| *v == version) else {
            first.push((version, i));
            continue;
        };
        let bucket = match entries.iter().position(|e| is_bucket(e, &version)) {
            Some(b) => b,
            None => {
                let f = &mut entries[first_of_version];
                f.manager = ANCIENT_CHANGES.into();
                f.subresource = String::new();
                first_of_version
            }
        };
        if bucket == i {
            continue;
        }
        let e = entries[i].clone();
        entries[bucket].fields.union_with(e.fields);
        entries[bucket].time = e.time;
        merged.push(i);
        excess -= 1;
    }
    let mut i = 0;
    entries.retain(|_| {
        i += 1;
        !merged.contains(&(i - 1))
    });
}

/// The strategy's reset fields of a write to `part`: changes there are nobody's.
fn reset_fields(kind: StoreKind, part: Part) -> &'static [&'static str] {
    let has_status = matches!(kind, StoreKind::Pod | StoreKind::Job | StoreKind::Namespace);
    match part {
        Part::Main if has_status => &["status"],
        Part::Status => &["spec"],
        Part::Main => &[],
    }
}

const META_STRIPPED: [&str; 9] = [
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "clusterName",
    "generation",
    "managedFields",
    "resourceVersion",
];

// What no manager owns (apimachinery's stripMetaManager).
fn strip_meta(set: &mut Set) {
    for f in ["apiVersion", "kind", "metadata"] {
        set.remove_path(&[Pe::Field(f.into())]);
    }
    for f in META_STRIPPED {
        set.remove_path(&[Pe::Field("metadata".into()), Pe::Field(f.into())]);
    }
}

// --- walks over documents, typed by `schema` -----------------------------------------------

fn item_pe(lt: ListType, item: &Value, index: usize) -> Pe {
    match lt {
        ListType::Set => Pe::Value(Scalar(item.clone())),
        ListType::Map(keys) => {
            let mut k: Vec<(String, Scalar)> = keys
                .iter()
                .filter_map(|f| {
                    let v = item.get(*f).cloned().or_else(|| key_default(f).map(|d| json!(d)))?;
                    Some(((*f).to_owned(), Scalar(v)))
                })
                .collect();
            if k.is_empty() {
                return Pe::Index(index);
            }
            k.sort_by(|a, b| a.0.cmp(&b.0));
            Pe::Key(k)
        }
        ListType::Atomic => Pe::Index(index),
    }
}

fn is_managed_fields(path: &[&str], key: &str) -> bool {
    key == "managedFields" && path.len() == 1 && path[0] == "metadata"
}

/// The fields an applied configuration sets (structured-merge-diff's `ToFieldSet`).
pub fn to_field_set(kind: StoreKind, v: &Value) -> Set {
    match v {
        Value::Object(m) => fs_object(kind, &mut Vec::new(), m, ObjType::Struct),
        _ => Set::default(),
    }
}

fn fs_object<'a>(
    kind: StoreKind,
    path: &mut Vec<&'a str>,
    m: &'a Map<String, Value>,
    ty: ObjType,
) -> Set {
    let mut out = Set::default();
    for (k, v) in m {
        if is_managed_fields(path, k) {
            continue;
        }
        let pe = Pe::Field(k.clone());
        if ty == ObjType::Map {
            out.insert(pe, true, Set::default());
            continue;
        }
        path.push(k);
        let (member, children) = fs_value(kind, path, v);
        path.pop();
        out.insert(pe, member, children);
    }
    out
}

fn fs_value<'a>(kind: StoreKind, path: &mut Vec<&'a str>, v: &'a Value) -> (bool, Set) {
    match v {
        Value::Object(m) => match obj_type(path) {
            ObjType::Atomic => (true, Set::default()),
            _ if m.is_empty() => (true, Set::default()),
            ty => (false, fs_object(kind, path, m, ty)),
        },
        Value::Array(a) => match list_type(kind, path) {
            ListType::Atomic => (true, Set::default()),
            lt => {
                let atomic_items = atomic_elements(kind, path);
                let mut out = Set::default();
                for (i, item) in a.iter().enumerate() {
                    let children = match item {
                        Value::Object(m) if !atomic_items => {
                            fs_object(kind, path, m, ObjType::Struct)
                        }
                        _ => Set::default(),
                    };
                    out.insert(item_pe(lt, item, i), true, children);
                }
                (false, out)
            }
        },
        _ => (true, Set::default()),
    }
}

/// What changed from one document to another (structured-merge-diff's `Comparison`).
#[derive(Debug, Default)]
pub struct Comparison {
    /// Paths only in the new document (including maps and list elements that are new).
    pub added: Set,
    /// Leaves whose value changed.
    pub modified: Set,
    /// Paths only in the old document.
    pub removed: Set,
}

impl Comparison {
    fn put(&mut self, pe: Pe, sub: Comparison, mark: Mark) {
        self.added.insert(pe.clone(), mark == Mark::Added, sub.added);
        self.modified.insert(pe.clone(), mark == Mark::Modified, sub.modified);
        self.removed.insert(pe, mark == Mark::Removed, sub.removed);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Same,
    Added,
    Modified,
    Removed,
}

/// Compares two documents of `kind` (their managedFields left out).
pub fn compare(kind: StoreKind, old: &Value, new: &Value) -> Comparison {
    compare_except(kind, old, new, &[])
}

// Compares two documents but their top-level fields `skip` (the reset fields, which are nobody's:
// a pod's status write does not walk its spec).
fn compare_except(kind: StoreKind, old: &Value, new: &Value, skip: &[&str]) -> Comparison {
    let (Some(lm), Some(rm)) = (old.as_object(), new.as_object()) else {
        return cmp_value(kind, &mut Vec::new(), Some(old), Some(new), false).0;
    };
    let mut out = Comparison::default();
    let mut path = Vec::new();
    for k in lm.keys().chain(rm.keys().filter(|k| !lm.contains_key(*k))) {
        if skip.contains(&k.as_str()) {
            continue;
        }
        path.push(k.as_str());
        let (sub, mark) = cmp_value(kind, &mut path, lm.get(k), rm.get(k), false);
        path.pop();
        out.put(Pe::Field(k.clone()), sub, mark);
    }
    out
}

fn leaf(l: Option<&Value>, r: Option<&Value>) -> Mark {
    match (l, r) {
        (None, Some(_)) => Mark::Added,
        (Some(_), None) => Mark::Removed,
        (Some(a), Some(b)) if a != b => Mark::Modified,
        _ => Mark::Same,
    }
}

fn presence(l: Option<&Value>, r: Option<&Value>) -> Mark {
    match (l, r) {
        (None, Some(_)) => Mark::Added,
        (Some(_), None) => Mark::Removed,
        _ => Mark::Same,
    }
}

static EMPTY_LIST: Value = Value::Array(Vec::new());

/// Both sides read as a `T` (an absent side stays `None`); `None` when a present side is not one.
fn both_as<'v, T: ?Sized>(
    l: Option<&'v Value>,
    r: Option<&'v Value>,
    read: impl Fn(&'v Value) -> Option<&'v T>,
) -> Option<(Option<&'v T>, Option<&'v T>)> {
    let side = |v: Option<&'v Value>| v.map_or(Some(None), |v| read(v).map(Some));
    Some((side(l)?, side(r)?))
}

fn cmp_value<'v>(
    kind: StoreKind,
    path: &mut Vec<&'v str>,
    l: Option<&'v Value>,
    r: Option<&'v Value>,
    atomic: bool,
) -> (Comparison, Mark) {
    let mut out = Comparison::default();
    if atomic {
        return (out, leaf(l, r));
    }
    // A `null` beside a list or object is that value, present and empty.
    let (l, r) = match (l, r) {
        (Some(Value::Null), Some(Value::Array(_))) => (Some(&EMPTY_LIST), r),
        (Some(Value::Array(_)), Some(Value::Null)) => (l, Some(&EMPTY_LIST)),
        _ => (l, r),
    };
    match (l.or(r), l, r) {
        (Some(Value::Object(_)), _, _) => {
            let Some((lm, rm)) = both_as(l, r, Value::as_object) else {
                return (out, leaf(l, r));
            };
            let ty = obj_type(path);
            let empty = |m: Option<&Map<String, Value>>| m.is_none_or(Map::is_empty);
            if ty == ObjType::Atomic || (empty(lm) && empty(rm)) {
                return (out, leaf(l, r));
            }
            let implicit = null_fields(kind, path);
            let keys = lm.into_iter().chain(rm).flat_map(|m| m.keys().map(String::as_str));
            let mut seen = std::collections::HashSet::new();
            for k in keys.chain(implicit.iter().copied()) {
                if !seen.insert(k) || is_managed_fields(path, k) {
                    continue;
                }
                // Never-omitted fields read as `null` on whichever side has the object.
                let get = |m: Option<&'v Map<String, Value>>| {
                    let m = m?;
                    m.get(k).or_else(|| implicit.contains(&k).then_some(&Value::Null))
                };
                let (lv, rv) = (get(lm), get(rm));
                let (sub, mark) = if ty == ObjType::Map {
                    (Comparison::default(), leaf(lv, rv))
                } else {
                    path.push(k);
                    let res = cmp_value(kind, path, lv, rv, false);
                    path.pop();
                    res
                };
                out.put(Pe::Field(k.to_owned()), sub, mark);
            }
            (out, presence(l, r))
        }
        (Some(Value::Array(_)), _, _) => {
            let Some((la, ra)) = both_as(l, r, Value::as_array) else {
                return (out, leaf(l, r));
            };
            let lt = list_type(kind, path);
            let empty = |a: Option<&Vec<Value>>| a.is_none_or(Vec::is_empty);
            if lt == ListType::Atomic || (empty(la) && empty(ra)) {
                return (out, leaf(l, r));
            }
            let atomic_items = atomic_elements(kind, path);
            let (li, ri) = (index_items(lt, la), index_items(lt, ra));
            let mut pes: Vec<&Pe> = li.iter().map(|(p, _)| p).collect();
            pes.extend(ri.iter().map(|(p, _)| p).filter(|p| !li.iter().any(|(q, _)| q == *p)));
            for pe in pes {
                let lv = li.iter().find(|(p, _)| p == pe).map(|(_, v)| *v);
                let rv = ri.iter().find(|(p, _)| p == pe).map(|(_, v)| *v);
                let (sub, mark) = cmp_value(kind, path, lv, rv, atomic_items);
                out.put(pe.clone(), sub, mark);
            }
            (out, presence(l, r))
        }
        _ => (out, leaf(l, r)),
    }
}

// The elements of a list by path element (the first of duplicates).
fn index_items(lt: ListType, a: Option<&Vec<Value>>) -> Vec<(Pe, &Value)> {
    let mut v: Vec<(Pe, &Value)> = Vec::new();
    for (i, item) in a.into_iter().flatten().enumerate() {
        let pe = item_pe(lt, item, i);
        if !v.iter().any(|(p, _)| *p == pe) {
            v.push((pe, item));
        }
    }
    v
}

// Named fields of structs count as members (structured-merge-diff's
// `EnsureNamedFieldsAreMembers`), so pruning a struct field removes it as a whole.
fn ensure_named<'s>(set: &'s Set, path: &mut Vec<&'s str>, parent: ObjType) -> Set {
    let mut out = Set::default();
    for (pe, node) in set.nodes() {
        let (member, children) = match pe {
            Pe::Field(name) => {
                path.push(name);
                let ty = obj_type(path);
                let children = ensure_named(&node.children, path, ty);
                path.pop();
                (node.member || parent == ObjType::Struct, children)
            }
            _ => (node.member, ensure_named(&node.children, path, ObjType::Struct)),
        };
        out.insert(pe.clone(), member, children);
    }
    out
}

// Removes the members of `set` (with everything below them) from `v`.
fn remove_items(kind: StoreKind, path: &mut Vec<String>, v: &mut Value, set: &Set) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !set.has(&Pe::Field(k.clone())));
            for (k, child) in m.iter_mut() {
                if let Some(node) = set.get(&Pe::Field(k.clone()))
                    && !node.children.is_empty()
                {
                    path.push(k.clone());
                    remove_items(kind, path, child, &node.children);
                    path.pop();
                }
            }
        }
        Value::Array(a) => {
            let lt = list_type(kind, &path.iter().map(String::as_str).collect::<Vec<_>>());
            if lt == ListType::Atomic {
                return;
            }
            let mut i = 0;
            a.retain(|item| {
                let keep = !set.has(&item_pe(lt, item, i));
                i += 1;
                keep
            });
            for (i, item) in a.iter_mut().enumerate() {
                if let Some(node) = set.get(&item_pe(lt, item, i))
                    && !node.children.is_empty()
                {
                    remove_items(kind, path, item, &node.children);
                }
            }
        }
        _ => {}
    }
}

/// The `kubectl.kubernetes.io/last-applied-configuration` annotation.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// After an Apply by `kubectl` onto an object that carries the client-side apply annotation,
/// the real server rewrites the annotation to the applied configuration (without the
/// annotation), encoded as Go's json encoder does (sorted keys, trailing newline).
pub fn update_last_applied(obj: &mut Value, config: &Value, manager: &str) {
    let has = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(LAST_APPLIED))
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    if manager != "kubectl" || !has {
        return;
    }
    let mut cfg = config.clone();
    if let Some(a) = cfg.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        a.shift_remove(LAST_APPLIED);
        if a.is_empty()
            && let Some(md) = cfg.get_mut("metadata").and_then(Value::as_object_mut)
        {
            md.shift_remove("annotations");
        }
    }
    let text = format!("{}\n", go_json(&cfg));
    obj["metadata"]["annotations"][LAST_APPLIED] = Value::String(text);
}

// JSON with sorted keys and HTML characters escaped, as Go's encoding/json writes it.
fn go_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> =
                keys.iter().map(|k| format!("{}:{}", go_string(k), go_json(&m[*k]))).collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(go_json).collect::<Vec<_>>().join(",")),
        Value::String(s) => go_string(s),
        other => other.to_string(),
    }
}

fn go_string(s: &str) -> String {
    Value::String(s.to_owned())
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

#[cfg(test)]
mod tests;
