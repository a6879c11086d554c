//! The object store: one global resourceVersion counter, one ordered map per kind, an event
//! history for watches (bounded, compactable) and a broadcast of every change.
//!
//! Every write runs a caller's closure under the store lock, so read-check-write sequences
//! (preconditions, admission on the current object) are atomic without retries.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::error::ApiError;
use crate::resources::StoreKind;

/// `(namespace, name)`; cluster-scoped objects use an empty namespace.
pub type Key = (String, String);

/// Capacity of the change broadcast: a watcher more than this many events behind is ended
/// with a 410 ERROR (it relists), so a slow client never makes the store buffer without bound.
const BROADCAST_CAPACITY: usize = 1 << 16;

/// One stored state of an object: the JSON tree plus its wire encoding, made at most once
/// (on the first read that sends it whole) and shared by every GET, LIST page and watch event
/// that sends this state. The tree carries its own resourceVersion, so the bytes do too.
#[derive(Debug)]
pub struct Obj {
    value: Value,
    json: OnceLock<Bytes>,
}

impl Obj {
    /// Wraps a state whose encoding is not made yet.
    pub fn new(value: Value) -> Self {
        Self { value, json: OnceLock::new() }
    }

    /// The object as JSON, encoded on the first call.
    pub fn json(&self) -> &Bytes {
        self.json.get_or_init(|| Bytes::from(serde_json::to_vec(&self.value).unwrap_or_default()))
    }

    /// The JSON tree.
    pub fn value(&self) -> &Value {
        &self.value
    }
}

impl std::ops::Deref for Obj {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.value
    }
}

/// Watch event types the store produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

impl EventType {
    /// Wire name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change of one object.
#[derive(Debug)]
pub struct StoreEvent {
    /// The revision of this change.
    pub rv: u64,
    /// Store of the object.
    pub kind: StoreKind,
    /// Kind of change.
    pub typ: EventType,
    /// Key of the object.
    pub key: Key,
    /// New state; for DELETED the last state carrying the deletion revision.
    pub object: Arc<Obj>,
    /// Previous state (MODIFIED and DELETED).
    pub prev: Option<Arc<Obj>>,
}

/// What a write closure decided.
#[derive(Debug)]
pub enum Mutation {
    /// Nothing changes (no revision, no event).
    Unchanged,
    /// Store this object (created or replaced). If it carries a deletionTimestamp, no
    /// finalizers and a zero or absent grace period it is removed instead (DELETED only).
    Put(Value),
    /// Write this object (MODIFIED) and then remove it (DELETED): a pod deleted with grace 0.
    PutThenRemove(Value),
    /// Remove the current object (DELETED).
    Remove,
}

/// The result of a write.
#[derive(Debug, Clone)]
pub enum Written {
    /// Nothing changed; the current object (if any).
    Unchanged(Option<Arc<Obj>>),
    /// Created.
    Created(Arc<Obj>),
    /// Replaced.
    Updated(Arc<Obj>),
    /// Removed; the last state with the deletion revision.
    Deleted(Arc<Obj>),
}

/// Where a list reads from.
#[derive(Debug, Clone, Copy)]
pub enum ListAt {
    /// The latest state.
    Latest,
    /// The state at exactly this revision (needs history).
    Exact(u64),
}

/// What one list reads: a kind, in one namespace or all, after a key (exclusive), at most
/// `limit` objects, at a revision; with `required`, only objects carrying that label
/// (`(key, value)`), read from the label index instead of a scan.
#[derive(Debug, Clone, Copy)]
pub struct ListQuery<'a> {
    /// The kind listed.
    pub kind: StoreKind,
    /// One namespace, or all when `None`.
    pub ns: Option<&'a str>,
    /// Continue after this key.
    pub after: Option<&'a Key>,
    /// Most objects in the page.
    pub limit: Option<usize>,
    /// Which revision the list reads.
    pub at: ListAt,
    /// A label every object `keep` accepts carries.
    pub required: Option<(&'a str, &'a str)>,
}

impl<'a> ListQuery<'a> {
    /// Every object of `kind` in `ns` (all namespaces when `None`), at the latest revision.
    pub fn of(kind: StoreKind, ns: Option<&'a str>) -> Self {
        Self { kind, ns, after: None, limit: None, at: ListAt::Latest, required: None }
    }

