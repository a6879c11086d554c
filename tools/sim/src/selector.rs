//! Label and field selectors with the apimachinery grammar and the real server's error texts.
//!
//! Label selectors follow `labels.Parse` (`=`, `==`, `!=`, `in`, `notin`, exists, `!key`,
//! `>`/`<` integer comparisons) and `metav1.LabelSelector` (`matchLabels` + `matchExpressions`).
//! Field selectors follow `fields.ParseSelector` (`=`, `==`, `!=`, `\` escapes) and the
//! per-kind field label tables of the registries.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Errors from parsing or validating a selector; the server answers all of them with 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The selector text does not follow the grammar.
    #[error("{0}")]
    Parse(String),
    /// A key or value is not a valid label key/value.
    #[error("{0}")]
    InvalidValue(String),
    /// The field selector names a field the resource does not index (the message is the real
    /// server's, which differs by resource).
    #[error("{0}")]
    UnsupportedField(String),
    /// A `metav1.LabelSelector` JSON value is malformed.
    #[error("{0}")]
    InvalidLabelSelector(String),
}

/// Operator of one label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// `k=v` or `k==v`, or `in (..)`: the key exists and its value is in the set.
    In,
    /// `k!=v` or `notin (..)`: the key is absent or its value is not in the set.
    NotIn,
    /// `k`: the key exists.
    Exists,
    /// `!k`: the key does not exist.
    DoesNotExist,
    /// `k>n`: the key's value is an integer greater than n.
    GreaterThan,
    /// `k<n`: the key's value is an integer less than n.
    LessThan,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// Label key.
    pub key: String,
    /// Operator.
    pub op: Operator,
    /// Values (one for comparisons, none for exists/does-not-exist).
    pub values: BTreeSet<String>,
}

impl Requirement {
    /// Whether this requirement holds for a label set.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_value(labels.get(&self.key).map(String::as_str))
    }

    /// Whether this requirement holds given the value of its key (`None`: no such label).
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        match self.op {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(have) = value.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(want) = self.values.iter().next().and_then(|v| v.parse::<i64>().ok())
                else {
                    return false;
                };
                if self.op == Operator::GreaterThan { have > want } else { have < want }
            }
        }
    }
}

/// A label selector: the AND of its requirements. `None` requirements means "matches nothing"
/// (a nil `metav1.LabelSelector`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Option<Vec<Requirement>>,
}

impl Default for LabelSelector {
    fn default() -> Self {
        Self { requirements: Some(Vec::new()) }
    }
}

/// Tokens of the label selector lexer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Comma,
    Eq,
    DoubleEq,
    NotEq,
    Bang,
    Gt,
    Lt,
    In,
    NotIn,
    Open,
    Close,
    End,
}

