//! Planning one sync of an Indexed Job with 1,000, 10,000 and 20,000 pods, side by side, for
//! several pod mixes: the cost must grow linearly with the number of pods. Every step is
//! answered as an all-success API would. After each mix a one-line summary gives the per-pod
//! cost at each size (median and minimum over Criterion's own samples) and the 10k/1k ratios,
//! which should stay near 1 (the target is below 1.5).
//!
//! `plan/*` plans from the pods' [`PodSummary`]s, taken beforehand as the worker takes them:
//! while it decodes the pod LIST, each Pod still in cache. `summarize` times taking them from
//! Pod objects that are not in cache (the worst case, more than the decoder pays), and
//! `plan_from_pods/steady` plans from the Pod objects alone (`JobSync::new`, which takes the
//! summaries itself), so the cost of the Pods' memory layout stays in view. `decode/*` decodes
//! a LIST's pods with and without their summaries: what the summaries cost the worker.
//!
//! Run: `cargo bench -p kjob-reconcile --bench plan -- --warm-up-time 1 --measurement-time 3`.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_core::JOB_COMPLETION_INDEX_ANNOTATION;
use kjob_reconcile::testutil::{self, JobBuilder, at, busy_indexed_job, mk_pod, start_sync};
use kjob_reconcile::{PodSummary, Step, SummarizedPods};

/// Pod counts benched side by side.
const SIZES: [i32; 3] = [1_000, 10_000, 20_000];

/// Builds an Indexed Job with `n` indexes and its pods.
type Mix = fn(i32) -> (Job, Vec<Pod>);

/// The Indexed Job every mix starts from.
fn indexed_job(n: i32) -> JobBuilder {
    busy_indexed_job("bench", n)
}

/// The pod mixes, by name.
const MIXES: &[(&str, Mix)] = &[
    ("steady", steady),
    ("all_active", all_active),
    ("half_succeeded", half_succeeded),
    ("many_failed", many_failed),
    ("duplicated", duplicated),
];

/// A busy Job's steady state: 10% succeeded (still tracked), 5% failed, the rest running (half
/// ready), one pod per index. The sync counts finished pods (500 at most) and recreates the
/// failed indexes.
fn steady(n: i32) -> (Job, Vec<Pod>) {
    let job = indexed_job(n).build();
    let pods = testutil::steady_pods(&job, "bench", n);
    (job, pods)
}

/// Every index has a running pod (a third ready), parallelism lowered to 90%: the sync picks
/// the 10% to delete by deletion order (capped at 500).
fn all_active(n: i32) -> (Job, Vec<Pod>) {
    let job = indexed_job(n).parallelism(n - n / 10).build();
    let pods = (0..n)
        .map(|i| {
            let b = mk_pod(&job, &format!("bench-{i}")).index(i).created(at(i64::from(i % 7)));
            match i % 3 {
                0 => b.ready(at(i64::from(i % 5))),
                1 => b.restarts(i % 2),
                _ => b,
            }
            .build()
        })
        .collect();
    (job, pods)
}

/// Half the indexes succeeded and still carry the tracking finalizer, the other half run: the
/// sync records 500 completed indexes and releases those pods.
fn half_succeeded(n: i32) -> (Job, Vec<Pod>) {
    let job = indexed_job(n).build();
    let pods = (0..n)
        .map(|i| {
            let b = mk_pod(&job, &format!("bench-{i}")).index(i);
            if i % 2 == 0 { b.succeeded(at(50)) } else { b.ready(at(10)) }.build()
        })
        .collect();
    (job, pods)
}

