//! The `--view-key-file` flag of the processes that write and read the shared Job view (the
//! watcher and the workers): the key that seals view entries, which kjob-queue and Redis never
//! hold (see kjob_core::seal).

use std::path::PathBuf;

use kjob_core::seal::ViewKey;

/// The view key flag, with its `env` twin.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ViewKeyArgs {
    /// File holding the key that seals Job view entries (at least 32 bytes; a Secret shared by
    /// kjob-watcher and kjob-worker only, never by kjob-queue or Redis).
    #[arg(long, env = "KJOB_VIEW_KEY_FILE")]
    pub view_key_file: Option<PathBuf>,
}

impl ViewKeyArgs {
    /// A key read from `path`.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self { view_key_file: Some(path.into()) }
    }

    /// Whether [`Self::key`] would succeed (without its warning): for a binary's early check.
    pub fn check(&self, insecure: bool) -> anyhow::Result<()> {
        match (&self.view_key_file, insecure) {
            (Some(path), _) => ViewKey::from_file(path).map(drop).map_err(Into::into),
            (None, true) => Ok(()),
            (None, false) => self.key(false).map(drop),
        }
    }

    /// The key these flags name. Without a file, only `insecure` (the process's
    /// `--insecure-no-auth`) allows running, with the public development key and a warning;
    /// otherwise the error says in one line what is missing.
    pub fn key(&self, insecure: bool) -> anyhow::Result<ViewKey> {
        match (&self.view_key_file, insecure) {
            (Some(path), _) => Ok(ViewKey::from_file(path)?),
            (None, true) => {
                tracing::warn!(
                    "no --view-key-file: the shared Job view is sealed with the public development \
                     key (--insecure-no-auth), so it proves nothing; never run this way in production"
                );
                Ok(ViewKey::insecure_development())
            }
            (None, false) => anyhow::bail!(
                "no --view-key-file (env KJOB_VIEW_KEY_FILE): the key that seals the shared Job \
                 view is required, or pass --insecure-no-auth (development only)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_or_the_insecure_flag() {
        let err = ViewKeyArgs::default().key(false).unwrap_err().to_string();
        assert!(err.contains("--view-key-file") && err.contains("--insecure-no-auth"), "{err}");
        assert!(!err.contains('\n'));
        assert!(ViewKeyArgs::default().key(true).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, [5u8; 32]).unwrap();
        let k = ViewKeyArgs::file(&path).key(false).unwrap();
        let sealed = k.seal(kjob_core::seal::EntryKind::Job, "ns/a", b"x");
        let same = ViewKey::new(&[5; 32]).unwrap();
        assert!(same.open(kjob_core::seal::EntryKind::Job, "ns/a", &sealed).is_ok());
        std::fs::write(&path, b"short").unwrap();
        let err = ViewKeyArgs::file(&path).key(true).unwrap_err().to_string();
        assert!(err.contains("at least 32"), "{err}");
    }
}
