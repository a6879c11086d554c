//! The priority a Job's enqueues carry: its pods' priority, as the Priority admission plugin
//! would give them (`spec.template.spec.priority` if set, else the value of the PriorityClass
//! its `priorityClassName` names, else the global default PriorityClass's value, else 0). The
//! queue orders a namespace's ready keys by it, with aging (see kjob-workqueue's
//! `PRIORITY_AGING`).
//!
//! [`PriorityClasses`] is plain data over the PriorityClass watch's events (relists included);
//! [`PriorityClasses::resolve`] answers `None` (the queue keeps the priority it holds) while a
//! class it would need is not known yet, so a watcher that starts before its PriorityClass list
//! never resets a key's priority to 0.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::runtime::watcher::Event;

use crate::cache::JobInfo;

/// What a Job's pod template says about its pods' priority.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodPriority {
    /// `spec.template.spec.priority`.
    pub value: Option<i32>,
    /// `spec.template.spec.priorityClassName`.
    pub class: Option<String>,
}

impl PodPriority {
    /// Reads `job`'s pod template.
    pub fn of_job(job: &Job) -> Self {
        let pod = job.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        Self {
            value: pod.and_then(|p| p.priority),
            class: pod.and_then(|p| p.priority_class_name.clone()).filter(|c| !c.is_empty()),
        }
    }
}

/// What the watcher keeps of a PriorityClass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassInfo {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: i32,
    /// Whether it is a global default.
    pub global_default: bool,
}

impl ClassInfo {
    /// Reads a PriorityClass.
    pub fn from_class(c: &PriorityClass) -> Self {
        Self {
            name: c.metadata.name.clone().unwrap_or_default(),
            value: c.value.unwrap_or(0),
            global_default: c.global_default.unwrap_or(false),
        }
    }
}

/// Every PriorityClass seen, kept over the watch's events; a relist replaces them whole.
#[derive(Debug, Default)]
pub struct PriorityClasses {
    /// Name → class.
    classes: BTreeMap<String, ClassInfo>,
    /// The relist in progress.
    relist: Option<BTreeMap<String, ClassInfo>>,
    /// The first complete list has been seen.
    synced: bool,
}

impl PriorityClasses {
    /// Applies one watch event.
    pub fn apply(&mut self, ev: Event<ClassInfo>) {
        match ev {
            Event::Init => self.relist = Some(BTreeMap::new()),
            Event::InitApply(c) => {
                self.relist.get_or_insert_with(BTreeMap::new).insert(c.name.clone(), c);
            }
            Event::InitDone => {
                self.classes = self.relist.take().unwrap_or_default();
                self.synced = true;
            }
            Event::Apply(c) => {
                self.classes.insert(c.name.clone(), c);
            }
            Event::Delete(c) => {
                self.classes.remove(&c.name);
            }
        }
    }

    /// The global default's value: with several global defaults, the lowest (as the admission
    /// plugin picks).
    fn default_value(&self) -> Option<i32> {
        self.classes.values().filter(|c| c.global_default).map(|c| c.value).min()
    }

    /// The priority of `p`'s pods; `None` while the classes it needs are not listed yet.
    pub fn resolve(&self, p: &PodPriority) -> Option<i32> {
        if let Some(v) = p.value {
            return Some(v);
        }
        if !self.synced {
            return None;
        }
        // A class that does not exist would make pod creation fail; until it appears the Job
        // is treated as naming none.
        let class = p.class.as_ref().and_then(|c| self.classes.get(c)).map(|c| c.value);
        Some(class.or_else(|| self.default_value()).unwrap_or(0))
    }

    /// The priority of `job`'s pods (see [`Self::resolve`]).
    pub fn of(&self, job: &JobInfo) -> Option<i32> {
        self.resolve(&job.pod_priority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, value: i32, global_default: bool) -> ClassInfo {
        ClassInfo { name: name.into(), value, global_default }
    }

    fn pod(value: Option<i32>, class: Option<&str>) -> PodPriority {
        PodPriority { value, class: class.map(Into::into) }
    }

    #[test]
    fn resolution_follows_the_admission_plugin() {
        let mut c = PriorityClasses::default();
        assert_eq!(c.resolve(&pod(Some(5), Some("high"))), Some(5), "the template's value wins");
        assert_eq!(c.resolve(&pod(None, Some("high"))), None, "not listed yet: keep");
        assert_eq!(c.resolve(&pod(None, None)), None, "the default is not known yet either");
        c.apply(Event::Init);
        c.apply(Event::InitApply(class("high", 1000, false)));
        c.apply(Event::InitDone);
        assert_eq!(c.resolve(&pod(None, Some("high"))), Some(1000));
        assert_eq!(c.resolve(&pod(None, None)), Some(0), "no default: 0");
        assert_eq!(c.resolve(&pod(None, Some("gone"))), Some(0), "unknown class: as none");
        c.apply(Event::Apply(class("normal", 100, true)));
        c.apply(Event::Apply(class("lower-default", 50, true)));
        assert_eq!(c.resolve(&pod(None, None)), Some(50), "the lowest global default");
        assert_eq!(c.resolve(&pod(None, Some("gone"))), Some(50));
        assert_eq!(c.resolve(&pod(None, Some("high"))), Some(1000));
        c.apply(Event::Delete(class("high", 1000, false)));
        assert_eq!(c.resolve(&pod(None, Some("high"))), Some(50));
        // A relist replaces the whole set at its end.
        c.apply(Event::Init);
        c.apply(Event::InitApply(class("high", 7, false)));
        assert_eq!(c.resolve(&pod(None, Some("high"))), Some(50), "until InitDone");
        c.apply(Event::InitDone);
        assert_eq!(c.resolve(&pod(None, Some("high"))), Some(7));
        assert_eq!(c.resolve(&pod(None, None)), Some(0), "the defaults were not relisted");
    }

    #[test]
    fn reads_the_pod_template() {
        let job: Job = serde_json::from_value(serde_json::json!({
            "spec": { "template": { "spec": {
                "priorityClassName": "high", "priority": 3, "containers": []
            } } }
        }))
        .unwrap();
        assert_eq!(PodPriority::of_job(&job), pod(Some(3), Some("high")));
        assert_eq!(PodPriority::of_job(&Job::default()), pod(None, None));
    }
}
