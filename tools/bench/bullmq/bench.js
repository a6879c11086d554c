// BullMQ peer of kjob-queue-bench: the same Redis, a Worker at concurrency 100 with a no-op
// processor. Driven by `kjob-queue-bench run` over stdin/stdout:
//
//   node bench.js throughput --port P --items N [--warmup W] [--batch B] [--concurrency C]
//   node bench.js latency    --port P --items N --rate R [--concurrency C]
//
// With --tls-ca FILE [--username U --password P] it speaks TLS to a TLS-only Redis (verifying
// its certificate against FILE) as that ACL user.
//
// Each mode warms up, prints `ready`, waits for a `go` line on stdin (the driver snapshots the
// Redis counters in between), runs, and prints one JSON line with its figures and correctness
// checks. It then waits for stdin to close before disconnecting, so teardown is not measured.
'use strict';

const { Queue, Worker } = require('bullmq');
const fs = require('node:fs');
const { performance } = require('node:perf_hooks');
const readline = require('node:readline');

const STRING_FLAGS = new Set(['tls-ca', 'username', 'password']);

function args() {
  const a = process.argv.slice(2);
  const out = { mode: a[0], warmup: 1000, batch: 100, concurrency: 100, rate: 500 };
  for (let i = 1; i < a.length; i += 2) {
    const k = a[i].replace(/^--/, '');
    out[k] = STRING_FLAGS.has(k) ? a[i + 1] : Number(a[i + 1]);
  }
  return out;
}

const lines = readline.createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once('line', resolve));
const stdinClosed = new Promise((resolve) => lines.once('close', resolve));

// Tracks every job: processed at least once, never run by two handlers at once.
class Ledger {
  constructor() {
    this.active = new Set();
    this.seen = new Map();
    this.overlaps = 0;
  }
  start(id) {
    if (this.active.has(id)) this.overlaps++;
    this.active.add(id);
    this.seen.set(id, (this.seen.get(id) || 0) + 1);
  }
  finish(id) {
    this.active.delete(id);
  }
}

async function left(queue) {
  const c = await queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized', 'failed');
  return Object.values(c).reduce((s, v) => s + v, 0);
}

// Jobs still in the queue; polls briefly, since a job's completion is written after its
// processor returns.
async function drained(queue) {
  const deadline = performance.now() + 5000;
  let n = await left(queue);
  while (n > 0 && performance.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
    n = await left(queue);
  }
  return n;
}

async function throughput(o, connection) {
  const name = 'bench';
  const queue = new Queue(name, { connection });
  const ledger = new Ledger();
  let wanted = 0;
  let completed = 0;
  let target = null;
  const worker = new Worker(
    name,
    async (job) => {
      ledger.start(job.id);
      ledger.finish(job.id);
    },
    { connection, concurrency: o.concurrency, autorun: false },
  );
  // The clock stops when the last job's completion is recorded, not when its processor ran.
  worker.on('completed', () => {
    completed++;
    if (target && completed >= wanted && ledger.seen.size >= wanted) target();
  });
  worker.run();
  await worker.waitUntilReady();
  const add = async (prefix, n) => {
    for (let i = 0; i < n; i += o.batch) {
      const jobs = [];
      for (let j = i; j < Math.min(n, i + o.batch); j++) {
        const id = `${prefix}-${String(j % 50).padStart(2, '0')}/job-${String(j).padStart(7, '0')}`;
        jobs.push({ name: 'x', data: {}, opts: { jobId: id, removeOnComplete: true, removeOnFail: true } });
      }
      await queue.addBulk(jobs);
    }
  };
  const run = async (prefix, n) => {
    ledger.seen.clear();
    completed = 0;
    wanted = n;
    const done = new Promise((resolve) => (target = resolve));
    const t0 = performance.now();
    await add(prefix, n);
    await done;
    target = null;
    return performance.now() - t0;
  };
  await run('warm', o.warmup);
  console.log('ready');
  await nextLine();
  const ms = await run('bench', o.items);
  await finish({ items: o.items, elapsed_ms: ms }, ledger, queue, worker);
}

// Prints a run's figures with the ledger's and what is left in the queue, then closes once
// stdin does.
async function finish(figures, ledger, queue, worker) {
  const result = {
    ...figures,
    unique: ledger.seen.size,
    overlaps: ledger.overlaps,
    left: await drained(queue),
  };
  console.log(JSON.stringify(result));
  await stdinClosed;
  await worker.close();
  await queue.close();
}

function percentile(sorted, p) {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.round((sorted.length - 1) * p))];
}

async function latency(o, connection) {
  const name = 'latency';
  const queue = new Queue(name, { connection });
  const lat = [];
  const ledger = new Ledger();
  let target = null;
  const worker = new Worker(
    name,
    async (job) => {
      ledger.start(job.id);
      lat.push(performance.now() - job.data.t);
      ledger.finish(job.id);
    },
    { connection, concurrency: o.concurrency, autorun: false },
  );
  worker.on('completed', () => {
    if (target && lat.length >= o.items) target();
  });
  worker.run();
  await worker.waitUntilReady();
  console.log('ready');
  await nextLine();
  // Let the worker reach its blocking wait before the first job.
  await new Promise((r) => setTimeout(r, 300));
  const done = new Promise((resolve) => (target = resolve));
  const interval = 1000 / o.rate;
  const start = performance.now();
  for (let i = 0; i < o.items; i++) {
    // Open loop: each send waits for its slot in the schedule, not for the previous reply.
    const wait = start + i * interval - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    await queue.add('x', { t: performance.now() }, { jobId: `lat/item-${i}`, removeOnComplete: true, removeOnFail: true });
  }
  await done;
  lat.sort((a, b) => a - b);
  const figures = {
    items: o.items,
    p50_ms: percentile(lat, 0.5),
    p99_ms: percentile(lat, 0.99),
    max_ms: lat[lat.length - 1] || 0,
  };
  await finish(figures, ledger, queue, worker);
}

async function main() {
  const o = args();
  const connection = { host: '127.0.0.1', port: o.port, maxRetriesPerRequest: null };
  if (o['tls-ca']) connection.tls = { ca: fs.readFileSync(o['tls-ca']) };
  if (o.username) connection.username = o.username;
  if (o.password) connection.password = o.password;
  if (o.mode === 'throughput') await throughput(o, connection);
  else if (o.mode === 'latency') await latency(o, connection);
  else throw new Error(`unknown mode ${o.mode}; expected throughput or latency`);
  process.exit(0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