impl Token {
    fn text(&self) -> String {
        match self {
            Token::Ident(s) => s.clone(),
            Token::Comma => ",".into(),
            Token::Eq => "=".into(),
            Token::DoubleEq => "==".into(),
            Token::NotEq => "!=".into(),
            Token::Bang => "!".into(),
            Token::Gt => ">".into(),
            Token::Lt => "<".into(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
            Token::End => String::new(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(input: &str) -> Vec<Token> {
    let chars: Vec<char> = input.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if is_special(c) {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let (tok, len) = match two.as_str() {
                "==" => (Token::DoubleEq, 2),
                "!=" => (Token::NotEq, 2),
                _ => match c {
                    '=' => (Token::Eq, 1),
                    '!' => (Token::Bang, 1),
                    '(' => (Token::Open, 1),
                    ')' => (Token::Close, 1),
                    ',' => (Token::Comma, 1),
                    '>' => (Token::Gt, 1),
                    _ => (Token::Lt, 1),
                },
            };
            out.push(tok);
            i += len;
            continue;
        }
        let start = i;
        while i < chars.len() && !chars[i].is_whitespace() && !is_special(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        out.push(match word.as_str() {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Ident(word),
        });
    }
    out.push(Token::End);
    out
}

/// Where the parser stands, as upstream's `ParserContext`: `in` and `notin` are operators only
/// where an operator is expected; everywhere else (keys, values, the start of a requirement)
/// they are plain words, so `grp=in`, `in in (in)` and `a in (x,notin)` parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self, ctx: Context) -> Token {
        let t = self.tokens[self.pos.min(self.tokens.len() - 1)].clone();
        match (ctx, t) {
            (Context::Values, t @ (Token::In | Token::NotIn)) => Token::Ident(t.text()),
            (_, t) => t,
        }
    }

    fn next(&mut self, ctx: Context) -> Token {
        let t = self.peek(ctx);
        self.pos += 1;
        t
    }

    fn parse(mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut reqs = Vec::new();
        loop {
            match self.peek(Context::Values) {
                Token::End => return Ok(reqs),
                Token::Ident(_) | Token::Bang => {
                    reqs.push(self.requirement()?);
                    match self.next(Context::Values) {
                        Token::End => return Ok(reqs),
                        Token::Comma => {
                            let after = self.peek(Context::Values);
                            if !matches!(after, Token::Ident(_) | Token::Bang) {
                                return Err(SelectorError::Parse(format!(
                                    "found '{}', expected: identifier after ','",
                                    after.text()
                                )));
                            }
                        }
                        t => {
                            return Err(SelectorError::Parse(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.text()
                            )));
                        }
                    }
                }
                t => {
                    return Err(SelectorError::Parse(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.text()
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let mut tok = self.next(Context::Values);
        let negated = tok == Token::Bang;
        if negated {
            tok = self.next(Context::Values);
        }
        let key = match tok {
            Token::Ident(k) => k,
            t => {
                return Err(SelectorError::Parse(format!(
                    "found '{}', expected: identifier",
                    t.text()
                )));
            }
        };
        validate_label_key(&key)?;
        // `!k` is complete by itself; whatever follows it (`!k=v`) is left to the caller, which
        // refuses it as upstream does ("found '=', expected: ',' or 'end of string'").
        if negated {
            return Ok(Requirement { key, op: Operator::DoesNotExist, values: BTreeSet::new() });
        }
        if matches!(self.peek(Context::Values), Token::End | Token::Comma) {
            return Ok(Requirement { key, op: Operator::Exists, values: BTreeSet::new() });
        }
        let tok = self.next(Context::KeyAndOperator);
        let op = match tok {
            Token::Eq | Token::DoubleEq | Token::In => Operator::In,
            Token::NotEq | Token::NotIn => Operator::NotIn,
            Token::Gt => Operator::GreaterThan,
            Token::Lt => Operator::LessThan,
            t => {
                return Err(SelectorError::Parse(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    t.text()
                )));
            }
        };
        let values = if matches!(tok, Token::In | Token::NotIn) {
            self.value_set()?
        } else {
            BTreeSet::from([self.exact_value()?])
        };
        if matches!(op, Operator::GreaterThan | Operator::LessThan) {
            let v = values.iter().next().cloned().unwrap_or_default();
            if v.parse::<i64>().is_err() {
                return Err(SelectorError::InvalidValue(format!(
                    "unable to parse requirement: values[0][{key}]: Invalid value: \"{v}\": for 'Gt', 'Lt' operators, the value must be an integer"
                )));
            }
        } else {
            for v in &values {
                validate_label_value(&key, v)?;
            }
        }
        Ok(Requirement { key, op, values })
    }

    /// The value of `k=v`, `k==v`, `k!=v`, `k>n`, `k<n` (upstream `parseExactValue`); `k=` with
    /// nothing after it is the empty value.
    fn exact_value(&mut self) -> Result<String, SelectorError> {
        if matches!(self.peek(Context::Values), Token::End | Token::Comma) {
            return Ok(String::new());
        }
        match self.next(Context::Values) {
            Token::Ident(v) => Ok(v),
            t => Err(SelectorError::Parse(format!("found '{}', expected: identifier", t.text()))),
        }
    }

    /// The `( .. )` of `in`/`notin` (upstream `parseValues` + `parseIdentifiersList`): `()` is
    /// the empty value, `(,a)`, `(a,)` and `(a,,b)` carry an empty value beside the others.
    fn value_set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        match self.next(Context::Values) {
            Token::Open => {}
            t => {
                return Err(SelectorError::Parse(format!("found '{}' expected: '('", t.text())));
            }
        }
        let first = self.peek(Context::Values);
        match first {
            Token::Close => {
                self.next(Context::Values);
                return Ok(BTreeSet::from([String::new()]));
            }
            Token::Ident(_) | Token::Comma => {}
            t => {
                return Err(SelectorError::Parse(format!(
                    "found '{}', expected: ',', ')' or identifier",
                    t.text()
                )));
            }
        }
        let mut values = BTreeSet::new();
        loop {
            match self.next(Context::Values) {
                Token::Ident(v) => {
                    values.insert(v);
                    match self.peek(Context::Values) {
                        Token::Comma => continue,
                        Token::Close => break,
                        t => {
                            return Err(SelectorError::Parse(format!(
                                "found '{}', expected: ',' or ')'",
                                t.text()
                            )));
                        }
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.insert(String::new());
                    }
                    match self.peek(Context::Values) {
                        Token::Close => {
                            values.insert(String::new());
                            break;
                        }
                        Token::Comma => {
                            self.next(Context::Values);
                            values.insert(String::new());
                        }
                        _ => {}
                    }
                }
                t => {
                    return Err(SelectorError::Parse(format!(
                        "found '{}', expected: ',', or identifier",
                        t.text()
                    )));
                }
            }
        }
        match self.next(Context::Values) {
            Token::Close => Ok(values),
            _ => Err(SelectorError::Parse(format!("found '{}', expected: ')'", first.text()))),
        }
    }
}

/// Checks a DNS-1123 subdomain (label-key prefix, object names); returns the problem, if any.
pub fn dns1123_subdomain_error(s: &str) -> Option<String> {
    if s.len() > 253 {
        return Some("must be no more than 253 characters".into());
    }
    let ok = !s.is_empty()
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if ok {
        None
    } else {
        Some("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into())
    }
}

/// Checks a DNS-1123 label (namespace names, hostnames); returns the problem, if any.
pub fn dns1123_label_error(s: &str) -> Option<String> {
    if s.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    let ok = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        None
    } else {
        Some("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".into())
    }
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Checks a qualified name (`[prefix/]name`: label keys, condition types, finalizers).
pub fn qualified_name_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if s.matches('/').count() > 1 {
        errs.push("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into());
        return errs;
    }
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push("prefix part must be non-empty".into());
        } else if let Some(e) = dns1123_subdomain_error(p) {
            errs.push(format!("prefix part {e}"));
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".into());
    } else if !is_qualified_name_part(name) {
        errs.push("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".into());
    }
    errs
}

/// Checks a label value (empty, or ≤63 qualified-name characters).
pub fn label_value_errors(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push("must be no more than 63 characters".into());
    }
    if !v.is_empty() && !is_qualified_name_part(v) {
        errs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".into());
    }
    errs
}

/// The parse error of a requirement whose `part` (`key`, `values[0][k]`) is the invalid `value`
/// for `errs`; `Ok` when there are none.
fn requirement_errors(part: &str, value: &str, errs: Vec<String>) -> Result<(), SelectorError> {
    if errs.is_empty() {
        return Ok(());
    }
    Err(SelectorError::InvalidValue(format!(
        "unable to parse requirement: {part}: Invalid value: \"{value}\": {}",
        errs.join("; ")
    )))
}

fn validate_label_key(key: &str) -> Result<(), SelectorError> {
    requirement_errors("key", key, qualified_name_errors(key))
}

fn validate_label_value(key: &str, v: &str) -> Result<(), SelectorError> {
    requirement_errors(&format!("values[0][{key}]"), v, label_value_errors(v))
}

impl LabelSelector {
    /// A selector that matches every label set.
    pub fn everything() -> Self {
        Self::default()
    }

    /// A selector that matches nothing (a nil `metav1.LabelSelector`).
    pub fn nothing() -> Self {
        Self { requirements: None }
    }

    /// Parses the string form (`a=b,c in (d,e),!f`). An empty string matches everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let parser = Parser { tokens: lex(s), pos: 0 };
        let reqs = parser.parse()?;
        Ok(Self { requirements: Some(reqs) })
    }

    /// Builds a selector from a `metav1.LabelSelector` JSON value; `null` matches nothing and
    /// `{}` matches everything, as `LabelSelectorAsSelector` does.
    pub fn from_json(v: &Value) -> Result<Self, SelectorError> {
        if v.is_null() {
            return Ok(Self::nothing());
        }
        let obj = v.as_object().ok_or_else(|| {
            SelectorError::InvalidLabelSelector("label selector must be an object".into())
        })?;
        let mut reqs = Vec::new();
        if let Some(ml) = obj.get("matchLabels").filter(|m| !m.is_null()) {
            let ml = ml.as_object().ok_or_else(|| {
                SelectorError::InvalidLabelSelector("matchLabels must be an object".into())
            })?;
            for (k, val) in ml {
                let val = val.as_str().ok_or_else(|| {
                    SelectorError::InvalidLabelSelector(format!(
                        "matchLabels[{k}] must be a string"
                    ))
                })?;
                validate_label_key(k)?;
                validate_label_value(k, val)?;
                reqs.push(Requirement {
                    key: k.clone(),
                    op: Operator::In,
                    values: BTreeSet::from([val.to_string()]),
                });
            }
        }
        if let Some(me) = obj.get("matchExpressions").filter(|m| !m.is_null()) {
            let me = me.as_array().ok_or_else(|| {
                SelectorError::InvalidLabelSelector("matchExpressions must be a list".into())
            })?;
            for expr in me {
                let key = expr.get("key").and_then(Value::as_str).unwrap_or_default();
                let op = expr.get("operator").and_then(Value::as_str).unwrap_or_default();
                let values: BTreeSet<String> = expr
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
                    .unwrap_or_default();
                validate_label_key(key)?;
                let op = match op {
                    "In" => Operator::In,
                    "NotIn" => Operator::NotIn,
                    "Exists" => Operator::Exists,
                    "DoesNotExist" => Operator::DoesNotExist,
                    other => {
                        return Err(SelectorError::InvalidLabelSelector(format!(
                            "\"{other}\" is not a valid label selector operator"
                        )));
                    }
                };
                match op {
                    Operator::In | Operator::NotIn if values.is_empty() => {
                        return Err(SelectorError::InvalidLabelSelector(
                            "for 'in', 'notin' operators, values set can't be empty".into(),
                        ));
                    }
                    Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                        return Err(SelectorError::InvalidLabelSelector(
                            "values set must be empty for exists and does not exist".into(),
                        ));
                    }
                    _ => {}
                }
                for v in &values {
                    validate_label_value(key, v)?;
                }
                reqs.push(Requirement { key: key.to_string(), op, values });
            }
        }
        Ok(Self { requirements: Some(reqs) })
    }

    /// Whether the selector matches a label set.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match &self.requirements {
            None => false,
            Some(reqs) => reqs.iter().all(|r| r.matches(labels)),
        }
    }

