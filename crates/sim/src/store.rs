//! The object store: one global resourceVersion counter, one ordered map per kind, an event
//! history for watches (bounded, compactable) and a broadcast of every change.
//!
//! Every write runs a caller's closure under the store lock, so read-check-write sequences
//! (preconditions, admission on the current object) are atomic without retries.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

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
    pub object: Arc<Value>,
    /// Previous state (MODIFIED and DELETED).
    pub prev: Option<Arc<Value>>,
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
    Unchanged(Option<Arc<Value>>),
    /// Created.
    Created(Arc<Value>),
    /// Replaced.
    Updated(Arc<Value>),
    /// Removed; the last state with the deletion revision.
    Deleted(Arc<Value>),
}

/// Where a list reads from.
#[derive(Debug, Clone, Copy)]
pub enum ListAt {
    /// The latest state.
    Latest,
    /// The state at exactly this revision (needs history).
    Exact(u64),
}

/// A page of a list.
#[derive(Debug)]
pub struct ListPage {
    /// Items in key order.
    pub items: Vec<Arc<Value>>,
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
    pub initial: Vec<Arc<Value>>,
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
    pub fn namespace(&self, name: &str) -> Option<&Arc<Value>> {
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

#[derive(Debug)]
struct Inner {
    rv: u64,
    tables: [BTreeMap<Key, Arc<Value>>; 5],
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
    pub fn get(&self, kind: StoreKind, key: &Key) -> Option<Arc<Value>> {
        self.inner.lock().tables[kind.index()].get(key).cloned()
    }

    /// Looks an object up by uid.
    pub fn get_by_uid(&self, uid: &str) -> Option<(StoreKind, Arc<Value>)> {
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
            Some(ns) => range(&inner.tables[kind.index()], ns, None).count(),
        }
    }

    /// Lists one page of objects in key order, from `after` (exclusive), keeping those `keep`
    /// accepts, at most `limit` of them.
    pub fn list(
        &self,
        kind: StoreKind,
        ns: Option<&str>,
        after: Option<&Key>,
        limit: Option<usize>,
        at: ListAt,
        keep: &dyn Fn(&Value) -> bool,
    ) -> Result<ListPage, ApiError> {
        let inner = self.inner.lock();
        let table = &inner.tables[kind.index()];
        match at {
            ListAt::Latest => Ok(page(
                range(table, ns.unwrap_or(""), after).filter(|(k, _)| ns.is_none_or(|n| k.0 == n)),
                limit,
                keep,
                inner.rv,
            )),
            ListAt::Exact(rv) => {
                if rv < inner.compacted {
                    return Err(ApiError::expired(
                        "The resourceVersion for the provided list is too old.",
                    ));
                }
                if rv > inner.rv {
                    return Err(ApiError::too_large_rv(rv, inner.rv));
                }
                let snapshot = snapshot_at(&inner, kind, rv);
                drop(inner);
                Ok(page(
                    range(&snapshot, ns.unwrap_or(""), after)
                        .filter(|(k, _)| ns.is_none_or(|n| k.0 == n)),
                    limit,
                    keep,
                    rv,
                ))
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
                let initial = range(table, ns.unwrap_or(""), None)
                    .filter(|(k, _)| ns.is_none_or(|n| k.0 == n))
                    .map(|(_, v)| v.clone())
                    .collect();
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
        f: impl FnOnce(Option<&Arc<Value>>, &View<'_>) -> Result<(Mutation, R), ApiError>,
    ) -> Result<(Written, R), ApiError> {
        let mut inner = self.inner.lock();
        let current = inner.tables[kind.index()].get(key).cloned();
        let (mutation, r) = f(current.as_ref(), &View { inner: &inner })?;
        let written = match mutation {
            Mutation::Unchanged => Written::Unchanged(current),
            Mutation::Put(obj) if should_delete_during_update(&obj) && current.is_some() => {
                Written::Deleted(self.remove(&mut inner, kind, key, Arc::new(obj)))
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
        prev: Option<Arc<Value>>,
    ) -> Written {
        inner.rv += 1;
        let rv = inner.rv;
        set_rv(&mut obj, rv);
        let obj = Arc::new(obj);
        let uid = uid_of(&obj).unwrap_or_default().to_owned();
        let new_owners = owner_uids(&obj);
        let old_owners = prev.as_deref().map(owner_uids).unwrap_or_default();
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

    fn remove(
        &self,
        inner: &mut Inner,
        kind: StoreKind,
        key: &Key,
        last: Arc<Value>,
    ) -> Arc<Value> {
        inner.rv += 1;
        let rv = inner.rv;
        let prev = inner.tables[kind.index()].remove(key);
        if let Some(uid) = uid_of(&last) {
            inner.uids.remove(uid);
        }
        for o in prev.as_deref().map(owner_uids).unwrap_or_default() {
            if let Some(set) = inner.dependents.get_mut(&o) {
                set.remove(&(kind, key.clone()));
                if set.is_empty() {
                    inner.dependents.remove(&o);
                }
            }
        }
        let mut obj = (*last).clone();
        set_rv(&mut obj, rv);
        let obj = Arc::new(obj);
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

fn range<'a>(
    table: &'a BTreeMap<Key, Arc<Value>>,
    ns: &str,
    after: Option<&Key>,
) -> impl Iterator<Item = (&'a Key, &'a Arc<Value>)> + 'a {
    let start = match after {
        Some(k) => Bound::Excluded(k.clone()),
        None => Bound::Included((ns.to_owned(), String::new())),
    };
    table.range((start, Bound::Unbounded))
}

fn page<'a>(
    iter: impl Iterator<Item = (&'a Key, &'a Arc<Value>)>,
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

// The table of `kind` as it was at revision `rv`, rebuilt by undoing retained events after it.
fn snapshot_at(inner: &Inner, kind: StoreKind, rv: u64) -> BTreeMap<Key, Arc<Value>> {
    let mut table = inner.tables[kind.index()].clone();
    for e in inner.history.iter().rev().take_while(|e| e.rv > rv) {
        if e.kind != kind {
            continue;
        }
        match (&e.typ, &e.prev) {
            (EventType::Added, _) => {
                table.remove(&e.key);
            }
            (_, Some(prev)) => {
                table.insert(e.key.clone(), prev.clone());
            }
            (_, None) => {}
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(ns: &str, name: &str) -> Key {
        (ns.to_owned(), name.to_owned())
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
        let p = store
            .list(StoreKind::Pod, Some("a"), None, Some(2), ListAt::Latest, &|_| true)
            .unwrap();
        assert_eq!(p.items.len(), 2);
        assert_eq!(p.next, Some(key("a", "p1")));
        let p2 = store
            .list(StoreKind::Pod, Some("a"), p.next.as_ref(), Some(10), ListAt::Latest, &|_| true)
            .unwrap();
        assert_eq!(p2.items.len(), 3);
        assert!(p2.next.is_none());
        let all = store.list(StoreKind::Pod, None, None, None, ListAt::Latest, &|_| true).unwrap();
        assert_eq!(all.items.len(), 6);
    }

    #[test]
    fn exact_list_reads_history_and_expires() {
        let store = Store::new(100);
        put(&store, "a", "x", 1);
        put(&store, "a", "y", 1);
        put(&store, "a", "x", 2);
        let p = store.list(StoreKind::Pod, None, None, None, ListAt::Exact(1), &|_| true).unwrap();
        assert_eq!(p.items.len(), 1);
        assert_eq!(p.items[0]["v"], 1);
        store.compact();
        let err =
            store.list(StoreKind::Pod, None, None, None, ListAt::Exact(1), &|_| true).unwrap_err();
        assert_eq!(err.code, 410);
    }

    #[test]
    fn watch_replays_after_rv_and_expires_beyond_window() {
        let store = Store::new(2);
        put(&store, "a", "x", 1);
        put(&store, "a", "x", 2);
        put(&store, "a", "x", 3);
        assert_eq!(store.watch(StoreKind::Pod, None, Some(0)).unwrap_err(), 1);
        let w = store.watch(StoreKind::Pod, None, Some(1)).unwrap();
        assert_eq!(w.replay.iter().map(|e| e.rv).collect::<Vec<_>>(), vec![2, 3]);
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