/// backoffLimitPerIndex 3: a third of the indexes have failed pods (one to three each, with
/// failure counts), the rest run: the sync counts failures, computes the failed and delayed
/// indexes, and recreates indexes whose per-index backoff is over.
fn many_failed(n: i32) -> (Job, Vec<Pod>) {
    let job = indexed_job(n).backoff_limit_per_index(3).max_failed_indexes(n).build();
    let mut pods = Vec::with_capacity(n as usize * 2);
    for i in 0..n {
        if i % 3 == 0 {
            for k in 0..=(i % 3 + i % 2) {
                let b = mk_pod(&job, &format!("bench-{i}-{k}")).index(i).failure_counts(k, None);
                pods.push(b.failed(1, at(10 + i64::from(k) * 20)).build());
            }
        } else {
            pods.push(mk_pod(&job, &format!("bench-{i}")).index(i).ready(at(5)).build());
        }
    }
    (job, pods)
}

/// One index in ten has a second active pod and one pod in a hundred has a bad index: the sync
/// deletes the duplicates and bad pods (capped at 500), keeping each index's most advanced pod.
fn duplicated(n: i32) -> (Job, Vec<Pod>) {
    let job = indexed_job(n).build();
    let mut pods = Vec::with_capacity(n as usize + n as usize / 10);
    for i in 0..n {
        let b = mk_pod(&job, &format!("bench-{i}")).index(i);
        pods.push(if i % 2 == 0 { b.ready(at(10)) } else { b }.build());
        if i % 10 == 0 {
            pods.push(mk_pod(&job, &format!("bench-{i}-dup")).index(i).pending().build());
        }
        if i % 100 == 50 {
            let bad = mk_pod(&job, &format!("bench-{i}-bad"))
                .annotation(JOB_COMPLETION_INDEX_ANNOTATION, "bogus")
                .build();
            pods.push(bad);
        }
    }
    (job, pods)
}

/// Runs one sync to its end, answering every step with success; returns the number of steps.
/// With `summaries` the sync plans from them (the worker's way), else from the Pods alone.
fn plan_one_sync(
    job: &Job,
    pods: &[Pod],
    summaries: Option<&[PodSummary]>,
    in_flight: &BTreeSet<String>,
) -> usize {
    let mut sync = start_sync(job, pods, at(100), in_flight, summaries);
    let mut steps = 0;
    loop {
        steps += 1;
        let step = sync.next_step();
        if let Step::Done(outcome) = step {
            black_box(outcome);
            return steps;
        }
        let Some(report) = step.all_succeeded(|i| format!("p{i}")) else { continue };
        black_box(step);
        sync.report(report).expect("report matches step");
    }
}

fn label(n: i32) -> String {
    format!("{}k", n / 1000)
}

/// `(median, minimum)` of per-pod samples. The minimum is the cost with the least disturbance
/// (other processes, page faults when the allocator re-grows a trimmed heap), which only ever
/// adds time; both are printed.
fn median_and_min(mut v: Vec<f64>) -> Option<(f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some((v[v.len() / 2], v[0]))
}

fn bench_plan(c: &mut Criterion) {
    for &(mix, build) in MIXES {
        bench_mix(c, &format!("plan/{mix}"), build, true);
    }
    bench_mix(c, "plan_from_pods/steady", steady, false);
}

/// Benches `run` over the state `setup` builds for each size (the state and its pod count) as
/// group `name`, then prints the group's per-pod summary line.
fn per_pod_group<S>(
    c: &mut Criterion,
    name: &str,
    sample_size: usize,
    setup: impl Fn(i32) -> (S, usize),
    run: impl Fn(&S),
) {
    let mut group = c.benchmark_group(name);
    group.sample_size(sample_size);
    // Per-pod nanoseconds of every timed batch, per size, for the summary line.
    let samples: Vec<RefCell<Vec<f64>>> = SIZES.iter().map(|_| RefCell::default()).collect();
    for (k, &n) in SIZES.iter().enumerate() {
        let (state, npods) = setup(n);
        group.throughput(Throughput::Elements(npods as u64));
        group.bench_with_input(BenchmarkId::from_parameter(label(n)), &n, |b, _| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    run(black_box(&state));
                }
                let took = start.elapsed();
                let per_pod = took.as_nanos() as f64 / iters.max(1) as f64 / npods as f64;
                samples[k].borrow_mut().push(per_pod);
                took
            })
        });
    }
    group.finish();
    summarize(name, samples);
}