    /// Whether the selector matches the labels of an object (`metadata.labels`). Reads the
    /// labels in place: list and watch filters call this for every candidate object, so it
    /// must not copy them.
    pub fn matches_object(&self, obj: &Value) -> bool {
        let Some(reqs) = &self.requirements else { return false };
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        reqs.iter()
            .all(|r| r.matches_value(labels.and_then(|m| m.get(&r.key)).and_then(Value::as_str)))
    }

    /// A label `(key, value)` every matching object carries (the first single-value equality
    /// requirement), which a store can answer from an index instead of a scan.
    pub fn required_label(&self) -> Option<(&str, &str)> {
        self.requirements.as_ref()?.iter().find_map(|r| match (r.op, r.values.len()) {
            (Operator::In, 1) => r.values.first().map(|v| (r.key.as_str(), v.as_str())),
            _ => None,
        })
    }

    /// Whether the selector has no requirements (matches every label set).
    pub fn is_everything(&self) -> bool {
        self.requirements.as_ref().is_some_and(Vec::is_empty)
    }

    /// Whether the selector matches nothing (built from a nil `metav1.LabelSelector`).
    pub fn is_nothing(&self) -> bool {
        self.requirements.is_none()
    }

    /// The requirements, `None` for a match-nothing selector.
    pub fn requirements(&self) -> Option<&[Requirement]> {
        self.requirements.as_deref()
    }
}

