//! The example Jobs in `examples/`: parsed, checked for an expectation, ordered by name.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use serde::Deserialize;

use crate::expect::{
    self, ExpectError, Expectation, FIRST_POD_EXIT_CODE_ANNOTATION, RESUME_AFTER_ANNOTATION,
};

/// The example Jobs (by file name) the demo shows, one per behaviour it demonstrates.
pub const DEMO_CASES: [&str; 7] = [
    "plain",
    "indexed",
    "work-queue",
    "pod-failure-policy",
    "backoff-limit",
    "suspended",
    "active-deadline",
];

/// Errors loading the examples.
#[derive(Debug, thiserror::Error)]
pub enum ExampleError {
    /// The directory or a file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A document is not a valid batch/v1 Job.
    #[error("{path}: not a batch/v1 Job: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The YAML error.
        source: serde_yaml::Error,
    },
    /// A Job has no name or no (or a bad) expectation annotation.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// One example Job and what the demo does with it.
#[derive(Debug, Clone)]
pub struct Example {
    /// The file it came from.
    pub path: PathBuf,
    /// The Job to create.
    pub job: Job,
    /// The terminal state it must reach.
    pub expect: Expectation,
    /// When set, the demo resumes the (suspended) Job this long after creating it.
    pub resume_after: Option<Duration>,
    /// When set, the demo makes the first pod of this Job exit with this code.
    pub first_pod_exit_code: Option<i32>,
}

impl Example {
    /// The Job's name.
    pub fn name(&self) -> &str {
        self.job.metadata.name.as_deref().unwrap_or_default()
    }
}

/// Parses every Job document of one YAML file (`---`-separated; empty documents skipped).
pub fn parse_file(path: &Path, text: &str) -> Result<Vec<Example>, ExampleError> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(doc)
            .map_err(|source| ExampleError::Parse { path: path.into(), source })?;
        if value.is_null() {
            continue;
        }
        let job: Job = serde_yaml::from_value(value)
            .map_err(|source| ExampleError::Parse { path: path.into(), source })?;
        out.push(example(path, job)?);
    }
    Ok(out)
}

fn example(path: &Path, job: Job) -> Result<Example, ExampleError> {
    let invalid = |message: String| ExampleError::Invalid { path: path.into(), message };
    if job.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(invalid("the Job has no metadata.name".into()));
    }
    let expect = match expect::declared(&job) {
        Some(Ok(e)) => e,
        Some(Err(ExpectError::Invalid(v))) => {
            return Err(invalid(format!("bad {} {v:?}", expect::EXPECT_ANNOTATION)));
        }
        None => return Err(invalid(format!("no {} annotation", expect::EXPECT_ANNOTATION))),
    };
    let annotations = job.metadata.annotations.as_ref();
    let resume_after = match annotations.and_then(|a| a.get(RESUME_AFTER_ANNOTATION)) {
        Some(v) => Some(
            kjob_svc::parse_duration(v)
                .map_err(|e| invalid(format!("bad {RESUME_AFTER_ANNOTATION}: {e}")))?,
        ),
        None => None,
    };
    let first_pod_exit_code = match annotations.and_then(|a| a.get(FIRST_POD_EXIT_CODE_ANNOTATION))
    {
        Some(v) => {
            Some(v.trim().parse::<i32>().ok().filter(|c| (1..=255).contains(c)).ok_or_else(
                || invalid(format!("bad {FIRST_POD_EXIT_CODE_ANNOTATION} {v:?}: want 1-255")),
            )?)
        }
        None => None,
    };
    Ok(Example { path: path.into(), job, expect, resume_after, first_pod_exit_code })
}

