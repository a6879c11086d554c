//! Namespace weights of the fair lease: read from the `kjob.io/queue-weight` annotation of every
//! Namespace ([`kjob_core::QUEUE_WEIGHT_ANNOTATION`]) and sent whole to kjob-queue
//! (`SetNamespaceWeights`), which keeps them in Redis for every replica's lease scripts.
//!
//! [`NamespaceWeights`] is plain data over the Namespace watch's events (relists included);
//! [`run_pusher`] sends the latest set the event loop published, so a slow or failing
//! kjob-queue never holds up the watch streams, and a newer set replaces one not yet sent.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kjob_core::{MAX_QUEUE_WEIGHT, QUEUE_WEIGHT_ANNOTATION};
use kjob_queue_client::QueueClient;
use kjob_svc::Shutdown;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

/// The weight an annotation value asks for: a decimal integer from 1 to
/// [`MAX_QUEUE_WEIGHT`] (surrounding spaces allowed); anything else is refused with why.
pub fn parse_weight(value: &str) -> Result<u32, String> {
    let v = value.trim();
    match v.parse::<u32>() {
        Ok(w) if (1..=MAX_QUEUE_WEIGHT).contains(&w) => Ok(w),
        _ => Err(format!("{v:?} is not a whole number from 1 to {MAX_QUEUE_WEIGHT}")),
    }
}

/// What the watcher keeps of a Namespace: its name and the weight its annotation asks for
/// (1 without one; 1, with a warning, for an invalid one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceWeight {
    /// The namespace.
    pub name: String,
    /// Its weight in the fair lease.
    pub weight: u32,
}

impl NamespaceWeight {
    /// Reads `ns`'s annotation; an invalid value is logged and counts as 1 (the default), so
    /// a typo never stops the other namespaces' weights from applying.
    pub fn from_namespace(ns: &Namespace) -> Self {
        let name = ns.metadata.name.clone().unwrap_or_default();
        let value = ns.metadata.annotations.as_ref().and_then(|a| a.get(QUEUE_WEIGHT_ANNOTATION));
        let weight = match value.map(|v| parse_weight(v)) {
            None => 1,
            Some(Ok(w)) => w,
            Some(Err(why)) => {
                tracing::warn!(
                    namespace = %name,
                    annotation = QUEUE_WEIGHT_ANNOTATION,
                    "ignoring the namespace's queue weight ({why}); it gets weight 1"
                );
                1
            }
        };
        Self { name, weight }
    }
}

/// The weights of every Namespace seen, kept over the watch's events; a relist replaces them
/// whole (a Namespace deleted while the watch was cut loses its weight).
#[derive(Debug, Default)]
pub struct NamespaceWeights {
    /// Namespace → weight, only weights other than 1.
    weights: BTreeMap<String, u32>,
    /// The relist in progress.
    relist: Option<BTreeMap<String, u32>>,
    /// The first complete list has been seen.
    synced: bool,
}

impl NamespaceWeights {
    /// Applies one watch event; whether the weights changed (only once synced: before the
    /// first complete list there is nothing to send).
    pub fn apply(&mut self, ev: Event<NamespaceWeight>) -> bool {
        let before = self.synced.then(|| self.weights.clone());
        match ev {
            Event::Init => self.relist = Some(BTreeMap::new()),
            Event::InitApply(n) => {
                let relist = self.relist.get_or_insert_with(BTreeMap::new);
                if n.weight != 1 {
                    relist.insert(n.name, n.weight);
                }
            }
            Event::InitDone => {
                self.weights = self.relist.take().unwrap_or_default();
                self.synced = true;
            }
            Event::Apply(n) => {
                if n.weight == 1 {
                    self.weights.remove(&n.name);
                } else {
                    self.weights.insert(n.name, n.weight);
                }
            }
            Event::Delete(n) => {
                self.weights.remove(&n.name);
            }
        }
        self.synced && before.as_ref() != Some(&self.weights)
    }

