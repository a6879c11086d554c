//! `kjob-demo`: runs redis-server, kjob-sim, kjob-queue, kjob-watcher and kjob-workers as
//! real processes, creates the example Jobs, shows their progress and exits 0 once every Job
//! ended as its `kjob.io/demo-expect` annotation says (1 otherwise, 2 on a set-up error,
//! 130 on Ctrl-C).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kjob_demo::examples::{self, Example};
use kjob_demo::expect;
use kjob_demo::view::{self, JobRow};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::signal::unix::{SignalKind, signal};

use kjob_testkit::cluster::ClusterInfo;
use kjob_testkit::stack::{RealServer, Stack, StackConfig};

/// Timeout of each API call the demo makes to kjob-sim.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the table refreshes.
const REFRESH: Duration = Duration::from_millis(500);
/// Width of the progress bar, in characters.
const BAR_WIDTH: usize = 30;

/// Runs the kjob stack locally and shows the example Jobs being reconciled.
#[derive(Debug, Parser)]
#[command(name = "kjob-demo", version)]
struct Args {
    /// Folder of example Job YAMLs (each with a kjob.io/demo-expect annotation).
    #[arg(long, env = "KJOB_DEMO_EXAMPLES")]
    examples: Option<PathBuf>,
    /// Working folder for logs, Redis data and the kubeconfig [default: target/demo].
    #[arg(long, env = "KJOB_DEMO_DIR")]
    run_dir: Option<PathBuf>,
    /// Folder holding kjob-sim, kjob-queue, kjob-watcher and kjob-worker [default: next to
    /// this binary].
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Number of kjob-worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Give up (exit 1) if the Jobs are not all finished after this long.
    #[arg(long, default_value = "180s", value_parser = kjob_svc::parse_duration)]
    timeout: Duration,
    /// Namespace the example Jobs are created in.
    #[arg(long, default_value = "kjob-demo")]
    namespace: String,
    /// `spec.managedBy` value kjob answers to.
    #[arg(long, env = "KJOB_CONTROLLER_NAME", default_value = kjob_core::DEFAULT_CONTROLLER_NAME)]
    controller_name: String,
    /// Run on the real control plane of this `make cluster-up` folder (e.g. target/cluster)
    /// instead of kjob-sim: the watcher and workers use their own ServiceAccounts, and the Jobs
    /// go to a fresh namespace `<namespace>-<unix time>`.
    #[arg(long, env = "KJOB_DEMO_CLUSTER")]
    cluster: Option<PathBuf>,
    /// Print one line per change instead of a refreshing table (automatic when stdout is not
    /// a terminal).
    #[arg(long)]
    plain: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kjob-demo: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// How the run ended.
enum End {
    Finished,
    TimedOut,
    Interrupted,
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args {
        examples,
        run_dir,
        bin_dir,
        workers,
        timeout,
        namespace,
        controller_name,
        cluster,
        plain,
    } = args;
    // The repository this binary was built from; only consulted for defaults, so a copied
    // binary works when both folders are given.
    let root = kjob_testkit::workspace_root;
    let examples_dir = examples.unwrap_or_else(|| root().join("examples"));
    let run_dir = run_dir.unwrap_or_else(|| root().join("target/demo"));
    let bin_dir = match bin_dir {
        Some(d) => d,
        None => std::env::current_exe()?.parent().context("binary has no folder")?.to_path_buf(),
    };
    let examples = examples::load_dir(&examples_dir)?;
    anyhow::ensure!(!examples.is_empty(), "no example Jobs in {}", examples_dir.display());
    let redis_server = kjob_testkit::redis::redis_server_binary()?;
    let tty = std::io::stdout().is_terminal() && !plain;

