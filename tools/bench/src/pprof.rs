//! kube-apiserver's CPU profiles (Go's pprof format, as `/debug/pprof/profile` serves them:
//! gzip over the `profile.proto` message) read and split by what the server was doing: which
//! kind of request a sample's goroutine was serving, the watch cache, or the garbage collector.
//!
//! Each sample is put in the first [`PARTS`] entry one of whose markers is in the name of a
//! function on its stack. kube-apiserver serves a write in two goroutines (the handler, and the
//! storage call it starts with a timeout), and both carry the handler's closures
//! (`handlers.UpdateResource.func1…`), so a request's decoding, admission and storage land in
//! the same part. Only the fields read here are declared; prost skips the others.

use std::collections::HashMap;
use std::io::Read;

use serde::{Deserialize, Serialize};

/// Go's `profile.proto`, the fields this module reads.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// What each value of a sample is (`cpu`/`nanoseconds` for a CPU profile).
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Code locations, by id.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions, by id.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string of the profile; index 0 is "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Length of the profile, nanoseconds.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
}

/// A value's kind and unit, as indexes into the string table.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    /// e.g. `cpu`.
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// e.g. `nanoseconds`.
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// One stack and its values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Innermost frame first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
}

/// A program counter and the (inlined) functions at it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Its id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Innermost (inlined) function first.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// A function at a location.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    /// The function's id.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
}

/// A function.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    /// Its id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its name, as an index into the string table.
    #[prost(int64, tag = "2")]
    pub name: i64,
}

/// Errors reading a profile.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Not gzip, or cut short.
    #[error("not a gzip-compressed profile: {0}")]
    Gzip(#[from] std::io::Error),
    /// Not a `profile.proto` message.
    #[error("not a pprof profile: {0}")]
    Decode(#[from] prost::DecodeError),
    /// No `cpu`/`nanoseconds` values.
    #[error("not a CPU profile (no cpu/nanoseconds sample type)")]
    NotCpu,
}

/// The parts a profile is split into, in the order they are tried, each with the markers (parts
/// of function names) that put a sample in it. The names say whose requests they are in the
/// benchmark's workloads: the pods' status comes from the node agent, bindings from the
/// scheduler, PATCHes of pods from the Job controller (its tracking-finalizer removals).
pub const PARTS: &[(&str, &[&str])] = &[
    ("PUT pods/status (the nodes)", &["core/pod/storage.(*StatusREST)"]),
    ("PUT jobs/status (the Job controller)", &["batch/job/storage.(*StatusREST)"]),
    // A PUT's handler goroutine (decoding, admission) does not show which resource it is.
    ("PUT, before storage (decoding, admission)", &["handlers.UpdateResource"]),
    (
        "PATCH (pods: the Job controller's finalizer removals)",
        &["handlers.PatchResource", "handlers.(*patcher)"],
    ),
    ("POST pods/binding (the scheduler)", &["handlers.CreateNamedResource"]),
    ("POST (pods from the Job controller, events, Jobs)", &["handlers.CreateResource"]),
    ("DELETE", &["handlers.DeleteResource", "handlers.DeleteCollection"]),
    ("GET", &["handlers.GetResource"]),
    ("WATCH (events sent to every watcher)", &["handlers.(*WatchServer)", "handlers.handleWatch"]),
    ("LIST", &["handlers.ListResource"]),
    ("watch cache", &["storage/cacher."]),
    ("garbage collection (background)", &["runtime.gcBgMarkWorker"]),
];

/// What no part's marker matched: TLS and HTTP/2, authentication, the server's own loops.
pub const OTHER: &str = "other (every request's filter chain: authentication, priority and fairness, audit; TLS and HTTP/2; stacks too deep to place)";

/// CPU seconds of one or more profiles, by part ([`PARTS`] then [`OTHER`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuByPart {
    /// Seconds the profiles covered.
    pub profiled_secs: f64,
    /// CPU seconds sampled.
    pub cpu_secs: f64,
    /// CPU seconds per part, in [`PARTS`] order then [`OTHER`]; parts without samples too.
    pub parts: Vec<(String, f64)>,
}