    /// Continues after `key`.
    pub fn after(self, after: Option<&'a Key>) -> Self {
        Self { after, ..self }
    }

    /// At most `limit` objects.
    pub fn limit(self, limit: Option<usize>) -> Self {
        Self { limit, ..self }
    }

    /// Reads at `at`.
    pub fn at(self, at: ListAt) -> Self {
        Self { at, ..self }
    }

    /// Only objects labelled `required` (which `keep` must also demand).
    pub fn labeled(self, required: Option<(&'a str, &'a str)>) -> Self {
        Self { required, ..self }
    }
}

/// A page of a list.
#[derive(Debug)]
pub struct ListPage {
    /// Items in key order.
    pub items: Vec<Arc<Obj>>,
    /// The revision the page reflects.
    pub rv: u64,
    /// Key of the last item when more items remain.
    pub next: Option<Key>,
    /// Items left after this page (before filtering).
    pub remaining: usize,
}

/// What a new watch starts from.
#[derive(Debug)]
pub struct WatchStart {
    /// Current objects to send as ADDED first (watch without a start revision).
    pub initial: Vec<Arc<Obj>>,
    /// Retained events after the start revision.
    pub replay: Vec<Arc<StoreEvent>>,
    /// Live events after the snapshot.
    pub rx: broadcast::Receiver<Arc<StoreEvent>>,
    /// Revision of the snapshot.
    pub rv: u64,
}

/// Read-only view of the rest of the store, given to write closures.
#[derive(Debug)]
pub struct View<'a> {
    inner: &'a Inner,
}

impl View<'_> {
    /// The stored namespace, if it exists.
    pub fn namespace(&self, name: &str) -> Option<&Arc<Obj>> {
        self.inner.tables[StoreKind::Namespace.index()].get(&(String::new(), name.to_owned()))
    }

    /// Whether an object with this uid exists (any kind).
    pub fn uid_exists(&self, uid: &str) -> bool {
        self.inner.uids.contains_key(uid)
    }

    /// The revision the next write will get.
    pub fn next_rv(&self) -> u64 {
        self.inner.rv + 1
    }
}

/// Per kind: label key → label value → keys of the objects carrying that label.
type LabelIndex = HashMap<String, HashMap<String, BTreeSet<Key>>>;

#[derive(Debug)]
struct Inner {
    rv: u64,
    tables: [BTreeMap<Key, Arc<Obj>>; StoreKind::ALL.len()],
    // Equality label selectors (the worker lists a Job's pods by controller-uid on every sync)
    // are answered from here in O(matches) instead of a scan of the namespace.
    labels: [LabelIndex; StoreKind::ALL.len()],
    uids: HashMap<String, (StoreKind, Key)>,
    dependents: HashMap<String, HashSet<(StoreKind, Key)>>,
    history: VecDeque<Arc<StoreEvent>>,
    window: usize,
    compacted: u64,
}

/// The store. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<StoreEvent>>,
}

/// The uid of an object.
pub fn uid_of(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/uid").and_then(Value::as_str)
}

/// The revision stamped on an object.
pub fn rv_of(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

// The string-valued labels of an object, in place (admission rejects other values).
fn label_pairs(obj: &Value) -> impl Iterator<Item = (&String, &str)> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|v| (k, v)))
}

fn label_of<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/labels").and_then(|l| l.get(key)).and_then(Value::as_str)
}