    // Installed before any child starts: the children run in their own process group (a
    // terminal's Ctrl-C reaches only us), so we must be the one to stop them; a signal that
    // arrives while they start is buffered and handled right after.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    println!("kjob demo: {} example Jobs from {}", examples.len(), examples_dir.display());
    let mut cfg = StackConfig::new(bin_dir, redis_server, run_dir, workers);
    cfg.controller_name = controller_name;
    cfg.own_process_groups = true;
    let namespace = match &cluster {
        Some(dir) => {
            let info = ClusterInfo::read(dir)?;
            let secs = jiff::Timestamp::now().as_second();
            let ns = format!("{namespace}-{secs}");
            let (i, n) = (info.clone(), ns.clone());
            tokio::task::spawn_blocking(move || i.create_namespace(&n)).await??;
            cfg.real = Some(RealServer::from_cluster(&info, &ns));
            println!(
                "  on the real control plane in {} (kube-apiserver {}): starting redis-server, \
                 kjob-queue, kjob-watcher and {workers} kjob-worker(s) on their ServiceAccounts",
                dir.display(),
                kjob_testkit::cluster::KUBERNETES_VERSION
            );
            ns
        }
        None => {
            println!(
                "  starting redis-server, kjob-sim (simulated API server and kubelet), kjob-queue, \
                 kjob-watcher and {workers} kjob-worker(s)"
            );
            namespace
        }
    };
    let real = cfg.real.is_some();
    let mut stack = tokio::task::spawn_blocking(move || Stack::start(cfg)).await??;
    println!("logs:      {}", stack.log_dir.display());
    if !real {
        println!("kjob-sim:  {}", stack.sim_url);
    }
    println!("queue:     {}", stack.queue_url);
    println!("Point kubectl at the cluster (while the demo runs):");
    println!("  export KUBECONFIG={}", stack.kubeconfig.display());
    println!("  kubectl get jobs,pods -n {namespace}");
    println!();

    let client = client(&stack).await?;
    let end = tokio::select! {
        r = async {
            create_examples(&client, &namespace, &examples).await?;
            watch(&client, &namespace, &examples, &mut stack, timeout, tty).await
        } => r?,
        _ = interrupt.recv() => End::Interrupted,
        _ = terminate.recv() => End::Interrupted,
    };
    let rows = match end {
        End::Interrupted => Vec::new(),
        _ => current_rows(&client, &namespace, &examples).await.unwrap_or_default(),
    };
    println!("stopping every process...");
    tokio::task::spawn_blocking(move || stack.stop()).await?;
    Ok(match end {
        End::Interrupted => {
            println!("interrupted");
            ExitCode::from(130)
        }
        End::Finished | End::TimedOut => summary(&examples, &rows, matches!(end, End::TimedOut)),
    })
}

async fn client(stack: &Stack) -> anyhow::Result<Client> {
    kjob_testkit::server::kube_client(&stack.kubeconfig, Some(API_TIMEOUT)).await
}

async fn timed<T>(
    what: &str,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(API_TIMEOUT, fut)
        .await
        .with_context(|| format!("{what}: no answer within {API_TIMEOUT:?}"))?
        .with_context(|| what.to_string())
}

async fn create_examples(client: &Client, ns: &str, examples: &[Example]) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut nsobj = Namespace::default();
    nsobj.metadata.name = Some(ns.to_string());
    match tokio::time::timeout(API_TIMEOUT, namespaces.create(&PostParams::default(), &nsobj)).await
    {
        Ok(Ok(_)) => {}
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => {}
        Ok(Err(e)) => return Err(e).context(format!("creating namespace {ns}")),
        Err(_) => anyhow::bail!("creating namespace {ns}: no answer within {API_TIMEOUT:?}"),
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    for ex in examples {
        let mut job = ex.job.clone();
        job.metadata.namespace = Some(ns.to_string());
        timed(
            &format!("creating Job {ns}/{}", ex.name()),
            jobs.create(&PostParams::default(), &job),
        )
        .await?;
        println!("created job {ns}/{:<20} expect {}", ex.name(), ex.expect);
    }
    Ok(())
}

/// The rows of the example Jobs, in example order (a Job not found yet shows as Pending).
async fn current_rows(
    client: &Client,
    ns: &str,
    examples: &[Example],
) -> anyhow::Result<Vec<JobRow>> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let list = timed("listing Jobs", jobs.list(&ListParams::default())).await?;
    let by_name: BTreeMap<String, Job> =
        list.items.into_iter().filter_map(|j| Some((j.metadata.name.clone()?, j))).collect();
    let now = jiff::Timestamp::now();
    Ok(examples
        .iter()
        .map(|ex| {
            let job = by_name.get(ex.name()).unwrap_or(&ex.job);
            JobRow::from_job(job, now)
        })
        .collect())
}

