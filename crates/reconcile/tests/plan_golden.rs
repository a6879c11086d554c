//! Golden transcripts of whole syncs over seeded pod mixes, so a change meant to be a pure
//! speed-up (index parsing, sorting, bucketing) cannot change which pods are deleted, which
//! indexes are created, or a single byte of a written status, event or metric.
//!
//! The transcripts in `tests/golden/plan_transcripts.txt` were recorded from the straightforward
//! implementation. A deliberate behaviour change re-records them with `KJOB_BLESS=1 cargo
//! nextest run -p kjob-reconcile --test plan_golden` (review the diff before committing it).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_core::JOB_COMPLETION_INDEX_ANNOTATION;
use kjob_reconcile::testutil::{
    at, busy_indexed_job, exit_code_rule, mk_job, mk_pod, start_sync, steady_pods,
};
use kjob_reconcile::{PodSlice, PodSummary, Report, Step, SummarizedPods};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/plan_transcripts.txt");

/// xorshift64*: a deterministic pod mix from a fixed seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// One pod of a mixed world: any phase, readiness, node, restarts, creation time, deletion,
/// finalizer; a valid, duplicated, out-of-range, label-only, negative or garbage index.
fn random_pod(job: &Job, rng: &mut Rng, name: &str, completions: i32) -> Pod {
    let ix = rng.below(completions as u64 + 3) as i32;
    let mut b = mk_pod(job, name);
    b = match rng.below(12) {
        0 => b.annotation(JOB_COMPLETION_INDEX_ANNOTATION, "x"),
        1 => b.annotation(JOB_COMPLETION_INDEX_ANNOTATION, "-1"),
        2 => b.label(JOB_COMPLETION_INDEX_ANNOTATION, &ix.to_string()),
        _ => b.index(ix),
    };
    b = b.created(at(rng.below(4) as i64));
    if rng.below(4) == 0 {
        b = b.restarts(rng.below(3) as i32);
    }
    b = match rng.below(10) {
        0 => b.pending(),
        1 => b.pending().node(Some("node-2")),
        2 => b.phase("Unknown"),
        3 | 4 => b.ready(at(rng.below(3) as i64)),
        5 => b.succeeded(at(10 + rng.below(5) as i64)),
        6 => b.failed(1 + rng.below(3) as i32, at(10 + rng.below(5) as i64)),
        7 => b.failure_counts(rng.below(3) as i32, None).failed(1, at(12)),
        _ => b,
    };
    if rng.below(12) == 0 {
        b = b.deleting(at(20));
    }
    if rng.below(8) == 0 {
        b = b.no_finalizer();
    }
    b.build()
}