// Moves `key` in the label index from the labels of `old` to those of `new`.
fn reindex_labels(index: &mut LabelIndex, key: &Key, old: Option<&Value>, new: Option<&Value>) {
    if let Some(old) = old {
        for (k, v) in label_pairs(old) {
            if new.and_then(|n| label_of(n, k)) == Some(v) {
                continue;
            }
            if let Some(values) = index.get_mut(k.as_str()) {
                if let Some(keys) = values.get_mut(v) {
                    keys.remove(key);
                    if keys.is_empty() {
                        values.remove(v);
                    }
                }
                if values.is_empty() {
                    index.remove(k.as_str());
                }
            }
        }
    }
    if let Some(new) = new {
        for (k, v) in label_pairs(new) {
            if old.and_then(|o| label_of(o, k)) == Some(v) {
                continue;
            }
            index
                .entry(k.clone())
                .or_default()
                .entry(v.to_owned())
                .or_default()
                .insert(key.clone());
        }
    }
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether an update leaves the object ready to be removed (deleting, no finalizers, no grace).
pub fn should_delete_during_update(obj: &Value) -> bool {
    let meta = &obj["metadata"];
    let deleting = meta.get("deletionTimestamp").is_some_and(|v| !v.is_null());
    // Namespaces are also held by `spec.finalizers` (the namespace controller's).
    let no_finalizers = meta.get("finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty)
        && obj.pointer("/spec/finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty);
    let grace = meta.get("deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
    deleting && no_finalizers && grace == 0
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

impl Store {
    /// An empty store keeping at most `window` events of history.
    pub fn new(window: usize) -> Self {
        let (tx, _) = broadcast::channel(BROADCAST_CAPACITY);
        Self {
            inner: Mutex::new(Inner {
                rv: 0,
                tables: Default::default(),
                labels: Default::default(),
                uids: HashMap::new(),
                dependents: HashMap::new(),
                history: VecDeque::new(),
                window: window.max(1),
                compacted: 0,
            }),
            tx,
        }
    }

    /// The latest revision.
    pub fn current_rv(&self) -> u64 {
        self.inner.lock().rv
    }

    /// The lowest revision a watch may start from.
    pub fn compacted_rv(&self) -> u64 {
        self.inner.lock().compacted
    }

    /// Drops all history: watches from any revision before now get 410.
    pub fn compact(&self) {
        let mut inner = self.inner.lock();
        inner.history.clear();
        inner.compacted = inner.rv;
    }

    /// Subscribes to every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<StoreEvent>> {
        self.tx.subscribe()
    }

    /// Reads one object.
    pub fn get(&self, kind: StoreKind, key: &Key) -> Option<Arc<Obj>> {
        self.inner.lock().tables[kind.index()].get(key).cloned()
    }

    /// Every object of a kind, in key order (for the small cluster-scoped tables admission
    /// reads, such as PriorityClasses).
    pub fn all(&self, kind: StoreKind) -> Vec<Arc<Obj>> {
        self.inner.lock().tables[kind.index()].values().cloned().collect()
    }

    /// Looks an object up by uid.
    pub fn get_by_uid(&self, uid: &str) -> Option<(StoreKind, Arc<Obj>)> {
        let inner = self.inner.lock();
        let (kind, key) = inner.uids.get(uid)?;
        inner.tables[kind.index()].get(key).map(|o| (*kind, o.clone()))
    }

    /// Keys of the objects whose ownerReferences name `uid`.
    pub fn dependents_of(&self, uid: &str) -> Vec<(StoreKind, Key)> {
        let inner = self.inner.lock();
        let mut out: Vec<_> =
            inner.dependents.get(uid).map(|s| s.iter().cloned().collect()).unwrap_or_default();
        out.sort();
        out
    }

    /// Every uid some object names as its owner.
    pub fn owner_uids(&self) -> Vec<String> {
        self.inner.lock().dependents.keys().cloned().collect()
    }

    /// Number of objects of a kind in a namespace (all namespaces when `None`).
    pub fn count(&self, kind: StoreKind, ns: Option<&str>) -> usize {
        let inner = self.inner.lock();
        match ns {
            None => inner.tables[kind.index()].len(),
            Some(ns) => in_namespace(&inner.tables[kind.index()], ns).count(),
        }
    }

    /// Lists one page of the objects `q` names in key order, keeping those `keep` accepts.
    pub fn list(
        &self,
        q: ListQuery<'_>,
        keep: &dyn Fn(&Value) -> bool,
    ) -> Result<ListPage, ApiError> {
        let ListQuery { kind, ns, after, limit, at, required } = q;
        let inner = self.inner.lock();
        // Only keys changed after an exact revision differ from the latest state: their state
        // at that revision is overlaid on the latest candidates instead of copying the table.
        let changed = match at {
            ListAt::Latest => None,
            ListAt::Exact(rv) => {
                if rv < inner.compacted {
                    return Err(ApiError::expired(
                        "The resourceVersion for the provided list is too old.",
                    ));
                }
                if rv > inner.rv {
                    return Err(ApiError::too_large_rv(rv, inner.rv));
                }
                Some((rv, changed_since(&inner, kind, rv)))
            }
        };
        let table = &inner.tables[kind.index()];
        let start = start_bound(ns, after);
        let in_ns = |k: &Key| ns.is_none_or(|n| k.0 == n);
        // Candidates at the latest revision, in key order.
        let latest: Box<dyn Iterator<Item = (&Key, &Arc<Obj>)> + '_> = match required {
            None => Box::new(table.range((start.clone(), Bound::Unbounded))),
            Some((lk, lv)) => {
                let keys = inner.labels[kind.index()].get(lk).and_then(|values| values.get(lv));
                Box::new(
                    keys.into_iter()
                        .flat_map(|keys| keys.range((start.clone(), Bound::Unbounded)))
                        .filter_map(|k| table.get_key_value(k)),
                )
            }
        };
        let latest = latest.take_while(|(k, _)| in_ns(k));
        match &changed {
            None => Ok(page(latest, limit, keep, inner.rv)),
            Some((rv, changed)) => {
                let then = changed
                    .range((start.clone(), Bound::Unbounded))
                    .take_while(|(k, _)| in_ns(k))
                    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)));
                let unchanged = latest.filter(|(k, _)| !changed.contains_key(*k));
                Ok(page(merge_by_key(unchanged, then), limit, keep, *rv))
            }
        }
    }

    /// Starts a watch: from now (with the current objects as initial ADDED events) or after a
    /// revision (replaying retained events). Errors with the compaction revision when too old.
    pub fn watch(
        &self,
        kind: StoreKind,
        ns: Option<&str>,
        after: Option<u64>,
    ) -> Result<WatchStart, u64> {
        let inner = self.inner.lock();
        // Subscribing under the lock: no change can fall between the snapshot and the stream.
        let rx = self.tx.subscribe();
        match after {
            None => {
                let table = &inner.tables[kind.index()];
                let initial = match ns {
                    Some(ns) => in_namespace(table, ns).map(|(_, v)| v.clone()).collect(),
                    None => table.values().cloned().collect(),
                };
                Ok(WatchStart { initial, replay: Vec::new(), rx, rv: inner.rv })
            }
            Some(rv) => {
                if rv < inner.compacted {
                    return Err(inner.compacted);
                }
                let replay =
                    inner.history.iter().filter(|e| e.rv > rv && e.kind == kind).cloned().collect();
                Ok(WatchStart { initial: Vec::new(), replay, rx, rv: inner.rv })
            }
        }
    }

    /// Runs `f` on the current object (or `None`) under the store lock and applies its decision.
    pub fn mutate<R>(
        &self,
        kind: StoreKind,
        key: &Key,
        f: impl FnOnce(Option<&Arc<Obj>>, &View<'_>) -> Result<(Mutation, R), ApiError>,
    ) -> Result<(Written, R), ApiError> {
        let mut inner = self.inner.lock();
        let current = inner.tables[kind.index()].get(key).cloned();
        let (mutation, r) = f(current.as_ref(), &View { inner: &inner })?;
        let written = match mutation {
            Mutation::Unchanged => Written::Unchanged(current),
            Mutation::Put(obj) if should_delete_during_update(&obj) && current.is_some() => {
                Written::Deleted(self.remove(&mut inner, kind, key, Arc::new(Obj::new(obj))))
            }
            Mutation::Put(obj) => self.put(&mut inner, kind, key, obj, current),
            Mutation::PutThenRemove(obj) => {
                let written = self.put(&mut inner, kind, key, obj, current);
                let obj = match written {
                    Written::Created(o) | Written::Updated(o) => o,
                    other => return Ok((other, r)),
                };
                Written::Deleted(self.remove(&mut inner, kind, key, obj))
            }
            Mutation::Remove => match current {
                Some(cur) => Written::Deleted(self.remove(&mut inner, kind, key, cur)),
                None => Written::Unchanged(None),
            },
        };
        Ok((written, r))
    }

    fn put(
        &self,
        inner: &mut Inner,
        kind: StoreKind,
        key: &Key,
        mut obj: Value,
        prev: Option<Arc<Obj>>,
    ) -> Written {
        inner.rv += 1;
        let rv = inner.rv;
        set_rv(&mut obj, rv);
        let obj = Arc::new(Obj::new(obj));
        let uid = uid_of(&obj).unwrap_or_default().to_owned();
        let new_owners = owner_uids(&obj);
        let old_owners = prev.as_deref().map(|p| owner_uids(p)).unwrap_or_default();
        for o in old_owners.iter().filter(|o| !new_owners.contains(o)) {
            if let Some(set) = inner.dependents.get_mut(o) {
                set.remove(&(kind, key.clone()));
                if set.is_empty() {
                    inner.dependents.remove(o);
                }
            }
        }
        for o in new_owners.iter().filter(|o| !old_owners.contains(o)) {
            inner.dependents.entry(o.clone()).or_default().insert((kind, key.clone()));
        }
        reindex_labels(
            &mut inner.labels[kind.index()],
            key,
            prev.as_deref().map(Obj::value),
            Some(obj.value()),
        );
        inner.tables[kind.index()].insert(key.clone(), obj.clone());
        let typ = if prev.is_some() { EventType::Modified } else { EventType::Added };
        if prev.is_none() && !uid.is_empty() {
            inner.uids.insert(uid, (kind, key.clone()));
        }
        self.record(
            inner,
            StoreEvent { rv, kind, typ, key: key.clone(), object: obj.clone(), prev },
        );
        if typ == EventType::Added { Written::Created(obj) } else { Written::Updated(obj) }
    }

    fn remove(&self, inner: &mut Inner, kind: StoreKind, key: &Key, last: Arc<Obj>) -> Arc<Obj> {
        inner.rv += 1;
        let rv = inner.rv;
        let prev = inner.tables[kind.index()].remove(key);
        reindex_labels(&mut inner.labels[kind.index()], key, prev.as_deref().map(Obj::value), None);
        if let Some(uid) = uid_of(&last) {
            inner.uids.remove(uid);
        }
        for o in prev.as_deref().map(|p| owner_uids(p)).unwrap_or_default() {
            if let Some(set) = inner.dependents.get_mut(&o) {
                set.remove(&(kind, key.clone()));
                if set.is_empty() {
                    inner.dependents.remove(&o);
                }
            }
        }
        let mut obj = last.value().clone();
        set_rv(&mut obj, rv);
        let obj = Arc::new(Obj::new(obj));
        self.record(
            inner,
            StoreEvent {
                rv,
                kind,
                typ: EventType::Deleted,
                key: key.clone(),
                object: obj.clone(),
                prev,
            },
        );
        obj
    }

    fn record(&self, inner: &mut Inner, event: StoreEvent) {
        let event = Arc::new(event);
        inner.history.push_back(event.clone());
        while inner.history.len() > inner.window {
            if let Some(old) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        // No receivers is fine: nobody watches yet.
        let _ = self.tx.send(event);
    }
}

// The objects of one namespace (keys sort by namespace first, so this is one range).
fn in_namespace<'a>(
    table: &'a BTreeMap<Key, Arc<Obj>>,
    ns: &'a str,
) -> impl Iterator<Item = (&'a Key, &'a Arc<Obj>)> + 'a {
    table
        .range((Bound::Included((ns.to_owned(), String::new())), Bound::Unbounded))
        .take_while(move |(k, _)| k.0 == ns)
}