/// The `metadata.labels` of an object as a map (missing or malformed → empty).
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect()
        })
        .unwrap_or_default()
}

/// Operator of one field requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOp {
    /// `f=v` / `f==v`.
    Equals,
    /// `f!=v`.
    NotEquals,
}

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// Field path (`metadata.name`, `status.phase`, ...).
    pub field: String,
    /// Operator.
    pub op: FieldOp,
    /// Unescaped value.
    pub value: String,
}

/// A field selector: the AND of its terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<FieldRequirement>,
}

const COMMON_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];
const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const JOB_FIELDS: &[&str] = &["status.successful"];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reportingController",
    "deprecatedSource",
];
const NAMESPACE_FIELDS: &[&str] = &["status.phase"];

/// kube-apiserver's message for a field selector on a field `kind` does not index.
fn unsupported_field_message(kind: &str, field: &str) -> String {
    match kind.to_ascii_lowercase().as_str() {
        "jobs" | "job" => format!("field label \"{field}\" not supported for Job"),
        "leases" | "lease" => format!(
            "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        ),
        _ => format!("field label not supported: {field}"),
    }
}

/// Field labels a kind supports beyond `metadata.name`/`metadata.namespace`. `kind` may be
/// the Kind (`Pod`) or the resource (`pods`); unknown kinds support only the common fields.
pub fn supported_fields(kind: &str) -> &'static [&'static str] {
    match kind.to_ascii_lowercase().as_str() {
        "pod" | "pods" => POD_FIELDS,
        "job" | "jobs" => JOB_FIELDS,
        "event" | "events" => EVENT_FIELDS,
        "namespace" | "namespaces" => NAMESPACE_FIELDS,
        _ => &[],
    }
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    parts.push(cur);
    parts
}