/// Loads every `*.yaml`/`*.yml` file of `dir`, sorted by Job name; names must be unique.
pub fn load_dir(dir: &Path) -> Result<Vec<Example>, ExampleError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ExampleError::Io { path, source }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(io(&f))?;
        out.extend(parse_file(&f, &text)?);
    }
    out.sort_by(|a, b| a.name().cmp(b.name()));
    if let Some(w) = out.windows(2).find(|w| w[0].name() == w[1].name()) {
        return Err(ExampleError::Invalid {
            path: w[1].path.clone(),
            message: format!("Job name {:?} is used twice", w[1].name()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: b
  annotations:
    kjob.io/demo-expect: "Failed:DeadlineExceeded"
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox}]
---
apiVersion: batch/v1
kind: Job
metadata:
  name: a
  annotations:
    kjob.io/demo-expect: Complete
    kjob.io/demo-resume-after: 5s
spec:
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox}]
---
"#;

    #[test]
    fn parses_multi_document_files() {
        let ex = parse_file(Path::new("x.yaml"), TWO).unwrap();
        assert_eq!(ex.len(), 2);
        assert_eq!(ex[0].name(), "b");
        assert_eq!(ex[0].expect, Expectation::parse("Failed:DeadlineExceeded").unwrap());
        assert_eq!(ex[0].resume_after, None);
        assert_eq!(ex[1].resume_after, Some(Duration::from_secs(5)));
        assert_eq!(ex[1].first_pod_exit_code, None);
        let with = TWO
            .replace("kjob.io/demo-resume-after: 5s", "kjob.io/demo-first-pod-exit-code: \"42\"");
        assert_eq!(
            parse_file(Path::new("x.yaml"), &with).unwrap()[1].first_pod_exit_code,
            Some(42)
        );
        for bad in ["\"0\"", "\"256\"", "x"] {
            let with = TWO.replace(
                "kjob.io/demo-resume-after: 5s",
                &format!("kjob.io/demo-first-pod-exit-code: {bad}"),
            );
            assert!(parse_file(Path::new("x.yaml"), &with).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_jobs_without_expectation_or_with_a_bad_one() {
        let no = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\n";
        assert!(matches!(parse_file(Path::new("n.yaml"), no), Err(ExampleError::Invalid { .. })));
        let bad = TWO.replace("Failed:DeadlineExceeded", "Finished");
        let err = parse_file(Path::new("b.yaml"), &bad).unwrap_err().to_string();
        assert!(err.contains("Finished"), "{err}");
        let bad = TWO.replace("5s", "soon");
        assert!(parse_file(Path::new("b.yaml"), &bad).is_err());
    }

    #[test]
    fn loads_a_directory_sorted_and_rejects_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("two.yaml"), TWO).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not yaml: [").unwrap();
        let ex = load_dir(dir.path()).unwrap();
        assert_eq!(ex.iter().map(Example::name).collect::<Vec<_>>(), ["a", "b"]);
        std::fs::write(dir.path().join("again.yml"), TWO).unwrap();
        let err = load_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("used twice"), "{err}");
    }

    #[test]
    fn the_repository_examples_load_and_cover_the_demo_cases() {
        let dir = kjob_testkit::workspace_root().join("examples");
        let ex = load_dir(&dir).unwrap();
        let names: Vec<_> = ex.iter().map(Example::name).collect();
        for want in DEMO_CASES {
            assert!(names.contains(&want), "examples/ lacks {want}: {names:?}");
        }
        for e in &ex {
            let spec = e.job.spec.as_ref().unwrap();
            assert_eq!(
                spec.managed_by.as_deref(),
                Some(kjob_core::DEFAULT_CONTROLLER_NAME),
                "{}",
                e.name()
            );
        }
        let suspended = ex.iter().find(|e| e.name() == "suspended").unwrap();
        assert!(suspended.resume_after.is_some());
        assert_eq!(suspended.job.spec.as_ref().unwrap().suspend, Some(true));
        let pfp = ex.iter().find(|e| e.name() == "pod-failure-policy").unwrap();
        assert_eq!(pfp.first_pod_exit_code, Some(42));
        let rules = pfp.job.spec.as_ref().unwrap().pod_failure_policy.as_ref().unwrap();
        assert_eq!(rules.rules[0].action, "Ignore");
        assert_eq!(rules.rules[0].on_exit_codes.as_ref().unwrap().values, vec![42]);
    }
}