/// The worlds: the bench's mixes at a small size, and seeded random mixes with every kind of
/// index trouble, under the spec variants that change pod choice.
fn worlds() -> Vec<(String, Job, Vec<Pod>, BTreeSet<String>)> {
    let mut out = Vec::new();
    // The bench's steady state: 10% succeeded, 5% failed, the rest running (half ready).
    let job = busy_indexed_job("steady", 300).build();
    let pods = steady_pods(&job, "steady", 300);
    out.push(("steady".to_string(), job, pods, BTreeSet::new()));

    // All active, parallelism lowered: a scale-down picks victims by deletion order.
    let job =
        mk_job("down").indexed().completions(Some(200)).parallelism(120).start_time(at(0)).build();
    let mut rng = Rng(7);
    let pods = (0..200)
        .map(|i| {
            let mut b =
                mk_pod(&job, &format!("down-{i}")).index(i).created(at(rng.below(3) as i64));
            b = match rng.below(5) {
                0 => b.pending(),
                1 => b.phase("Unknown"),
                2 => b.ready(at(rng.below(3) as i64)),
                _ => b,
            };
            b.restarts(rng.below(2) as i32).build()
        })
        .collect();
    out.push(("scale-down".to_string(), job, pods, BTreeSet::new()));

    // Half succeeded with finalizers on top of already completed indexes.
    let job = busy_indexed_job("half", 400).completed_indexes("0-9,50,52,54").build();
    let pods = (0..400)
        .map(|i| {
            let b = mk_pod(&job, &format!("half-{i}")).index(i);
            if i % 2 == 0 { b.succeeded(at(30 + i64::from(i % 7))) } else { b.ready(at(5)) }.build()
        })
        .collect();
    out.push(("half-succeeded".to_string(), job, pods, BTreeSet::new()));

    // Many failed under backoffLimitPerIndex with a FailIndex rule and Ignore rule; some
    // finalizer removals in flight.
    let job = busy_indexed_job("perindex", 150)
        .backoff_limit_per_index(2)
        .max_failed_indexes(140)
        .pod_failure_policy(vec![
            exit_code_rule("FailIndex", None, "In", &[3]),
            exit_code_rule("Ignore", None, "In", &[2]),
        ])
        .build();
    let mut rng = Rng(11);
    let pods: Vec<Pod> = (0..260)
        .map(|k| {
            let ix = rng.below(150) as i32;
            let b = mk_pod(&job, &format!("pi-{k}"))
                .index(ix)
                .failure_counts(rng.below(3) as i32, Some(rng.below(2) as i32));
            match rng.below(4) {
                0 => b.ready(at(3)),
                1 => b.succeeded(at(40)),
                _ => b.failed(1 + rng.below(3) as i32, at(20 + rng.below(40) as i64)),
            }
            .build()
        })
        .collect();
    let in_flight = pods.iter().step_by(17).filter_map(|p| p.metadata.uid.clone()).collect();
    out.push(("per-index-failures".to_string(), job, pods, in_flight));

    // Seeded random mixes: duplicates, bad indexes, terminating pods, both replacement policies.
    for seed in 1..=6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let completions = 40 + rng.below(80) as i32;
        let mut b = mk_job(&format!("mix{seed}"))
            .indexed()
            .completions(Some(completions))
            .parallelism(completions - rng.below(20) as i32)
            .backoff_limit(i32::MAX)
            .start_time(at(0));
        if seed % 2 == 0 {
            b = b.pod_replacement_policy("Failed");
        }
        if seed % 3 == 0 {
            b = b.backoff_limit_per_index(1);
        }
        if seed == 5 {
            b = b.suspend(true);
        }
        let job = b.build();
        let n = completions + rng.below(60) as i32;
        let pods = (0..n).map(|k| random_pod(&job, &mut rng, &format!("m{seed}-{k}"), completions));
        out.push((format!("mix-{seed}"), job.clone(), pods.collect(), BTreeSet::new()));
    }

    // At most one active pod per index, so manageJob creates: the pending indexes skip
    // succeeded, failed, active and (replacement policy Failed) terminating ones, and with
    // backoffLimitPerIndex each index waits out its own backoff from its last failed pod.
    for (seed, per_index) in [(21u64, true), (22, false)] {
        let mut rng = Rng(seed);
        let n = 180;
        let mut b = busy_indexed_job(&format!("re{seed}"), n);
        b = if per_index {
            b.backoff_limit_per_index(3).max_failed_indexes(n)
        } else {
            b.pod_replacement_policy("Failed")
        };
        let job = b.build();
        let mut pods = Vec::new();
        for ix in 0..n {
            let name = |k: usize| format!("re{seed}-{ix}-{k}");
            let fails = rng.below(3) as usize;
            for k in 0..fails {
                let t = at(40 + rng.below(60) as i64);
                let b = mk_pod(&job, &name(k)).index(ix).failure_counts(k as i32, None);
                // Without per-index backoff, uncounted failures would hold every create back
                // behind the Job-wide backoff; counted ones (finalizer gone) do not.
                let b = if per_index { b } else { b.no_finalizer() };
                pods.push(b.failed(1, t).build());
            }
            match rng.below(5) {
                0 => pods.push(mk_pod(&job, &name(9)).index(ix).succeeded(at(50)).build()),
                1 => pods.push(mk_pod(&job, &name(9)).index(ix).ready(at(5)).build()),
                2 => pods.push(mk_pod(&job, &name(9)).index(ix).deleting(at(90)).build()),
                _ => {}
            }
        }
        out.push((format!("recreate-{seed}"), job, pods, BTreeSet::new()));
    }

    // NonIndexed: scale-down order among identical-looking pods.
    let job = mk_job("plain")
        .completions(Some(100))
        .parallelism(30)
        .backoff_limit(i32::MAX)
        .start_time(at(0))
        .build();
    let mut rng = Rng(99);
    let pods = (0..80).map(|k| random_pod(&job, &mut rng, &format!("plain-{k}"), 100)).collect();
    out.push(("non-indexed".to_string(), job, pods, BTreeSet::new()));
    out
}