    /// Whether the first complete list has been seen.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The weights other than 1, as sent to kjob-queue.
    pub fn weights(&self) -> &BTreeMap<String, u32> {
        &self.weights
    }
}

/// The set the event loop wants kjob-queue to hold (`None`: nothing to send yet).
pub type Published = Option<Arc<BTreeMap<String, u32>>>;

/// Sends every set published on `rx` to kjob-queue until `shutdown`, each with the client's
/// retries; a set that still fails is logged and left to the next publication (the periodic
/// resync publishes again), and a set published meanwhile replaces it.
pub async fn run_pusher(
    queue: QueueClient,
    mut rx: watch::Receiver<Published>,
    shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = rx.changed() => if changed.is_err() { return },
        }
        let Some(set) = rx.borrow_and_update().clone() else { continue };
        let weights: HashMap<String, u32> = set.iter().map(|(n, w)| (n.clone(), *w)).collect();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = queue.set_namespace_weights(weights) => match r {
                Ok(weighted) => tracing::info!(weighted, "namespace weights sent to kjob-queue"),
                Err(e) => tracing::warn!(
                    error = %e,
                    "could not send the namespace weights; the next resync sends them again"
                ),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(name: &str, weight: Option<&str>) -> NamespaceWeight {
        let mut n = Namespace::default();
        n.metadata.name = Some(name.into());
        if let Some(w) = weight {
            n.metadata.annotations =
                Some([(QUEUE_WEIGHT_ANNOTATION.to_string(), w.to_string())].into());
        }
        NamespaceWeight::from_namespace(&n)
    }

    #[test]
    fn annotation_values() {
        for (value, want) in [
            ("3", Ok(3)),
            (" 7 ", Ok(7)),
            ("1", Ok(1)),
            ("1000", Ok(1000)),
            ("0", Err(())),
            ("1001", Err(())),
            ("-2", Err(())),
            ("2.5", Err(())),
            ("", Err(())),
            ("high", Err(())),
        ] {
            assert_eq!(parse_weight(value).map_err(|_| ()), want, "{value:?}");
        }
        assert_eq!(ns("a", Some("4")).weight, 4);
        assert_eq!(ns("a", Some("lots")).weight, 1, "invalid: the default");
        assert_eq!(ns("a", None).weight, 1);
    }

    #[test]
    fn events_and_relists() {
        let mut w = NamespaceWeights::default();
        assert!(!w.apply(Event::Init));
        assert!(!w.apply(Event::InitApply(ns("a", Some("3")))));
        assert!(!w.apply(Event::InitApply(ns("b", None))));
        assert!(!w.synced());
        assert!(w.apply(Event::InitDone), "the first list is a change");
        assert_eq!(w.weights(), &BTreeMap::from([("a".to_string(), 3)]));
        assert!(!w.apply(Event::Apply(ns("b", Some("1")))), "weight 1 is the default");
        assert!(w.apply(Event::Apply(ns("b", Some("2")))));
        assert!(!w.apply(Event::Apply(ns("b", Some("2")))), "unchanged");
        assert!(w.apply(Event::Apply(ns("a", Some("x")))), "invalid: back to 1");
        assert_eq!(w.weights(), &BTreeMap::from([("b".to_string(), 2)]));
        // A relist where b vanished and c appeared: the relisted set replaces the old at its end.
        assert!(!w.apply(Event::Init));
        assert!(!w.apply(Event::InitApply(ns("c", Some("5")))));
        assert_eq!(w.weights(), &BTreeMap::from([("b".to_string(), 2)]), "until InitDone");
        assert!(w.apply(Event::InitDone));
        assert_eq!(w.weights(), &BTreeMap::from([("c".to_string(), 5)]));
        assert!(w.apply(Event::Delete(ns("c", Some("5")))));
        assert!(w.weights().is_empty());
    }
}
