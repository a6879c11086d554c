//! The controllers a real cluster runs beside the API server and whose effects clients observe:
//! the ownerReference garbage collector (Background, Foreground, Orphan) and the namespace
//! controller (deletes a terminating namespace's content, then the namespace).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::registry::{self, DeleteOpts, FOREGROUND_FINALIZER, ORPHAN_FINALIZER, Propagation};
use crate::resources::{RESOURCES, StoreKind};
use crate::store::{EventType, Key, ListQuery, Mutation, Store, StoreEvent, uid_of};

/// Period of the full sweep that repairs anything an event-driven step missed (a lagging
/// subscription, an owner deleted while its dependents were being created).
const SWEEP_PERIOD: Duration = Duration::from_secs(2);

fn key_of(obj: &Value) -> Key {
    let m = &obj["metadata"];
    (
        m["namespace"].as_str().unwrap_or_default().to_owned(),
        m["name"].as_str().unwrap_or_default().to_owned(),
    )
}

// Field reads here avoid `Value::pointer`, which allocates per path token: the periodic sweep
// calls them for every stored object under the store lock.
fn has_finalizer(obj: &Value, f: &str) -> bool {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x == f))
}

fn deleting(obj: &Value) -> bool {
    obj.get("metadata").and_then(|m| m.get("deletionTimestamp")).is_some_and(|v| !v.is_null())
}

fn owner_refs(obj: &Value) -> Vec<Value> {
    obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default()
}

// Whether the ref points at a kind this server serves (refs to unknown kinds are left alone,
// as the real GC cannot resolve them either).
fn served_ref(r: &Value) -> bool {
    let av = r["apiVersion"].as_str().unwrap_or_default();
    let kind = r["kind"].as_str().unwrap_or_default();
    RESOURCES.iter().any(|res| res.kind == kind && res.api_version() == av)
}

/// Runs the GC and namespace controller until shutdown.
pub async fn run(store: Arc<Store>, shutdown: CancellationToken) {
    let mut rx = store.subscribe();
    let mut tick = tokio::time::interval(SWEEP_PERIOD);
    loop {
        tokio::select! {
            r = rx.recv() => match r {
                Ok(e) => on_event(&store, &e, Timestamp::now()),
                Err(RecvError::Lagged(_)) => sweep(&store, Timestamp::now()),
                Err(RecvError::Closed) => break,
            },
            _ = tick.tick() => sweep(&store, Timestamp::now()),
            _ = shutdown.cancelled() => break,
        }
    }
}

/// Reacts to one change.
pub fn on_event(store: &Store, e: &StoreEvent, now: Timestamp) {
    let obj = &*e.object;
    match e.typ {
        EventType::Deleted => {
            if let Some(uid) = uid_of(obj) {
                for (kind, key) in store.dependents_of(uid) {
                    collect_if_orphaned(store, kind, &key, now);
                }
            }
            for r in owner_refs(obj) {
                if let Some(uid) = r["uid"].as_str()
                    && let Some((kind, owner)) = store.get_by_uid(uid)
                    && deleting(&owner)
                    && has_finalizer(&owner, FOREGROUND_FINALIZER)
                {
                    foreground(store, kind, &owner, now);
                }
            }
            if e.kind.namespaced() {
                let ns_key: Key = (String::new(), e.key.0.clone());
                if store.get(StoreKind::Namespace, &ns_key).is_some_and(|n| deleting(&n)) {
                    namespace_sweep(store, &e.key.0, now);
                }
            }
        }
        EventType::Added | EventType::Modified => {
            if deleting(obj) {
                handle_deleting(store, e.kind, obj, now);
            }
            if e.typ == EventType::Added && !owner_refs(obj).is_empty() {
                collect_if_orphaned(store, e.kind, &e.key, now);
            }
        }
    }
}

fn handle_deleting(store: &Store, kind: StoreKind, obj: &Value, now: Timestamp) {
    if kind == StoreKind::Namespace {
        namespace_sweep(store, obj["metadata"]["name"].as_str().unwrap_or_default(), now);
        return;
    }
    if has_finalizer(obj, ORPHAN_FINALIZER) {
        orphan(store, kind, obj);
    }
    if has_finalizer(obj, FOREGROUND_FINALIZER) {
        foreground(store, kind, obj, now);
    }
}

// Orphan: drop the owner's entry from every dependent, then the owner's finalizer.
fn orphan(store: &Store, kind: StoreKind, owner: &Value) {
    let Some(uid) = uid_of(owner) else { return };
    for (dkind, dkey) in store.dependents_of(uid) {
        let r = store.mutate(dkind, &dkey, |cur, _| {
            let Some(cur) = cur else { return Ok((Mutation::Unchanged, ())) };
            let mut d = (**cur).clone();
            let refs: Vec<Value> = owner_refs(&d).into_iter().filter(|r| r["uid"] != uid).collect();
            let m = d["metadata"].as_object_mut().expect("metadata");
            if refs.is_empty() {
                m.remove("ownerReferences");
            } else {
                m.insert("ownerReferences".into(), Value::Array(refs));
            }
            Ok((Mutation::Put(d), ()))
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "orphaning a dependent failed");
            return;
        }
    }
    let _ = registry::remove_finalizer(store, kind, &key_of(owner), ORPHAN_FINALIZER);
}