/// Runs one sync with every call succeeding and writes each step as a line. With `summaries`
/// the sync starts from them ([`kjob_reconcile::JobSync::with_summaries`]), else from the pods alone.
fn transcript<'a>(
    name: &str,
    job: &'a Job,
    pods: impl Into<PodSlice<'a>>,
    summaries: Option<&'a [PodSummary]>,
    in_flight: &'a BTreeSet<String>,
) -> String {
    let mut t = format!("== {name}\n");
    let mut sync = start_sync(job, pods, at(100), in_flight, summaries);
    let mut created = 0;
    loop {
        let report = match sync.next_step() {
            Step::Done(mut outcome) => {
                let status = outcome.status_written.take();
                writeln!(t, "done {outcome:?}").unwrap();
                writeln!(t, "done.status {}", status.map(|s| json(&*s)).unwrap_or_default())
                    .unwrap();
                return t;
            }
            Step::Expectations(op) => {
                writeln!(t, "expectations {op:?}").unwrap();
                continue;
            }
            Step::CreatePods { pods } => {
                for p in &pods {
                    writeln!(t, "create {}", json(p)).unwrap();
                }
                Report::PodsCreated(
                    pods.iter()
                        .map(|_| {
                            created += 1;
                            Ok(format!("{name}-new-{created}"))
                        })
                        .collect(),
                )
            }
            Step::DeletePods { pods, remove_finalizer } => {
                let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
                writeln!(t, "delete remove_finalizer={remove_finalizer} {names:?}").unwrap();
                Report::PodsDeleted(pods.iter().map(|_| Ok(())).collect())
            }
            Step::RemoveFinalizers { pods } => {
                let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
                writeln!(t, "finalizers {names:?}").unwrap();
                Report::FinalizersRemoved(pods.iter().map(|_| Ok(())).collect())
            }
            Step::UpdateStatus { status } => {
                writeln!(t, "status {}", json(&*status)).unwrap();
                Report::StatusUpdated(Ok(()))
            }
        };
        sync.report(report).expect("report matches step");
    }
}

/// One line of JSON, so field-by-field differences show up in the diff.
fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("API objects serialise")
}

#[test]
fn sync_transcripts_match_golden() {
    let got: String = worlds()
        .iter()
        .map(|(name, job, pods, fl)| transcript(name, job, pods, None, fl))
        .collect();
    // Every world must actually exercise something: a world that plans nothing guards nothing.
    for block in got.split("== ").skip(1) {
        let name = block.lines().next().unwrap_or("");
        assert!(
            block.contains("\ncreate ")
                || block.contains("\ndelete ")
                || block.contains("\nfinalizers "),
            "world {name} neither creates, deletes nor releases pods"
        );
    }
    if std::env::var_os("KJOB_BLESS").is_some() {
        std::fs::create_dir_all(std::path::Path::new(GOLDEN).parent().unwrap()).unwrap();
        std::fs::write(GOLDEN, &got).unwrap();
        return;
    }
    let want =
        std::fs::read_to_string(GOLDEN).expect("golden transcripts (record with KJOB_BLESS=1)");
    if got != want {
        let (n, (g, w)) = got
            .lines()
            .zip(want.lines())
            .enumerate()
            .find(|(_, (g, w))| g != w)
            .unwrap_or((got.lines().count().min(want.lines().count()), ("<end>", "<end>")));
        panic!("transcripts differ at line {}:\n got: {g}\nwant: {w}", n + 1);
    }
}

/// The worker's way in: pods decoded from a LIST body into [`SummarizedPods`] (each summary taken
/// as its pod is decoded) plan exactly what the Pod objects alone plan; summaries that do not
/// match the pods one to one are taken again.
#[test]
fn summaries_decoded_with_the_pods_plan_the_same_sync() {
    for (name, job, pods, fl) in worlds() {
        let expected = transcript(&name, &job, &pods, None, &fl);
        let body = serde_json::to_string(&pods).expect("pods serialise");
        let decoded: SummarizedPods = serde_json::from_str(&body).expect("pods decode");
        assert!(decoded.as_slice().iter().eq(&pods), "{name}");
        let got = transcript(&name, &job, &decoded, Some(decoded.summaries()), &fl);
        assert_eq!(got, expected, "{name}: planned from decoded summaries");
        let short = &decoded.summaries()[..decoded.len().saturating_sub(1)];
        let got = transcript(&name, &job, &decoded, Some(short), &fl);
        assert_eq!(got, expected, "{name}: planned from mismatched summaries");
    }
}