/// One group: a sync of `build`'s world at each size, from summaries taken beforehand or from
/// the Pods alone.
fn bench_mix(c: &mut Criterion, name: &str, build: Mix, with_summaries: bool) {
    let in_flight = BTreeSet::new();
    let setup = |n| {
        let (job, pods) = build(n);
        let summaries = with_summaries.then(|| PodSummary::of_all(&pods));
        let npods = pods.len();
        ((job, pods, summaries), npods)
    };
    per_pod_group(c, name, 20, setup, |(job, pods, summaries)| {
        black_box(plan_one_sync(job, pods, summaries.as_deref(), &in_flight));
    });
}

/// Decoding the steady mix's pods from a LIST body as the worker does, each summary taken as its
/// pod is decoded (`SummarizedPods`), next to decoding the Pods alone: the difference is what
/// the summaries really cost the worker.
fn bench_decode(c: &mut Criterion) {
    let body = |n| {
        let (_, pods) = steady(n);
        (serde_json::to_string(&pods).expect("pods serialise"), pods.len())
    };
    per_pod_group(c, "decode/pods", 10, body, |body| {
        black_box(serde_json::from_str::<Vec<Pod>>(body).expect("decode"));
    });
    per_pod_group(c, "decode/summarized_pods", 10, body, |body| {
        black_box(serde_json::from_str::<SummarizedPods>(body).expect("decode"));
    });
}

/// Taking the summaries of every pod of the steady mix from Pod objects, as `JobSync::new`
/// does; the worker pays less, taking each as the pod is decoded.
fn bench_summarize(c: &mut Criterion) {
    per_pod_group(c, "summarize", 20, steady_pods, |pods| {
        black_box(PodSummary::of_all(pods));
    });
}

/// The floor: reading each pod's completion index once (the least any plan from Pod objects
/// must do), on the steady mix. Its own 10k/1k ratio shows how much of a ratio is the memory
/// hierarchy (1k pods fit in the CPU cache, 10k do not) rather than the planning work.
fn bench_floor(c: &mut Criterion) {
    per_pod_group(c, "floor/read_index", 20, steady_pods, |pods| {
        let sum: i64 =
            pods.iter().filter_map(kjob_reconcile::pod::completion_index).map(i64::from).sum();
        black_box(sum);
    });
}

/// The steady mix's pods and their count.
fn steady_pods(n: i32) -> (Vec<Pod>, usize) {
    let (_, pods) = steady(n);
    let len = pods.len();
    (pods, len)
}

/// Prints the one-line per-pod summary of a group from its recorded samples.
fn summarize(name: &str, samples: Vec<RefCell<Vec<f64>>>) {
    let per_pod: Vec<Option<(f64, f64)>> =
        samples.into_iter().map(|s| median_and_min(s.into_inner())).collect();
    if per_pod.iter().all(Option::is_none) {
        return; // Filtered out on the command line.
    }
    let parts: Vec<String> = SIZES
        .iter()
        .zip(&per_pod)
        .map(|(n, c)| match c {
            Some((med, min)) => {
                format!("{}: {:.3} µs (min {:.3})", label(*n), med / 1000.0, min / 1000.0)
            }
            None => format!("{}: -", label(*n)),
        })
        .collect();
    let ratio = match (per_pod[0], per_pod[1]) {
        (Some((a, amin)), Some((b, bmin))) if a > 0.0 && amin > 0.0 => {
            format!("{:.2}× (min {:.2}×)", b / a, bmin / amin)
        }
        _ => "-".to_string(),
    };
    println!("{name}: per-pod cost median {}; 10k/1k per-pod ratio {ratio}", parts.join(", "));
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1));
    targets = bench_floor, bench_summarize, bench_decode, bench_plan
}
criterion_main!(benches);