// Foreground: delete dependents (foreground too); when none blocks any more, release the owner.
fn foreground(store: &Store, kind: StoreKind, owner: &Value, now: Timestamp) {
    let Some(uid) = uid_of(owner) else { return };
    let mut blocking = false;
    for (dkind, dkey) in store.dependents_of(uid) {
        let Some(dep) = store.get(dkind, &dkey) else { continue };
        let blocks = owner_refs(&dep)
            .iter()
            .any(|r| r["uid"] == uid && r["blockOwnerDeletion"] == json!(true));
        blocking |= blocks;
        if !deleting(&dep) {
            let opts =
                DeleteOpts { propagation: Some(Propagation::Foreground), ..Default::default() };
            let ns = (!dkey.0.is_empty()).then_some(dkey.0.as_str());
            if let Err(e) = registry::delete(store, dkind.resource(), ns, &dkey.1, &opts, now)
                && e.code != 404
            {
                tracing::warn!(error = %e, "foreground deletion of a dependent failed");
            }
        }
    }
    if !blocking {
        let _ = registry::remove_finalizer(store, kind, &key_of(owner), FOREGROUND_FINALIZER);
    }
}

// Background collection: a dependent whose owners are all gone is deleted; one with some owners
// left loses the references to the missing ones.
fn collect_if_orphaned(store: &Store, kind: StoreKind, key: &Key, now: Timestamp) {
    let Some(obj) = store.get(kind, key) else { return };
    let refs = owner_refs(&obj);
    let missing: Vec<&Value> = refs
        .iter()
        .filter(|r| {
            served_ref(r) && r["uid"].as_str().is_some_and(|u| store.get_by_uid(u).is_none())
        })
        .collect();
    if missing.is_empty() {
        return;
    }
    if missing.len() == refs.len() {
        if deleting(&obj) {
            return;
        }
        let ns = (!key.0.is_empty()).then_some(key.0.as_str());
        let opts = DeleteOpts { propagation: Some(Propagation::Background), ..Default::default() };
        if let Err(e) = registry::delete(store, kind.resource(), ns, &key.1, &opts, now)
            && e.code != 404
        {
            tracing::warn!(error = %e, "garbage-collecting a dependent failed");
        }
        return;
    }
    let gone: Vec<Value> = missing.iter().map(|r| r["uid"].clone()).collect();
    let _ = store.mutate(kind, key, |cur, _| {
        let Some(cur) = cur else { return Ok((Mutation::Unchanged, ())) };
        let mut d = (**cur).clone();
        let kept: Vec<Value> =
            owner_refs(&d).into_iter().filter(|r| !gone.contains(&r["uid"])).collect();
        d["metadata"]["ownerReferences"] = Value::Array(kept);
        Ok((Mutation::Put(d), ()))
    });
}

// Namespace controller: delete everything inside, then release the namespace.
fn namespace_sweep(store: &Store, ns: &str, now: Timestamp) {
    let mut left = 0;
    for kind in StoreKind::ALL.into_iter().filter(|k| k.namespaced()) {
        let Ok(page) = store.list(ListQuery::of(kind, Some(ns)), &|_| true) else {
            continue;
        };
        left += page.items.len();
        for obj in page.items.iter().filter(|o| !deleting(o)) {
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            if let Err(e) = registry::delete(
                store,
                kind.resource(),
                Some(ns),
                name,
                &DeleteOpts::default(),
                now,
            ) && e.code != 404
            {
                tracing::warn!(error = %e, namespace = ns, "namespace cleanup failed");
            }
        }
    }
    if left == 0
        || StoreKind::ALL
            .into_iter()
            .filter(|k| k.namespaced())
            .all(|k| store.count(k, Some(ns)) == 0)
    {
        let key: Key = (String::new(), ns.to_owned());
        let _ = store.mutate(StoreKind::Namespace, &key, |cur, _| {
            let Some(cur) = cur else { return Ok((Mutation::Unchanged, ())) };
            let mut n = (**cur).clone();
            let fins: Vec<Value> = n
                .pointer("/spec/finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|f| f != "kubernetes")
                .collect();
            if fins.is_empty() {
                if let Some(spec) = n.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("finalizers");
                }
            } else {
                n["spec"]["finalizers"] = Value::Array(fins);
            }
            if n == *cur.value() {
                return Ok((Mutation::Unchanged, ()));
            }
            Ok((Mutation::Put(n), ()))
        });
    }
}

/// Full pass: terminating namespaces, deleting owners, dangling references.
pub fn sweep(store: &Store, now: Timestamp) {
    for kind in StoreKind::ALL {
        let keep = |o: &Value| deleting(o);
        let Ok(page) = store.list(ListQuery::of(kind, None), &keep) else { continue };
        for obj in page.items {
            handle_deleting(store, kind, &obj, now);
        }
    }
    for owner in store.owner_uids() {
        if store.get_by_uid(&owner).is_none() {
            for (kind, key) in store.dependents_of(&owner) {
                collect_if_orphaned(store, kind, &key, now);
            }
        }
    }
}