// Where a list starts: after the continue key, but never before its namespace's first key (a
// token from another namespace must not make the scan stop early).
fn start_bound(ns: Option<&str>, after: Option<&Key>) -> Bound<Key> {
    let first = ns.map(|n| (n.to_owned(), String::new()));
    match (after, first) {
        (Some(a), Some(f)) if *a < f => Bound::Included(f),
        (Some(a), _) => Bound::Excluded(a.clone()),
        (None, Some(f)) => Bound::Included(f),
        (None, None) => Bound::Unbounded,
    }
}

// Two key-ordered streams with distinct keys merged into one key-ordered stream.
fn merge_by_key<'a>(
    a: impl Iterator<Item = (&'a Key, &'a Arc<Obj>)>,
    b: impl Iterator<Item = (&'a Key, &'a Arc<Obj>)>,
) -> impl Iterator<Item = (&'a Key, &'a Arc<Obj>)> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if x.0 <= y.0 => a.next(),
        (Some(_), Some(_)) => b.next(),
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

fn page<'a>(
    iter: impl Iterator<Item = (&'a Key, &'a Arc<Obj>)>,
    limit: Option<usize>,
    keep: &dyn Fn(&Value) -> bool,
    rv: u64,
) -> ListPage {
    let mut items = Vec::new();
    let mut last_key = None;
    let mut iter = iter.peekable();
    while let Some((k, v)) = iter.next() {
        if limit.is_some_and(|l| items.len() >= l) {
            // Peeked one more: there is a next page.
            let remaining = 1 + iter.count();
            return ListPage { items, rv, next: last_key, remaining };
        }
        if keep(v) {
            items.push(v.clone());
            last_key = Some(k.clone());
        } else if limit.is_some() {
            last_key = Some(k.clone());
        }
    }
    ListPage { items, rv, next: None, remaining: 0 }
}