/// Finds the first unescaped operator in a term: returns (lhs, op, rhs).
fn split_term(term: &str) -> Option<(String, FieldOp, String)> {
    let bytes = term.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'!' if bytes.get(i + 1) == Some(&b'=') => {
                return Some((term[..i].into(), FieldOp::NotEquals, term[i + 2..].into()));
            }
            b'=' if bytes.get(i + 1) == Some(&b'=') => {
                return Some((term[..i].into(), FieldOp::Equals, term[i + 2..].into()));
            }
            b'=' => return Some((term[..i].into(), FieldOp::Equals, term[i + 1..].into())),
            _ => i += 1,
        }
    }
    None
}

fn unescape_field_value(v: &str) -> Result<String, SelectorError> {
    let mut out = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(SelectorError::Parse(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    )));
                }
                None => {
                    return Err(SelectorError::Parse(
                        "invalid field selector: unterminated escape sequence".into(),
                    ));
                }
            }
        } else if c == ',' || c == '=' {
            return Err(SelectorError::Parse(format!(
                "invalid field selector: unescaped reserved character: {c}"
            )));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses `f=v,g!=w`. An empty string matches everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { terms });
        }
        for part in split_unescaped(s, ',') {
            if part.is_empty() {
                continue;
            }
            let Some((field, op, value)) = split_term(&part) else {
                return Err(SelectorError::Parse(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let value = unescape_field_value(&value)?;
            terms.push(FieldRequirement { field: field.trim().to_string(), op, value });
        }
        Ok(Self { terms })
    }

    /// Refuses fields the kind does not index, with the real server's message (kube-apiserver
    /// 1.37: Jobs name their Kind, Leases list what they do support, the rest use the generic
    /// conversion error).
    pub fn validate_for(&self, kind: &str) -> Result<(), SelectorError> {
        let extra = supported_fields(kind);
        for t in &self.terms {
            if !COMMON_FIELDS.contains(&t.field.as_str()) && !extra.contains(&t.field.as_str()) {
                return Err(SelectorError::UnsupportedField(unsupported_field_message(
                    kind, &t.field,
                )));
            }
        }
        Ok(())
    }

    /// Whether the selector has no terms.
    pub fn is_everything(&self) -> bool {
        self.terms.is_empty()
    }

    /// The terms.
    pub fn terms(&self) -> &[FieldRequirement] {
        &self.terms
    }

    /// The value required for `field` by an `=` term, if any (lets a store use an index).
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && t.op == FieldOp::Equals)
            .map(|t| t.value.as_str())
    }

    /// Whether an object (JSON as stored) satisfies every term; missing fields read as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|t| {
            let have = field_value(obj, &t.field);
            match t.op {
                FieldOp::Equals => have == t.value,
                FieldOp::NotEquals => have != t.value,
            }
        })
    }
}

