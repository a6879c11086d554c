//! What the demo shows: one row per Job, a table, a progress bar. Pure: time comes in.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;

use crate::expect::{self, Expectation};

/// One line of the live table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRow {
    /// Job name.
    pub name: String,
    /// `succeeded/completions` as kubectl prints it (work-queue Jobs: `n/1 of <parallelism>`).
    pub completions: String,
    /// Active pods.
    pub active: i32,
    /// Succeeded pods.
    pub succeeded: i32,
    /// Failed pods.
    pub failed: i32,
    /// Human state: Pending, Running, Suspended, Complete, `Failed (Reason)`, ...
    pub condition: String,
    /// Time since the Job was created.
    pub age: Duration,
    /// What the example says it should end as.
    pub expected: Option<Expectation>,
    /// Its terminal state, once finished.
    pub outcome: Option<Expectation>,
}

impl JobRow {
    /// Builds the row of `job` as seen at `now`.
    pub fn from_job(job: &Job, now: jiff::Timestamp) -> Self {
        let spec = job.spec.as_ref();
        let status = job.status.as_ref();
        let succeeded = status.and_then(|s| s.succeeded).unwrap_or(0);
        let completions = match spec.and_then(|s| s.completions) {
            Some(c) => format!("{succeeded}/{c}"),
            None => match spec.and_then(|s| s.parallelism).unwrap_or(1) {
                p if p > 1 => format!("{succeeded}/1 of {p}"),
                _ => format!("{succeeded}/1"),
            },
        };
        let age = job
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| now.duration_since(t.0).try_into().ok())
            .unwrap_or_default();
        Self {
            name: job.metadata.name.clone().unwrap_or_default(),
            completions,
            active: status.and_then(|s| s.active).unwrap_or(0),
            succeeded,
            failed: status.and_then(|s| s.failed).unwrap_or(0),
            condition: condition_text(job),
            age,
            expected: expect::declared(job).and_then(Result::ok),
            outcome: expect::outcome(job),
        }
    }

    /// Whether the Job has finished.
    pub fn finished(&self) -> bool {
        self.outcome.is_some()
    }

    /// `ok` when finished as expected, `UNEXPECTED` when finished otherwise, empty before.
    pub fn verdict(&self) -> &'static str {
        match (&self.outcome, &self.expected) {
            (None, _) => "",
            (Some(o), Some(e)) if e.matches(o) => "ok",
            (Some(_), None) => "ok",
            (Some(_), Some(_)) => "UNEXPECTED",
        }
    }
}

/// The state shown in the CONDITION column, most final first.
fn condition_text(job: &Job) -> String {
    let status = job.status.as_ref();
    let conds = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let find = |t: &str| conds.iter().find(|c| c.type_ == t && c.status == "True");
    let with_reason = |label: &str, t: &str| {
        let reason = find(t).and_then(|c| c.reason.clone()).filter(|r| !r.is_empty());
        match reason {
            Some(r) => format!("{label} ({r})"),
            None => label.to_string(),
        }
    };
    if find("Complete").is_some() {
        "Complete".into()
    } else if find("Failed").is_some() {
        with_reason("Failed", "Failed")
    } else if find("FailureTarget").is_some() {
        with_reason("Failing", "FailureTarget")
    } else if find("SuccessCriteriaMet").is_some() {
        "Succeeding".into()
    } else if job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false) {
        "Suspended".into()
    } else if status.and_then(|s| s.active).unwrap_or(0) > 0 {
        "Running".into()
    } else {
        "Pending".into()
    }
}

/// kubectl-like short age: `45s`, `2m5s`, `15m`, `3h`.
pub fn format_age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10800 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