impl CpuByPart {
    /// Adds another profile's figures (parts matched by name).
    pub fn add(&mut self, other: &CpuByPart) {
        self.profiled_secs += other.profiled_secs;
        self.cpu_secs += other.cpu_secs;
        for (name, secs) in &other.parts {
            match self.parts.iter_mut().find(|(n, _)| n == name) {
                Some((_, s)) => *s += secs,
                None => self.parts.push((name.clone(), *secs)),
            }
        }
    }

    /// CPU seconds of the part named `name` (0 when absent).
    pub fn secs_of(&self, name: &str) -> f64 {
        self.parts.iter().filter(|(n, _)| n == name).map(|(_, s)| s).sum()
    }
}

/// Reads a profile as `/debug/pprof/profile` serves it (gzip; a plain message is read too).
pub fn decode(bytes: &[u8]) -> Result<Profile, ProfileError> {
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(bytes.len() * 4);
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut out)?;
        out
    } else {
        bytes.to_vec()
    };
    Ok(<Profile as prost::Message>::decode(raw.as_slice())?)
}

/// Splits a CPU profile's samples into [`PARTS`] (and [`OTHER`]).
pub fn cpu_by_part(p: &Profile) -> Result<CpuByPart, ProfileError> {
    let s = |i: i64| p.string_table.get(usize::try_from(i).ok()?).map(String::as_str);
    let cpu = p
        .sample_type
        .iter()
        .position(|t| s(t.r#type) == Some("cpu") && s(t.unit) == Some("nanoseconds"))
        .ok_or(ProfileError::NotCpu)?;
    let functions: HashMap<u64, &str> =
        p.function.iter().map(|f| (f.id, s(f.name).unwrap_or(""))).collect();
    // Each location's part: the earliest part any of its functions marks (None: no marker).
    let part_of = |name: &str| PARTS.iter().position(|(_, m)| m.iter().any(|m| name.contains(m)));
    let locations: HashMap<u64, Option<usize>> = p
        .location
        .iter()
        .map(|l| {
            let part = l
                .line
                .iter()
                .filter_map(|line| functions.get(&line.function_id).and_then(|n| part_of(n)))
                .min();
            (l.id, part)
        })
        .collect();
    let mut nanos = vec![0i64; PARTS.len() + 1];
    for sample in &p.sample {
        let v = sample.value.get(cpu).copied().unwrap_or(0);
        let part = sample
            .location_id
            .iter()
            .filter_map(|id| locations.get(id).copied().flatten())
            .min()
            .unwrap_or(PARTS.len());
        nanos[part] += v;
    }
    let names = PARTS.iter().map(|(n, _)| *n).chain([OTHER]);
    Ok(CpuByPart {
        profiled_secs: p.duration_nanos as f64 / 1e9,
        cpu_secs: nanos.iter().sum::<i64>() as f64 / 1e9,
        parts: names.zip(&nanos).map(|(n, v)| (n.to_string(), *v as f64 / 1e9)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use prost::Message;

    use super::*;

    /// A CPU profile whose samples have the given stacks (function names, innermost first)
    /// and nanoseconds.
    fn profile(samples: &[(&[&str], i64)]) -> Profile {
        let mut strings = vec![String::new(), "samples".into(), "count".into()];
        strings.extend(["cpu".into(), "nanoseconds".into()]);
        let mut function = Vec::new();
        let mut location = Vec::new();
        let mut sample = Vec::new();
        for (stack, nanos) in samples {
            let mut ids = Vec::new();
            for name in *stack {
                let id = function.len() as u64 + 1;
                strings.push(name.to_string());
                function.push(Function { id, name: strings.len() as i64 - 1 });
                location.push(Location { id, line: vec![Line { function_id: id }] });
                ids.push(id);
            }
            sample.push(Sample { location_id: ids, value: vec![1, *nanos] });
        }
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }, ValueType { r#type: 3, unit: 4 }],
            sample,
            location,
            function,
            string_table: strings,
            duration_nanos: 10_000_000_000,
        }
    }

    fn gzip(p: &Profile) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&p.encode_to_vec()).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn samples_go_to_the_first_part_marked_on_their_stack() {
        let p = profile(&[
            // The storage goroutine of a pod status PUT: the resource's part, not "PUT, before
            // storage", though both markers are on the stack.
            (
                &[
                    "k8s.io/apiserver/pkg/storage/etcd3.(*store).GuaranteedUpdate",
                    "k8s.io/kubernetes/pkg/registry/core/pod/storage.(*StatusREST).Update",
                    "k8s.io/apiserver/pkg/endpoints/handlers.UpdateResource.func1.5",
                ],
                30,
            ),
            (
                &[
                    "encoding/json.Unmarshal",
                    "k8s.io/apiserver/pkg/endpoints/handlers.UpdateResource.func1",
                ],
                7,
            ),
            (
                &[
                    "k8s.io/apiserver/pkg/endpoints/handlers.(*patcher).patchResource.func2",
                    "k8s.io/apiserver/pkg/endpoints/handlers/finisher.finishRequest.func1",
                ],
                20,
            ),
            // A watch passes through ListResource: it is a WATCH.
            (
                &[
                    "k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP",
                    "k8s.io/apiserver/pkg/endpoints/handlers.ListResource.func1",
                ],
                5,
            ),
            (&["runtime.scanobject", "runtime.gcBgMarkWorker"], 8),
            (&["crypto/tls.(*Conn).Write"], 10),
        ]);
        let got = cpu_by_part(&decode(&gzip(&p)).unwrap()).unwrap();
        assert!((got.cpu_secs - 80e-9).abs() < 1e-15);
        assert_eq!(got.profiled_secs, 10.0);
        assert_eq!(got.parts.len(), PARTS.len() + 1);
        let ns = |name: &str| (got.secs_of(name) * 1e9).round() as i64;
        assert_eq!(ns("PUT pods/status (the nodes)"), 30);
        assert_eq!(ns("PUT, before storage (decoding, admission)"), 7);
        assert_eq!(ns("PATCH (pods: the Job controller's finalizer removals)"), 20);
        assert_eq!(ns("WATCH (events sent to every watcher)"), 5);
        assert_eq!(ns("LIST"), 0);
        assert_eq!(ns("garbage collection (background)"), 8);
        assert_eq!(ns(OTHER), 10);
    }

    #[test]
    fn inlined_functions_of_one_location_count_too() {
        let mut p = profile(&[(&["runtime.memmove"], 4)]);
        p.string_table.push("k8s.io/apiserver/pkg/endpoints/handlers.GetResource.func1".into());
        p.function.push(Function { id: 99, name: p.string_table.len() as i64 - 1 });
        p.location[0].line.push(Line { function_id: 99 });
        let got = cpu_by_part(&p).unwrap();
        assert_eq!((got.secs_of("GET") * 1e9).round() as i64, 4);
    }

    #[test]
    fn adding_profiles_sums_each_part() {
        let a = cpu_by_part(&profile(&[(&["runtime.gcBgMarkWorker"], 2_000_000_000)])).unwrap();
        let mut sum = a.clone();
        sum.add(&a);
        assert_eq!(sum.profiled_secs, 20.0);
        assert_eq!(sum.cpu_secs, 4.0);
        assert_eq!(sum.secs_of("garbage collection (background)"), 4.0);
        assert_eq!(sum.parts.len(), a.parts.len());
    }

    #[test]
    fn refuses_what_is_not_a_cpu_profile() {
        assert!(matches!(decode(&[0x1f, 0x8b, 1, 2]), Err(ProfileError::Gzip(_))));
        assert!(matches!(decode(&[0xff, 0xff, 0xff]), Err(ProfileError::Decode(_))));
        let mut heap = profile(&[(&["runtime.malg"], 1)]);
        heap.string_table[3] = "alloc_space".into();
        assert!(matches!(cpu_by_part(&heap), Err(ProfileError::NotCpu)));
    }
}
