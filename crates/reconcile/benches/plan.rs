//! Planning one sync of an Indexed Job with 1,000 and 10,000 pods, side by side: the cost must
//! grow linearly with the number of pods. Every step is answered as an all-success API would.
//! 20,000 is there too: 1k pods (~10 MB of Pod objects) fit in a 32 MB L3 cache and 10k do not,
//! so per-pod cost steps up once between 1k and 10k; 10k → 20k shows the growth is linear
//! past that step.

use std::collections::BTreeSet;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_reconcile::testutil::{at, mk_job, mk_pod};
use kjob_reconcile::{JobSync, Report, Step, SyncInput};

/// An Indexed Job with `n` indexes: 10% of them succeeded (still tracked), 5% failed, the rest
/// running (half ready), one pod per index. The sync counts finished pods (500 at most) and
/// recreates the failed indexes, as a busy Job's steady state does.
fn world(n: i32) -> (Job, Vec<Pod>) {
    let job = mk_job("bench")
        .indexed()
        .completions(Some(n))
        .parallelism(n)
        .backoff_limit(i32::MAX)
        .start_time(at(0))
        .build();
    let pods = (0..n)
        .map(|i| {
            let b = mk_pod(&job, &format!("bench-{i}")).index(i);
            match i % 20 {
                0 | 1 => b.succeeded(at(50)),
                2 => b.failed(1, at(50)),
                k if k % 2 == 0 => b.ready(at(10)),
                _ => b,
            }
            .build()
        })
        .collect();
    (job, pods)
}

/// Runs one sync to its end, answering every step with success; returns the number of steps.
fn plan_one_sync(job: &Job, pods: &[Pod], in_flight: &BTreeSet<String>) -> usize {
    let mut sync = JobSync::new(SyncInput {
        job,
        pods,
        now: at(100),
        expectations_satisfied: true,
        finalizer_removals_in_flight: in_flight,
        backoff: None,
        controller_name: kjob_core::DEFAULT_CONTROLLER_NAME,
        manage_all: true,
    });
    let mut steps = 0;
    loop {
        steps += 1;
        let report = match sync.next_step() {
            Step::Done(outcome) => {
                black_box(outcome);
                return steps;
            }
            Step::Expectations(_) => continue,
            Step::CreatePods { pods } => Report::PodsCreated(
                pods.iter().enumerate().map(|(i, _)| Ok(format!("p{i}"))).collect(),
            ),
            Step::DeletePods { pods, .. } => {
                Report::PodsDeleted(pods.iter().map(|_| Ok(())).collect())
            }
            Step::RemoveFinalizers { pods } => {
                Report::FinalizersRemoved(pods.iter().map(|_| Ok(())).collect())
            }
            Step::UpdateStatus { status } => {
                black_box(status);
                Report::StatusUpdated(Ok(()))
            }
        };
        sync.report(report).expect("report matches step");
    }
}

fn bench_plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_indexed_job");
    group.sample_size(20);
    let in_flight = BTreeSet::new();
    for n in [1_000, 10_000, 20_000] {
        let (job, pods) = world(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| plan_one_sync(black_box(&job), black_box(&pods), &in_flight))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