/// The table: a header and one aligned line per row, each ending in a newline.
pub fn render_table(rows: &[JobRow]) -> String {
    const HEADER: [&str; 9] =
        ["JOB", "COMPLETIONS", "ACTIVE", "SUCCEEDED", "FAILED", "CONDITION", "AGE", "EXPECT", ""];
    let cells: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.completions.clone(),
                r.active.to_string(),
                r.succeeded.to_string(),
                r.failed.to_string(),
                r.condition.clone(),
                format_age(r.age),
                r.expected.as_ref().map(ToString::to_string).unwrap_or_else(|| "-".into()),
                r.verdict().to_string(),
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |fields: Vec<&str>| {
        let mut l = String::new();
        for (i, (f, w)) in fields.iter().zip(widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(&format!("{f:<w$}"));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(HEADER.to_vec());
    for row in &cells {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// `[########------------]  3/7 Jobs finished`, `width` characters of bar.
pub fn progress_bar(done: usize, total: usize, width: usize) -> String {
    let filled = (done * width).checked_div(total).unwrap_or(width).min(width);
    format!("[{}{}] {done}/{total} Jobs finished", "#".repeat(filled), "-".repeat(width - filled))
}

/// Cuts every line of `text` to `width` characters, so a refreshing frame never wraps (a
/// wrapped line would break the cursor arithmetic of the redraw).
pub fn fit(text: &str, width: usize) -> String {
    text.lines().map(|l| format!("{}\n", l.chars().take(width).collect::<String>())).collect()
}

/// A one-line description of a row, for output that is not a terminal.
pub fn render_line(row: &JobRow) -> String {
    let verdict = match row.verdict() {
        "" => String::new(),
        v => format!("  [{v}]"),
    };
    format!(
        "{:<20} {:<12} active={} succeeded={} failed={}  {}{verdict}",
        row.name, row.completions, row.active, row.succeeded, row.failed, row.condition
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{job, job_with_conditions};

    fn at(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn row_of_a_running_plain_job() {
        let mut j = job("plain", Some(5), Some(2), "Complete");
        let st = j.status.get_or_insert_with(Default::default);
        st.active = Some(2);
        st.succeeded = Some(3);
        let r = JobRow::from_job(&j, at(75));
        assert_eq!(r.completions, "3/5");
        assert_eq!((r.active, r.succeeded, r.failed), (2, 3, 0));
        assert_eq!(r.condition, "Running");
        assert_eq!(r.age, Duration::from_secs(75));
        assert!(!r.finished());
        assert_eq!(r.verdict(), "");
    }

    #[test]
    fn completions_column_like_kubectl() {
        let r = |c, p| JobRow::from_job(&job("j", c, p, "Complete"), at(0)).completions;
        assert_eq!(r(None, Some(3)), "0/1 of 3");
        assert_eq!(r(None, None), "0/1");
        assert_eq!(r(Some(4), Some(2)), "0/4");
    }

    #[test]
    fn condition_and_verdict() {
        let mut j = job_with_conditions(&[
            ("FailureTarget", "True", "BackoffLimitExceeded"),
            ("Failed", "True", "BackoffLimitExceeded"),
        ]);
        j.metadata.annotations = Some(
            [(crate::expect::EXPECT_ANNOTATION.to_string(), "Failed:BackoffLimitExceeded".into())]
                .into(),
        );
        let r = JobRow::from_job(&j, at(0));
        assert_eq!(r.condition, "Failed (BackoffLimitExceeded)");
        assert_eq!(r.verdict(), "ok");

        let mut j = job_with_conditions(&[("Complete", "True", "CompletionsReached")]);
        j.metadata.annotations =
            Some([(crate::expect::EXPECT_ANNOTATION.to_string(), "Failed".into())].into());
        assert_eq!(JobRow::from_job(&j, at(0)).verdict(), "UNEXPECTED");

        let j = job_with_conditions(&[("FailureTarget", "True", "DeadlineExceeded")]);
        assert_eq!(JobRow::from_job(&j, at(0)).condition, "Failing (DeadlineExceeded)");
        let mut j = job("s", Some(1), Some(1), "Complete");
        j.spec.as_mut().unwrap().suspend = Some(true);
        assert_eq!(JobRow::from_job(&j, at(0)).condition, "Suspended");
        assert_eq!(JobRow::from_job(&job("p", None, None, "Complete"), at(0)).condition, "Pending");
    }

    #[test]
    fn ages() {
        let a = |s| format_age(Duration::from_secs(s));
        assert_eq!(
            [a(0), a(119), a(125), a(600), a(3 * 3600)],
            ["0s", "119s", "2m5s", "10m", "3h"]
        );
    }

    #[test]
    fn table_aligns_columns() {
        let mut long = job("a-much-longer-name", Some(5), Some(2), "Failed:DeadlineExceeded");
        long.status.get_or_insert_with(Default::default).active = Some(2);
        let rows = [
            JobRow::from_job(&job("plain", Some(5), Some(2), "Complete"), at(3)),
            JobRow::from_job(&long, at(3)),
        ];
        let t = render_table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("JOB  "), "{t}");
        let col = |l: &str, w: &str| l.find(w).unwrap();
        assert_eq!(col(lines[0], "COMPLETIONS"), col(lines[1], "0/5"), "{t}");
        assert_eq!(col(lines[0], "CONDITION"), col(lines[2], "Running"), "{t}");
        assert_eq!(col(lines[0], "EXPECT"), col(lines[2], "Failed:DeadlineExceeded"), "{t}");
        assert!(lines.iter().all(|l| !l.ends_with(' ')));
    }

    #[test]
    fn progress_bar_fills_proportionally() {
        assert_eq!(progress_bar(0, 4, 8), "[--------] 0/4 Jobs finished");
        assert_eq!(progress_bar(2, 4, 8), "[####----] 2/4 Jobs finished");
        assert_eq!(progress_bar(4, 4, 8), "[########] 4/4 Jobs finished");
        assert_eq!(progress_bar(0, 0, 4), "[####] 0/0 Jobs finished");
    }

    #[test]
    fn fit_truncates_lines_and_keeps_their_count() {
        assert_eq!(fit("abcdef\nab\n\nxyz", 3), "abc\nab\n\nxyz\n");
        assert_eq!(fit("héllo", 2), "hé\n");
    }

    #[test]
    fn line_mentions_verdict_once_finished() {
        let j = job_with_conditions(&[("Complete", "True", "CompletionsReached")]);
        let l = render_line(&JobRow::from_job(&j, at(0)));
        assert!(l.contains("Complete") && l.ends_with("[ok]"), "{l}");
    }
}
