//! Sealed Job view entries: proof that the watcher (or a worker) wrote a view entry that a
//! worker will create, delete or patch pods from.
//!
//! The shared Job view passes through kjob-queue and Redis, which must not be able to steer a
//! worker (DESIGN invariant 7). So every Job object and pod the view holds is sealed with an
//! HMAC-SHA256 tag under a key that only the watcher and the workers hold, bound to the kind of
//! entry and to the Job key it is stored under. A worker opens each entry against the key it
//! leased; an entry that does not open is dropped and the sync falls back to consistent reads.
//! kjob-queue and Redis store sealed bytes as they are and never need the key.

use ring::hmac;

/// Bytes of the tag in front of every sealed entry.
pub const TAG_LEN: usize = 32;
/// Shortest key accepted: as long as the tag, so the key is not the weak link.
pub const MIN_KEY_LEN: usize = 32;

/// The key every process uses when started with the insecure development flag. It is public, so
/// a view sealed with it proves nothing; it keeps one code path for development and production.
pub const INSECURE_DEVELOPMENT_KEY: &[u8] =
    b"kjob insecure development view key: public, so it proves nothing";

/// What a sealed entry is. Part of what the tag covers, so a pod cannot pass for a Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// The Job object.
    Job,
    /// One of the Job's pods.
    Pod,
}

impl EntryKind {
    fn label(self) -> &'static [u8] {
        match self {
            EntryKind::Job => b"job",
            EntryKind::Pod => b"pod",
        }
    }
}

/// Why an entry did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Shorter than a tag: not a sealed entry.
    #[error("entry is {0} bytes, shorter than a seal")]
    Short(usize),
    /// The tag does not match: written by someone without the key, changed, or moved from
    /// another Job or kind.
    #[error("the entry's seal does not match its content, kind and Job")]
    Forged,
}

/// Errors loading a view key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file could not be read.
    #[error("reading the view key {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The key is too short.
    #[error("the view key in {path} is {len} bytes; it needs at least {MIN_KEY_LEN}")]
    Short {
        /// The file.
        path: String,
        /// Its length.
        len: usize,
    },
}

/// The key that seals and opens view entries.
#[derive(Clone)]
pub struct ViewKey(hmac::Key);

impl std::fmt::Debug for ViewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ViewKey(..)")
    }
}

impl ViewKey {
    /// A key from its bytes (at least [`MIN_KEY_LEN`]).
    pub fn new(bytes: &[u8]) -> Option<Self> {
        (bytes.len() >= MIN_KEY_LEN).then(|| Self(hmac::Key::new(hmac::HMAC_SHA256, bytes)))
    }

    /// The public development key (see [`INSECURE_DEVELOPMENT_KEY`]).
    pub fn insecure_development() -> Self {
        Self::new(INSECURE_DEVELOPMENT_KEY).expect("the development key is long enough")
    }

    /// Reads a key file (a Secret's file: its bytes as they are).
    pub fn from_file(path: &std::path::Path) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        let bytes =
            std::fs::read(path).map_err(|source| KeyError::Read { path: shown.clone(), source })?;
        Self::new(&bytes).ok_or(KeyError::Short { path: shown, len: bytes.len() })
    }

    fn tag(&self, kind: EntryKind, job_key: &str, content: &[u8]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(&self.0);
        // Lengths first, so no two (kind, key, content) triples feed the same bytes.
        ctx.update(b"kjob-view-v1");
        ctx.update(kind.label());
        ctx.update(&(job_key.len() as u64).to_be_bytes());
        ctx.update(job_key.as_bytes());
        ctx.update(content);
        ctx.sign()
    }

    /// `content` sealed as a `kind` entry of Job `job_key`: the tag, then the content.
    pub fn seal(&self, kind: EntryKind, job_key: &str, content: &[u8]) -> Vec<u8> {
        let tag = self.tag(kind, job_key, content);
        let mut out = Vec::with_capacity(TAG_LEN + content.len());
        out.extend_from_slice(tag.as_ref());
        out.extend_from_slice(content);
        out
    }

    /// The content of a sealed `kind` entry of Job `job_key`, if its seal matches.
    pub fn open<'a>(
        &self,
        kind: EntryKind,
        job_key: &str,
        sealed: &'a [u8],
    ) -> Result<&'a [u8], SealError> {
        if sealed.len() < TAG_LEN {
            return Err(SealError::Short(sealed.len()));
        }
        let (tag, content) = sealed.split_at(TAG_LEN);
        // Constant time: the comparison must not tell a forger how much of the tag was right.
        let expected = self.tag(kind, job_key, content);
        let diff = expected.as_ref().iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff == 0 { Ok(content) } else { Err(SealError::Forged) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> ViewKey {
        ViewKey::new(&[b; 32]).unwrap()
    }

    #[test]
    fn a_sealed_entry_opens_only_as_what_it_was_sealed() {
        let k = key(1);
        let s = k.seal(EntryKind::Job, "ns/a", b"{\"kind\":\"Job\"}");
        assert_eq!(s.len(), TAG_LEN + 14);
        assert_eq!(k.open(EntryKind::Job, "ns/a", &s), Ok(&b"{\"kind\":\"Job\"}"[..]));
        // Another Job, another kind, another key, changed content, a bare object: all refused.
        assert_eq!(k.open(EntryKind::Job, "ns/b", &s), Err(SealError::Forged));
        assert_eq!(k.open(EntryKind::Pod, "ns/a", &s), Err(SealError::Forged));
        assert_eq!(key(2).open(EntryKind::Job, "ns/a", &s), Err(SealError::Forged));
        let mut changed = s.clone();
        *changed.last_mut().unwrap() ^= 1;
        assert_eq!(k.open(EntryKind::Job, "ns/a", &changed), Err(SealError::Forged));
        let bare = b"{\"kind\":\"Job\",\"metadata\":{\"name\":\"a\",\"namespace\":\"ns\"}}";
        assert_eq!(k.open(EntryKind::Job, "ns/a", bare), Err(SealError::Forged));
        assert_eq!(k.open(EntryKind::Job, "ns/a", b"short"), Err(SealError::Short(5)));
    }

    #[test]
    fn keys_are_long_enough_and_read_from_files() {
        assert!(ViewKey::new(&[0; MIN_KEY_LEN - 1]).is_none());
        let dir = std::env::temp_dir().join(format!("kjob-seal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, [7u8; 40]).unwrap();
        let k = ViewKey::from_file(&good).unwrap();
        let s = k.seal(EntryKind::Pod, "ns/a", b"p");
        assert!(key(7).open(EntryKind::Pod, "ns/a", &s).is_err(), "40 bytes are not 32");
        assert!(ViewKey::new(&[7; 40]).unwrap().open(EntryKind::Pod, "ns/a", &s).is_ok());
        let short = dir.join("short");
        std::fs::write(&short, b"too short").unwrap();
        let e = ViewKey::from_file(&short).unwrap_err().to_string();
        assert!(e.contains("9 bytes") && e.contains("at least 32"), "{e}");
        let e = ViewKey::from_file(&dir.join("missing")).unwrap_err().to_string();
        assert!(e.contains("reading the view key"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