fn str_at(obj: &Value, ptr: &str) -> Option<String> {
    obj.pointer(ptr).and_then(|v| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    })
}

/// The value of a field label on an object, as the registries' `GetAttrs` compute it. Event
/// fields are read from the core/v1 name first and the events.k8s.io/v1 name second, so one
/// stored shape serves both views.
pub fn field_value(obj: &Value, field: &str) -> String {
    let first = |ptrs: &[&str]| ptrs.iter().find_map(|p| str_at(obj, p)).unwrap_or_default();
    match field {
        "metadata.name" => first(&["/metadata/name"]),
        "metadata.namespace" => first(&["/metadata/namespace"]),
        "spec.hostNetwork" => {
            let b = obj.pointer("/spec/hostNetwork").and_then(Value::as_bool).unwrap_or(false);
            b.to_string()
        }
        "status.podIP" => first(&["/status/podIPs/0/ip", "/status/podIP"]),
        "status.successful" => {
            let n = obj.pointer("/status/succeeded").and_then(Value::as_i64).unwrap_or(0);
            n.to_string()
        }
        "source" | "deprecatedSource" => first(&[
            "/source/component",
            "/deprecatedSource/component",
            "/reportingComponent",
            "/reportingController",
        ]),
        "reportingComponent" | "reportingController" => {
            first(&["/reportingComponent", "/reportingController"])
        }
        f if f.starts_with("involvedObject.") || f.starts_with("regarding.") => {
            let leaf = f.split_once('.').map(|(_, l)| l).unwrap_or_default();
            first(&[&format!("/involvedObject/{leaf}"), &format!("/regarding/{leaf}")])
        }
        f => {
            let ptr = format!("/{}", f.replace('.', "/"));
            first(&[&ptr])
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// Each selector parses and matches `l` as its case says.
    fn assert_matches(l: &BTreeMap<String, String>, cases: &[(&str, bool)]) {
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(l), *want, "selector {sel:?}");
        }
    }

    #[test]
    fn label_grammar_table() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("n", "7"), ("empty", "")]);
        assert_matches(
            &l,
            &[
                ("", true),
                ("app=web", true),
                ("app==web", true),
                ("app=db", false),
                ("app!=db", true),
                ("app!=web", false),
                ("missing!=x", true),
                ("app in (web,db)", true),
                ("app in (db)", false),
                ("app notin (db)", true),
                ("app notin (web)", false),
                ("missing notin (x)", true),
                ("missing in (x)", false),
                ("app", true),
                ("missing", false),
                ("!missing", true),
                ("!app", false),
                ("app=web,tier=front", true),
                ("app=web,tier=back", false),
                (" app = web , tier in ( front , back ) ", true),
                ("n>5", true),
                ("n<5", false),
                ("n>7", false),
                ("missing>1", false),
                ("empty=", true),
                ("app=", false),
                ("example.com/key!=x", true),
            ],
        );
    }

    #[test]
    fn label_grammar_errors() {
        for bad in [
            "app in web",
            "app in (web",
            "=web",
            "app=web,",
            "app web",
            "Bad_Key_=x",
            "a/b/c=x",
            "app=bad value!",
            "n>x",
            "-bad=x",
            "app=web)",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?} should not parse");
        }
        let err = LabelSelector::parse("app in web").unwrap_err().to_string();
        assert!(err.contains("expected: '('"), "{err}");
        let err = LabelSelector::parse("-bad=x").unwrap_err().to_string();
        assert!(err.starts_with("unable to parse requirement:"), "{err}");
    }

    /// Cases of upstream's `TestSelectorParse` and `TestSetSelectorParser`
    /// (apimachinery `labels/selector_test.go`), plus `in`/`notin` as keys and values: the
    /// lexer always makes them keywords, and the parser reads them as words wherever a key or
    /// value is expected.
    #[test]
    fn upstream_parser_cases() {
        let accepted = [
            "x=a,y=b,z=c",
            "",
            "x!=a,y=b",
            "x=",
            "x= ",
            "x=,z= ",
            "x= ,z= ",
            "!x",
            "x>1",
            "x>1,z<5",
            "x>1,z<5,a>-1",
            "\rx",
            "this-is-a-dns.domain.com/key-with-dash",
            "this-is-another-dns.domain.com/key-with-dash in (so,what)",
            "0.1.2.domain/99 notin (10.10.100.1, tick.tock.clock)",
            "foo  in\t (abc)",
            "x notin\n (abc)",
            "x  notin\t\t\t(abc,def)",
            "x in (abc,def)",
            "x in (abc,)",
            "x in ()",
            "x notin (abc,,def),bar,z in (),w",
            "x,y in (a)",
            "x=a",
            "x<7",
            "x=a,y!=b",
            "x=a,y!=b,z in (h,i,j)",
            "x notin ( )",
            "x notin (, a)",
            "a ",
            "a in (x,y,notin, z,in)",
            // `in` and `notin` as values and keys.
            "grp=in",
            "grp==notin",
            "grp!=in",
            "in",
            "!notin",
            "in=x",
            "in in (in)",
            "notin notin (notin,in)",
            "a,in,notin",
        ];
        for sel in accepted {
            LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel:?} should parse: {e}"));
        }
        let refused = [
            "x=a||y=b",
            "x==a==b",
            "!x=a",
            "x<a",
            "x>1.1",
            "x,,y",
            ",x,y",
            "x nott in (y)",
            "a in (xyz),",
            "a in (xyz)b notin ()",
            "a in (xyz abc)",
            "a notin(",
            "a (",
            "(",
            "in (",
            "x in in",
            "x in (,,)",
        ];
        for sel in refused {
            assert!(LabelSelector::parse(sel).is_err(), "{sel:?} should not parse");
        }
        let err = LabelSelector::parse("!x=a").unwrap_err().to_string();
        assert_eq!(err, "found '=', expected: ',' or 'end of string'");
        let err = LabelSelector::parse("a in (xyz abc)").unwrap_err().to_string();
        assert_eq!(err, "found 'abc', expected: ',' or ')'");
    }

    #[test]
    fn in_and_notin_as_words_match() {
        let l = labels(&[("grp", "in"), ("in", "notin")]);
        assert_matches(
            &l,
            &[
                ("grp=in", true),
                ("grp=notin", false),
                ("grp!=in", false),
                ("grp in (in,notin)", true),
                ("grp notin (in)", false),
                ("in", true),
                ("!in", false),
                ("!notin", true),
                ("in=notin", true),
                ("in in (notin)", true),
                ("in notin (notin)", false),
                ("a in (x,y,notin, z,in),grp", false),
            ],
        );
        let set = LabelSelector::parse("a in (x,y,notin, z,in)").unwrap();
        let values = &set.requirements().unwrap()[0].values;
        assert_eq!(values, &["in", "notin", "x", "y", "z"].map(String::from).into());
        let set = LabelSelector::parse("x notin (abc,,def)").unwrap();
        let values = &set.requirements().unwrap()[0].values;
        assert_eq!(values, &["", "abc", "def"].map(String::from).into());
    }

    #[test]
    fn everything_and_nothing() {
        assert!(LabelSelector::parse("").unwrap().is_everything());
        assert!(!LabelSelector::parse("a=b").unwrap().is_everything());
        let nothing = LabelSelector::from_json(&Value::Null).unwrap();
        assert!(!nothing.matches(&labels(&[])));
        assert!(nothing.is_nothing());
        let all = LabelSelector::from_json(&json!({})).unwrap();
        assert!(all.is_everything());
        assert!(all.matches(&labels(&[("x", "y")])));
    }

    #[test]
    fn label_selector_json() {
        let sel = LabelSelector::from_json(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front", "back"]},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "team", "operator": "Exists"},
                {"key": "legacy", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "front"), ("team", "a")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "front")])));
        assert!(!sel.matches(&labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("team", "a"),
            ("env", "prod")
        ])));
        assert!(!sel.matches(&labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("team", "a"),
            ("legacy", "1")
        ])));
        for bad in [
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
            json!({"matchLabels": {"bad key": "x"}}),
            json!({"matchLabels": {"a": 1}}),
        ] {
            assert!(LabelSelector::from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_selector_parse_and_match() {
        let pod = json!({
            "metadata": {"name": "p1", "namespace": "ns"},
            "spec": {"nodeName": "n1", "restartPolicy": "Never"},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.1"}]}
        });
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("metadata.name=p1", true),
            ("metadata.name==p1", true),
            ("metadata.name!=p1", false),
            ("metadata.name=p1,metadata.namespace=ns", true),
            ("metadata.name=p1,metadata.namespace=other", false),
            ("spec.nodeName=n1", true),
            ("spec.nodeName=", false),
            ("status.phase!=Succeeded", true),
            ("status.podIP=10.0.0.1", true),
            ("spec.hostNetwork=false", true),
            ("status.nominatedNodeName=", true),
        ];
        for (sel, want) in cases {
            let s = FieldSelector::parse(sel).unwrap();
            s.validate_for("pods").unwrap();
            assert_eq!(s.matches(&pod), *want, "{sel}");
        }
        let unscheduled = json!({"metadata": {"name": "p2"}, "spec": {}});
        assert!(FieldSelector::parse("spec.nodeName=").unwrap().matches(&unscheduled));
    }

    #[test]
    fn field_selector_escapes_and_errors() {
        let s = FieldSelector::parse(r"metadata.name=a\,b\=c\\d").unwrap();
        assert_eq!(s.terms()[0].value, r"a,b=c\d");
        assert!(s.matches(&json!({"metadata": {"name": "a,b=c\\d"}})));
        assert!(FieldSelector::parse("metadata.name").is_err());
        assert!(FieldSelector::parse(r"metadata.name=a\x").is_err());
        assert_eq!(s.required_value("metadata.name"), Some(r"a,b=c\d"));
    }

    #[test]
    fn field_support_per_kind() {
        let s = FieldSelector::parse("spec.foo=x").unwrap();
        assert_eq!(
            s.validate_for("pods").unwrap_err().to_string(),
            "field label not supported: spec.foo"
        );
        let phase = FieldSelector::parse("status.phase=Running").unwrap();
        assert!(phase.validate_for("Pod").is_ok());
        assert_eq!(
            phase.validate_for("jobs").unwrap_err().to_string(),
            r#"field label "status.phase" not supported for Job"#
        );
        assert!(phase.validate_for("namespaces").is_ok());
        assert!(phase.validate_for("leases").is_err());
        let succ = FieldSelector::parse("status.successful=2").unwrap();
        succ.validate_for("jobs").unwrap();
        assert!(succ.matches(&json!({"status": {"succeeded": 2}})));
        assert!(!succ.matches(&json!({"status": {}})));
        assert!(FieldSelector::parse("status.successful=0").unwrap().matches(&json!({})));
        assert!(FieldSelector::parse("metadata.name=x").unwrap().validate_for("leases").is_ok());
    }

    #[test]
    fn event_fields_both_shapes() {
        let core = json!({"involvedObject": {"kind": "Job", "name": "pi", "uid": "u1"},
            "source": {"component": "job-controller"}, "reason": "Completed", "type": "Normal"});
        let new = json!({"regarding": {"kind": "Job", "name": "pi", "uid": "u1"},
            "reportingController": "job-controller", "reason": "Completed", "type": "Normal"});
        for sel in [
            "involvedObject.kind=Job,involvedObject.name=pi,involvedObject.uid=u1",
            "regarding.name=pi",
            "source=job-controller",
            "reason=Completed,type=Normal",
        ] {
            let s = FieldSelector::parse(sel).unwrap();
            s.validate_for("events").unwrap();
            assert!(s.matches(&core), "{sel} core");
            assert!(s.matches(&new), "{sel} new");
        }
        assert!(!FieldSelector::parse("type=Warning").unwrap().matches(&core));
    }

    #[test]
    fn name_validators() {
        assert!(dns1123_subdomain_error("a.b-c").is_none());
        assert!(dns1123_subdomain_error("A").is_some());
        assert!(dns1123_subdomain_error(&"a".repeat(254)).is_some());
        assert!(dns1123_label_error("a.b").is_some());
        assert!(qualified_name_errors("example.com/Foo_bar").is_empty());
        assert!(!qualified_name_errors("/foo").is_empty());
        assert!(!qualified_name_errors("foo-").is_empty());
        assert!(label_value_errors("").is_empty());
        assert!(!label_value_errors(&"a".repeat(64)).is_empty());
    }
}
