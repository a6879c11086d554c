//! Raw API requests through a kube client, for tests that compare exact answers (status code
//! and JSON body) of kjob-sim and the real server.

use std::time::Duration;

use serde_json::Value;

/// Longest a raw request may take on a loaded machine.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends `method path` with `body` (none when `null`) as `content_type`, accepting JSON; returns
/// the status code and the body (`null` when it is not JSON). Panics when no answer comes.
pub async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: &Value,
) -> (u16, Value) {
    let bytes = if body.is_null() { Vec::new() } else { body.to_string().into_bytes() };
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("Content-Type", content_type)
        .header("Accept", "application/json")
        .body(kube::client::Body::from(bytes))
        .expect("a valid request");
    let resp = tokio::time::timeout(ANSWER_TIMEOUT, client.send(req))
        .await
        .expect("answer within 20 s")
        .expect("request sent");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("the answer's body")
        .to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}
