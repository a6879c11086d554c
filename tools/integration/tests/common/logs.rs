//! Log lines written by one future under its own subscriber, for assertions.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// What a subscriber made by [`Logs::subscriber`] wrote (plain text, no colours).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// A subscriber writing every event at DEBUG and above here; attach it to the future under
    /// test with `tracing::instrument::WithSubscriber::with_subscriber`.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let logs = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish()
    }
}
