//! Raw HTTP against an in-process kjob-sim, for the tests that check the wire itself rather than
//! what a typed client makes of it.

use std::time::Duration;

use kjob_sim::SimConfig;
use kjob_sim::testing::TestSim;

/// Bound of every request and stream read.
pub const WAIT: Duration = Duration::from_secs(10);

/// A simulator and a plain HTTP client for it.
pub struct Wire {
    /// The simulator.
    pub sim: TestSim,
    /// A client whose requests time out after [`WAIT`].
    pub http: reqwest::Client,
}

impl Wire {
    /// Starts a simulator with `config`.
    pub async fn start(config: SimConfig) -> Self {
        let sim = TestSim::start(config).await;
        let http = reqwest::Client::builder().timeout(WAIT).build().unwrap();
        Self { sim, http }
    }

    /// The simulator's URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.sim.url())
    }

    /// Sends one request, with `body` when given and a `content-type` header unless `ct` is
    /// empty; `Err` for a transport failure (dropped connection, timeout).
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        ct: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Vec<u8>), String> {
        let mut req = self.http.request(method, self.url(path));
        if let Some(body) = body {
            req = req.body(body);
        }
        if !ct.is_empty() {
            req = req.header("content-type", ct);
        }
        let resp = req.send().await.map_err(|e| format!("transport: {e}"))?;
        let code = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| format!("reading body: {e}"))?;
        Ok((code, bytes.to_vec()))
    }
}
