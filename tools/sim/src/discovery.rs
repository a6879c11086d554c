//! Discovery (`/version`, `/api`, `/apis`, per group-version resource lists) and the minimal
//! OpenAPI v3 documents kubectl needs for `apply` (client-side and server-side).

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, StatusCode, header};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::resources::{RESOURCES, Resource, VERBS};
use crate::server::Query;

/// Kubernetes minor the simulator reports (the newest API level of the k8s-openapi in use).
pub const MINOR: &str = "37";
/// `gitVersion` reported at `/version`.
pub const GIT_VERSION: &str = "v1.37.0-kjob-sim";
// Bumped whenever a served OpenAPI document changes: kubectl caches documents by URL.
const OPENAPI_HASH: &str = "kjobsim0001";

fn json_ok(v: &Value) -> Response {
    let mut resp = (StatusCode::OK, serde_json::to_vec(v).unwrap_or_default()).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// The group-versions served, in discovery order.
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter() {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

fn resource_entries(r: &Resource) -> Vec<Value> {
    let mut main = json!({
        "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced(), "kind": r.kind, "verbs": VERBS,
    });
    if !r.short_names.is_empty() {
        main["shortNames"] = json!(r.short_names);
    }
    let mut out = vec![main];
    for sub in r.subresources {
        let name = format!("{}/{sub}", r.plural);
        let entry = match *sub {
            "status" => {
                json!({"name": name, "singularName": "", "namespaced": r.namespaced(), "kind": r.kind, "verbs": ["get", "patch", "update"]})
            }
            "binding" => {
                json!({"name": name, "singularName": "", "namespaced": true, "kind": "Binding", "verbs": ["create"]})
            }
            "eviction" => {
                json!({"name": name, "singularName": "", "namespaced": true, "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]})
            }
            "finalize" => {
                json!({"name": name, "singularName": "", "namespaced": false, "kind": r.kind, "verbs": ["update"]})
            }
            _ => continue,
        };
        out.push(entry);
    }
    out
}

fn resource_list(group: &str, version: &str) -> Option<Value> {
    let entries: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .flat_map(resource_entries)
        .collect();
    if entries.is_empty() {
        return None;
    }
    let gv = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": entries}),
    )
}

fn group_entry(group: &str) -> Value {
    let versions: Vec<Value> = group_versions()
        .into_iter()
        .filter(|(g, _)| *g == group)
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": versions, "preferredVersion": versions[0]})
}

fn version_info() -> Value {
    json!({
        "major": "1", "minor": MINOR, "emulationMajor": "1", "emulationMinor": MINOR,
        "gitVersion": GIT_VERSION, "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0",
        "compiler": "gc", "platform": "linux/amd64",
    })
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

fn openapi_index() -> Value {
    let mut paths = Map::new();
    for (g, v) in group_versions() {
        let p = gv_path(g, v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={OPENAPI_HASH}")}),
        );
    }
    json!({"paths": paths})
}

// One PATCH operation per object path: enough for kubectl to know the server validates fields
// (`fieldValidation`) and which patch types it takes. Strategic merge patch is deliberately not
// advertised: kubectl then computes it from its compiled-in types instead of looking for schemas.
fn openapi_document(group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    for r in RESOURCES.iter().filter(|r| r.group == group && r.version == version) {
        let prefix = format!("/{}", gv_path(group, version));
        let path = if r.namespaced() {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let param = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        let op = json!({
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk,
            "operationId": format!("patch{}", r.kind),
            "parameters": [param("dryRun"), param("fieldManager"), param("fieldValidation"), {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}],
            "requestBody": {"content": {
                "application/json-patch+json": {"schema": {"type": "object"}},
                "application/merge-patch+json": {"schema": {"type": "object"}},
                "application/apply-patch+yaml": {"schema": {"type": "object"}},
            }, "required": true},
            "responses": {"200": {"description": "OK"}, "201": {"description": "Created"}},
        });
        let get = json!({
            "x-kubernetes-action": "get",
            "x-kubernetes-group-version-kind": gvk,
            "operationId": format!("read{}", r.kind),
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(path, json!({"get": get, "patch": op}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

/// Serves discovery and OpenAPI paths; `None` when the path is not one of them.
pub fn handle(method: &Method, segs: &[&str], _q: &Query) -> Option<Response> {
    if method != Method::GET {
        return match segs {
            ["version" | "api" | "apis" | "openapi"] | ["openapi", ..] => {
                Some(ApiError::method_not_allowed().into_response())
            }
            _ => None,
        };
    }
    let v = match segs {
        ["version"] => version_info(),
        ["api"] => json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        }),
        ["apis"] => {
            let mut groups: Vec<&str> =
                group_versions().into_iter().map(|(g, _)| g).filter(|g| !g.is_empty()).collect();
            groups.dedup();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups.into_iter().map(group_entry).collect::<Vec<_>>()})
        }
        ["api", v] => resource_list("", v)?,
        ["apis", g] if group_versions().iter().any(|(gg, _)| gg == g) => {
            let mut e = group_entry(g);
            e["kind"] = json!("APIGroup");
            e["apiVersion"] = json!("v1");
            e
        }
        ["apis", g, v] => resource_list(g, v)?,
        ["openapi", "v3"] => openapi_index(),
        ["openapi", "v3", "api", v] => match openapi_document("", v) {
            Some(d) => d,
            None => return Some(ApiError::path_not_found().into_response()),
        },
        ["openapi", "v3", "apis", g, v] => match openapi_document(g, v) {
            Some(d) => d,
            None => return Some(ApiError::path_not_found().into_response()),
        },
        // The v2 document is asked for in protobuf; kubectl tolerates its absence once v3 works.
        ["openapi", ..] => return Some(ApiError::path_not_found().into_response()),
        _ => return None,
    };
    Some(json_ok(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resource_entry_has_the_fields_python_requires() {
        for (g, v) in group_versions() {
            let list = resource_list(g, v).unwrap();
            for e in list["resources"].as_array().unwrap() {
                for f in ["name", "singularName", "namespaced", "kind", "verbs"] {
                    assert!(e.get(f).is_some(), "{f} missing in {e}");
                }
            }
        }
    }

    #[test]
    fn openapi_index_points_at_served_documents() {
        let idx = openapi_index();
        let url = idx["paths"]["apis/batch/v1"]["serverRelativeURL"].as_str().unwrap();
        assert!(url.starts_with("/openapi/v3/apis/batch/v1?hash="));
        let doc = openapi_document("batch", "v1").unwrap();
        let op = &doc["paths"]["/apis/batch/v1/namespaces/{namespace}/jobs/{name}"]["patch"];
        assert_eq!(op["x-kubernetes-group-version-kind"]["kind"], "Job");
        assert!(
            op["requestBody"]["content"].get("application/strategic-merge-patch+json").is_none()
        );
    }
}
