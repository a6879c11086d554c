//! Field sets as structured-merge-diff keeps them (`fieldpath.Set`) and their `FieldsV1`
//! encoding: `f:<field>`, `k:{"key":value}` for an element of a keyed list, `v:<json>` for an
//! element of a set list, `.` for "the element itself" when it also has children.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pe {
    /// A field of a struct or a key of a map: `f:name`.
    Field(String),
    /// An element of a keyed list, by its key fields (sorted by name): `k:{"name":"c"}`.
    Key(Vec<(String, Scalar)>),
    /// An element of a set list, by its value: `v:"x"`.
    Value(Scalar),
    /// An element of a list by position (lists of neither kind): `i:0`.
    Index(usize),
}

/// A JSON value ordered as structured-merge-diff orders values (numbers numerically, strings
/// bytewise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scalar(pub Value);

impl Ord for Scalar {
    fn cmp(&self, other: &Self) -> Ordering {
        fn rank(v: &Value) -> u8 {
            match v {
                Value::Null => 0,
                Value::Number(_) => 1,
                Value::String(_) => 2,
                Value::Bool(_) => 3,
                Value::Array(_) => 4,
                Value::Object(_) => 5,
            }
        }
        match (&self.0, &other.0) {
            (Value::Number(a), Value::Number(b)) => {
                let (a, b) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
                a.partial_cmp(&b).unwrap_or(Ordering::Equal)
            }
            (Value::String(a), Value::String(b)) => a.cmp(b),
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            (a, b) if rank(a) != rank(b) => rank(a).cmp(&rank(b)),
            (a, b) => a.to_string().cmp(&b.to_string()),
        }
    }
}

impl PartialOrd for Scalar {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Pe {
    /// The `FieldsV1` key of this step.
    fn encode(&self) -> String {
        match self {
            Pe::Field(f) => format!("f:{f}"),
            Pe::Key(k) => {
                let m: Map<String, Value> =
                    k.iter().map(|(n, v)| (n.clone(), v.0.clone())).collect();
                format!("k:{}", Value::Object(m))
            }
            Pe::Value(v) => format!("v:{}", v.0),
            Pe::Index(i) => format!("i:{i}"),
        }
    }

    fn decode(s: &str) -> Option<Pe> {
        let (tag, rest) = s.split_once(':')?;
        Some(match tag {
            "f" => Pe::Field(rest.to_owned()),
            "k" => {
                let Value::Object(m) = serde_json::from_str(rest).ok()? else { return None };
                let mut k: Vec<(String, Scalar)> =
                    m.into_iter().map(|(n, v)| (n, Scalar(v))).collect();
                k.sort_by(|a, b| a.0.cmp(&b.0));
                Pe::Key(k)
            }
            "v" => Pe::Value(Scalar(serde_json::from_str(rest).ok()?)),
            "i" => Pe::Index(rest.parse().ok()?),
            _ => return None,
        })
    }

    /// The step as `Path.String()` prints it in conflict messages: `.name`, `[name="c"]`,
    /// `[="x"]`, `[0]`.
    fn display(&self) -> String {
        match self {
            Pe::Field(f) => format!(".{f}"),
            Pe::Key(k) => {
                let parts: Vec<String> = k.iter().map(|(n, v)| format!("{n}={}", v.0)).collect();
                format!("[{}]", parts.join(","))
            }
            Pe::Value(v) => format!("[={}]", v.0),
            Pe::Index(i) => format!("[{i}]"),
        }
    }
}

/// A node of a set: whether the path itself is in the set, and the set below it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    /// The path ending here is a member.
    pub member: bool,
    /// Members below this path.
    pub children: Set,
}

/// A set of field paths, as a tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Set {
    nodes: BTreeMap<Pe, Node>,
}

impl Set {
    /// Whether no path is a member.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node at `pe`, if any member lies at or below it.
    pub fn get(&self, pe: &Pe) -> Option<&Node> {
        self.nodes.get(pe)
    }

    /// Whether the one-step path `pe` is a member.
    pub fn has(&self, pe: &Pe) -> bool {
        self.nodes.get(pe).is_some_and(|n| n.member)
    }

    /// Whether the path `path` is a member.
    pub fn has_path(&self, path: &[Pe]) -> bool {
        match path {
            [] => false,
            [pe] => self.has(pe),
            [pe, rest @ ..] => self.nodes.get(pe).is_some_and(|n| n.children.has_path(rest)),
        }
    }

    /// Adds `pe` (as a member when `member`) with `children` below it; empty additions are
    /// ignored.
    pub fn insert(&mut self, pe: Pe, member: bool, children: Set) {
        if !member && children.is_empty() {
            return;
        }
        let node = self.nodes.entry(pe).or_default();
        node.member |= member;
        node.children.union_with(children);
    }

    /// Adds the path `path` as a member.
    pub fn insert_path(&mut self, path: &[Pe]) {
        let Some((first, rest)) = path.split_first() else { return };
        let node = self.nodes.entry(first.clone()).or_default();
        if rest.is_empty() {
            node.member = true;
        } else {
            node.children.insert_path(rest);
        }
    }