async fn watch(
    client: &Client,
    ns: &str,
    examples: &[Example],
    stack: &mut Stack,
    timeout: Duration,
    tty: bool,
) -> anyhow::Result<End> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    let mut resumed = BTreeSet::new();
    let mut injected = BTreeSet::new();
    let mut last_lines = 0usize;
    let mut printed: BTreeMap<String, String> = BTreeMap::new();
    let mut last_done = usize::MAX;
    let mut tick = tokio::time::interval(REFRESH);
    let width = terminal_width();
    loop {
        tick.tick().await;
        stack.check_alive()?;
        for ex in examples {
            if let Some(after) = ex.resume_after
                && started.elapsed() >= after
                && resumed.insert(ex.name().to_string())
            {
                let patch = serde_json::json!({ "spec": { "suspend": false } });
                let pp = PatchParams::default();
                timed(
                    &format!("resuming Job {}", ex.name()),
                    jobs.patch(ex.name(), &pp, &Patch::Merge(&patch)),
                )
                .await?;
                if !tty {
                    println!(
                        "[{:>5.1}s] resumed job {}",
                        started.elapsed().as_secs_f64(),
                        ex.name()
                    );
                }
            }
        }
        for ex in examples {
            let Some(code) = ex.first_pod_exit_code else { continue };
            if injected.contains(ex.name()) {
                continue;
            }
            if let Some(pod) = inject_exit_code(&pods, ex.name(), code).await? {
                injected.insert(ex.name().to_string());
                if !tty {
                    let t = started.elapsed().as_secs_f64();
                    println!("[{t:>5.1}s] made pod {pod} of job {} exit {code}", ex.name());
                }
            }
        }
        let rows = current_rows(client, ns, examples).await?;
        let done = rows.iter().filter(|r| r.finished()).count();
        if tty {
            let frame = view::fit(
                &format!(
                    "{}\n\n{}",
                    view::progress_bar(done, rows.len(), BAR_WIDTH),
                    view::render_table(&rows)
                ),
                width,
            );
            let mut out = std::io::stdout().lock();
            if last_lines > 0 {
                // Move back over the previous frame and clear it, so the table refreshes in
                // place.
                write!(out, "\x1b[{last_lines}A\x1b[J")?;
            }
            write!(out, "{frame}")?;
            out.flush()?;
            last_lines = frame.lines().count();
        } else {
            let t = started.elapsed().as_secs_f64();
            for r in &rows {
                let line = view::render_line(r);
                if printed.get(&r.name) != Some(&line) {
                    println!("[{t:>5.1}s] {line}");
                    printed.insert(r.name.clone(), line);
                }
            }
            if done != last_done {
                println!("[{t:>5.1}s] {}", view::progress_bar(done, rows.len(), BAR_WIDTH));
                last_done = done;
            }
        }
        if done == rows.len() {
            return Ok(End::Finished);
        }
        if started.elapsed() >= timeout {
            return Ok(End::TimedOut);
        }
    }
}

/// Sets the simulated kubelet's exit code on a running pod of `job`; the pod's name if one was
/// found.
async fn inject_exit_code(pods: &Api<Pod>, job: &str, code: i32) -> anyhow::Result<Option<String>> {
    let lp = ListParams::default().labels(&format!("{}={job}", kjob_core::JOB_NAME_LABEL));
    let list = timed(&format!("listing pods of Job {job}"), pods.list(&lp)).await?;
    let running = list.items.into_iter().find(|p| {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        p.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
    });
    let Some(name) = running.and_then(|p| p.metadata.name) else { return Ok(None) };
    let patch = serde_json::json!({
        "metadata": { "annotations": { expect::SIM_EXIT_CODE_ANNOTATION: code.to_string() } }
    });
    timed(
        &format!("setting the exit code of pod {name}"),
        pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    Ok(Some(name))
}

/// Columns of the terminal on stdout (`stty size` on /dev/tty, then `COLUMNS`, then 80).
fn terminal_width() -> usize {
    let from_stty = std::fs::File::open("/dev/tty").ok().and_then(|tty| {
        let out = std::process::Command::new("stty").arg("size").stdin(tty).output().ok()?;
        String::from_utf8(out.stdout).ok()?.split_whitespace().nth(1)?.parse().ok()
    });
    from_stty
        .or_else(|| std::env::var("COLUMNS").ok()?.parse().ok())
        .filter(|w: &usize| *w > 0)
        .unwrap_or(80)
}

fn summary(examples: &[Example], rows: &[JobRow], timed_out: bool) -> ExitCode {
    println!();
    if timed_out {
        println!("timed out: not every Job finished");
    }
    println!("summary:");
    let mut ok = !timed_out && rows.len() == examples.len();
    for (ex, row) in examples.iter().zip(rows) {
        let got =
            row.outcome.as_ref().map(ToString::to_string).unwrap_or_else(|| "unfinished".into());
        let good = row.outcome.as_ref().is_some_and(|o| ex.expect.matches(o));
        ok &= good;
        let mark = if good { "ok " } else { "BAD" };
        println!("  {mark} {:<20} expected {:<28} got {got}", ex.name(), ex.expect.to_string());
    }
    if ok {
        println!("every Job ended as expected");
        ExitCode::SUCCESS
    } else {
        println!("some Jobs did not end as expected; see the logs above");
        ExitCode::from(1)
    }
}