// The state at revision `rv` of every key of `kind` changed after it (`None`: absent then),
// from the retained events: walking back, the oldest change after `rv` decides.
fn changed_since(inner: &Inner, kind: StoreKind, rv: u64) -> BTreeMap<Key, Option<Arc<Obj>>> {
    let mut changed = BTreeMap::new();
    for e in inner.history.iter().rev().take_while(|e| e.rv > rv) {
        if e.kind != kind {
            continue;
        }
        let then = match e.typ {
            EventType::Added => None,
            EventType::Modified | EventType::Deleted => e.prev.clone(),
        };
        changed.insert(e.key.clone(), then);
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(ns: &str, name: &str) -> Key {
        (ns.to_owned(), name.to_owned())
    }

    /// A store keeping `window` events, after `writes` of `(namespace, name, v)` in order.
    fn store_with(window: usize, writes: &[(&str, &str, i64)]) -> Store {
        let store = Store::new(window);
        for (ns, name, v) in writes {
            put(&store, ns, name, *v);
        }
        store
    }

    fn put(store: &Store, ns: &str, name: &str, v: i64) -> Written {
        store
            .mutate(StoreKind::Pod, &key(ns, name), |_, _| {
                Ok((Mutation::Put(json!({"metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}")}, "v": v})), ()))
            })
            .unwrap()
            .0
    }

    #[test]
    fn rv_is_global_and_stamped() {
        let store = Store::new(100);
        put(&store, "a", "x", 1);
        put(&store, "b", "y", 1);
        let Written::Updated(o) = put(&store, "a", "x", 2) else { panic!("expected update") };
        assert_eq!(rv_of(&o), 3);
        assert_eq!(store.current_rv(), 3);
    }

    #[test]
    fn list_filters_namespace_and_pages() {
        let store = Store::new(100);
        for i in 0..5 {
            put(&store, "a", &format!("p{i}"), i);
        }
        put(&store, "b", "q", 0);
        let p =
            store.list(ListQuery::of(StoreKind::Pod, Some("a")).limit(Some(2)), &|_| true).unwrap();
        assert_eq!(p.items.len(), 2);
        assert_eq!(p.next, Some(key("a", "p1")));
        let q = ListQuery::of(StoreKind::Pod, Some("a")).after(p.next.as_ref()).limit(Some(10));
        let p2 = store.list(q, &|_| true).unwrap();
        assert_eq!(p2.items.len(), 3);
        assert!(p2.next.is_none());
        let all = store.list(ListQuery::of(StoreKind::Pod, None), &|_| true).unwrap();
        assert_eq!(all.items.len(), 6);
    }

    #[test]
    fn exact_list_reads_history_and_expires() {
        let store = store_with(100, &[("a", "x", 1), ("a", "y", 1), ("a", "x", 2)]);
        let at_1 = ListQuery::of(StoreKind::Pod, None).at(ListAt::Exact(1));
        let p = store.list(at_1, &|_| true).unwrap();
        assert_eq!(p.items.len(), 1);
        assert_eq!(p.items[0]["v"], 1);
        store.compact();
        let err = store.list(at_1, &|_| true).unwrap_err();
        assert_eq!(err.code, 410);
    }

    #[test]
    fn watch_replays_after_rv_and_expires_beyond_window() {
        let store = store_with(2, &[("a", "x", 1), ("a", "x", 2), ("a", "x", 3)]);
        assert_eq!(store.watch(StoreKind::Pod, None, Some(0)).unwrap_err(), 1);
        let w = store.watch(StoreKind::Pod, None, Some(1)).unwrap();
        assert_eq!(w.replay.iter().map(|e| e.rv).collect::<Vec<_>>(), vec![2, 3]);
    }

    fn put_labeled(store: &Store, ns: &str, name: &str, labels: Value) {
        store
            .mutate(StoreKind::Pod, &key(ns, name), |_, _| {
                let obj = json!({"metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}"), "labels": labels}});
                Ok((Mutation::Put(obj), ()))
            })
            .unwrap();
    }

    fn names(p: &ListPage) -> Vec<String> {
        p.items.iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_owned()).collect()
    }

    #[test]
    fn label_index_follows_changes_and_matches_a_scan() {
        let store = Store::new(1000);
        for (i, ns) in ["a", "b", "c"].iter().enumerate() {
            for j in 0..6 {
                put_labeled(
                    &store,
                    ns,
                    &format!("p{j}"),
                    json!({"u": format!("{}", j % 3), "i": i.to_string()}),
                );
            }
        }
        let before = store.current_rv();
        // Relabel, unlabel and delete some objects after `before`.
        put_labeled(&store, "b", "p0", json!({"u": "2"}));
        put_labeled(&store, "b", "p1", json!({}));
        put_labeled(&store, "b", "p9", json!({"u": "0"}));
        store.mutate(StoreKind::Pod, &key("b", "p3"), |_, _| Ok((Mutation::Remove, ()))).unwrap();
        let has = |v: &'static str| move |o: &Value| o["metadata"]["labels"]["u"] == v;
        for at in [ListAt::Latest, ListAt::Exact(before)] {
            for ns in [None, Some("a"), Some("b"), Some("c"), Some("bb")] {
                for v in ["0", "1", "2", "9"] {
                    let keep = has(v);
                    let q = ListQuery::of(StoreKind::Pod, ns).at(at);
                    let scan = store.list(q, &keep).unwrap();
                    let idx = store.list(q.labeled(Some(("u", v))), &keep).unwrap();
                    assert_eq!(names(&idx), names(&scan), "{at:?} {ns:?} u={v}");
                    assert_eq!(idx.rv, scan.rv);
                }
            }
        }
        let u0 = ListQuery::of(StoreKind::Pod, Some("b")).labeled(Some(("u", "0")));
        let now = store.list(u0, &has("0")).unwrap();
        assert_eq!(names(&now), vec!["p9"]);
        let then = store.list(u0.at(ListAt::Exact(before)), &has("0")).unwrap();
        assert_eq!(names(&then), vec!["p0", "p3"]);
        // Paging through the index: two at a time, continuing after the last key.
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let q = ListQuery::of(StoreKind::Pod, None).labeled(Some(("u", "1")));
            let p = store.list(q.after(after.as_ref()).limit(Some(2)), &has("1")).unwrap();
            seen.extend(names(&p));
            match p.next {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        assert_eq!(seen, vec!["p1", "p4", "p4", "p1", "p4"]);
    }

    #[test]
    fn namespace_scans_stop_at_the_namespace_end() {
        let store = store_with(100, &[("a", "x", 1), ("b", "y", 1), ("b", "z", 1)]);
        assert_eq!(store.count(StoreKind::Pod, Some("a")), 1);
        assert_eq!(store.count(StoreKind::Pod, Some("b")), 2);
        assert_eq!(store.count(StoreKind::Pod, Some("c")), 0);
        // A continue key from an earlier namespace still lists the whole namespace.
        let from_a = key("a", "x");
        let p = store
            .list(ListQuery::of(StoreKind::Pod, Some("b")).after(Some(&from_a)), &|_| true)
            .unwrap();
        assert_eq!(names(&p), vec!["y", "z"]);
        let w = store.watch(StoreKind::Pod, Some("a"), None).unwrap();
        assert_eq!(w.initial.len(), 1);
    }

    #[test]
    fn deletion_on_update_and_dependents() {
        let store = Store::new(100);
        store
            .mutate(StoreKind::Pod, &key("a", "d"), |_, _| {
                Ok((Mutation::Put(json!({"metadata": {"name": "d", "uid": "u-d", "ownerReferences": [{"uid": "owner"}]}})), ()))
            })
            .unwrap();
        assert_eq!(store.dependents_of("owner"), vec![(StoreKind::Pod, key("a", "d"))]);
        let (w, ()) = store
            .mutate(StoreKind::Pod, &key("a", "d"), |_, _| {
                Ok((Mutation::Put(json!({"metadata": {"name": "d", "uid": "u-d", "deletionTimestamp": "2025-01-01T00:00:00Z"}})), ()))
            })
            .unwrap();
        assert!(matches!(w, Written::Deleted(_)));
        assert!(store.dependents_of("owner").is_empty());
        assert!(store.get_by_uid("u-d").is_none());
    }
}