    /// Removes the path `path` from the members (what lies below it stays).
    pub fn remove_path(&mut self, path: &[Pe]) {
        let Some((first, rest)) = path.split_first() else { return };
        let Some(node) = self.nodes.get_mut(first) else { return };
        if rest.is_empty() {
            node.member = false;
        } else {
            node.children.remove_path(rest);
        }
        if !node.member && node.children.is_empty() {
            self.nodes.remove(first);
        }
    }

    /// Removes `pe` and everything below it.
    pub fn remove_subtree(&mut self, pe: &Pe) {
        self.nodes.remove(pe);
    }

    /// `self ∪ other`.
    pub fn union_with(&mut self, other: Set) {
        for (pe, n) in other.nodes {
            self.insert(pe, n.member, n.children);
        }
    }

    /// `self ∪ other`, by reference.
    pub fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.union_with(other.clone());
        out
    }

    /// `self ∖ other`: paths that are members here and not there.
    pub fn difference(&self, other: &Set) -> Set {
        let mut out = Set::default();
        for (pe, n) in &self.nodes {
            match other.nodes.get(pe) {
                None => out.insert(pe.clone(), n.member, n.children.clone()),
                Some(o) => out.insert(
                    pe.clone(),
                    n.member && !o.member,
                    n.children.difference(&o.children),
                ),
            }
        }
        out
    }

    /// `self ∩ other`.
    pub fn intersection(&self, other: &Set) -> Set {
        let mut out = Set::default();
        for (pe, n) in &self.nodes {
            if let Some(o) = other.nodes.get(pe) {
                out.insert(pe.clone(), n.member && o.member, n.children.intersection(&o.children));
            }
        }
        out
    }

    /// Every member path, in set order.
    pub fn paths(&self) -> Vec<Vec<Pe>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<Pe>, out: &mut Vec<Vec<Pe>>) {
        for (pe, n) in &self.nodes {
            prefix.push(pe.clone());
            if n.member {
                out.push(prefix.clone());
            }
            n.children.collect(prefix, out);
            prefix.pop();
        }
    }

    /// The top-level steps with their nodes, in set order.
    pub fn nodes(&self) -> impl Iterator<Item = (&Pe, &Node)> {
        self.nodes.iter()
    }

    /// The `FieldsV1` JSON of this set.
    pub fn to_fields_v1(&self) -> Value {
        Value::Object(self.emit(false))
    }

    fn emit(&self, include_self: bool) -> Map<String, Value> {
        let mut m = Map::new();
        if include_self && !self.nodes.is_empty() {
            m.insert(".".into(), Value::Object(Map::new()));
        }
        for (pe, n) in &self.nodes {
            m.insert(pe.encode(), Value::Object(n.children.emit(n.member)));
        }
        m
    }

    /// Parses `FieldsV1` JSON; `None` when it is not a valid encoding.
    pub fn from_fields_v1(v: &Value) -> Option<Set> {
        let Value::Object(m) = v else { return None };
        let mut out = Set::default();
        for (k, child) in m {
            if k == "." {
                continue;
            }
            let pe = Pe::decode(k)?;
            let Value::Object(cm) = child else { return None };
            let children = Set::from_fields_v1(child)?;
            let member = cm.is_empty() || cm.contains_key(".");
            out.nodes.insert(pe, Node { member, children });
        }
        Some(out)
    }
}

/// A path as conflict messages print it: `.metadata.labels.a`.
pub fn display_path(path: &[Pe]) -> String {
    path.iter().map(Pe::display).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn f(name: &str) -> Pe {
        Pe::Field(name.into())
    }

    #[test]
    fn fields_v1_round_trip_with_self_markers() {
        let v = json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}}},
                       "f:finalizers": {"v:\"x\"": {}}}});
        let s = Set::from_fields_v1(&v).unwrap();
        assert_eq!(s.to_fields_v1(), v);
        let labels = &s.get(&f("metadata")).unwrap().children;
        assert!(labels.has(&f("labels")) && !s.has(&f("metadata")));
        assert!(Set::from_fields_v1(&json!({"x:y": {}})).is_none());
    }

    #[test]
    fn set_algebra() {
        let mut a = Set::default();
        a.insert_path(&[f("spec"), f("a")]);
        a.insert_path(&[f("spec"), f("b")]);
        let mut b = Set::default();
        b.insert_path(&[f("spec"), f("b")]);
        b.insert_path(&[f("spec")]);
        assert_eq!(a.difference(&b).paths(), vec![vec![f("spec"), f("a")]]);
        assert_eq!(a.intersection(&b).paths(), vec![vec![f("spec"), f("b")]]);
        assert_eq!(a.union(&b).paths().len(), 3);
        assert_eq!(display_path(&[f("metadata"), f("labels"), f("x")]), ".metadata.labels.x");
        let key = Pe::Key(vec![("name".into(), Scalar(json!("c")))]);
        assert_eq!(display_path(&[f("spec"), key]), ".spec[name=\"c\"]");
        let mut c = a.clone();
        c.remove_path(&[f("spec"), f("a")]);
        c.remove_path(&[f("spec"), f("b")]);
        assert!(c.is_empty());
    }
}
