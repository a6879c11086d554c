//! Reading script replies by name: a script returns nested arrays of integers and strings, and
//! each caller reads them into a struct with named fields through [`Fields`], so a reply of
//! another shape is a [`WqError::Protocol`] that names the script and the field, never an index
//! panic or a silent default.

use redis::Value;

use crate::WqError;

/// A cursor over one array reply (or a nested array), field by field, in the script's order.
pub(crate) struct Fields<'a> {
    /// What is being read, for errors (`"lease"`, `"lease item"`).
    what: &'static str,
    items: &'a [Value],
    next: usize,
}

impl<'a> Fields<'a> {
    /// Reads `v` as an array reply of `what`.
    pub(crate) fn new(what: &'static str, v: &'a Value) -> Result<Self, WqError> {
        match v {
            Value::Array(items) => Ok(Self { what, items, next: 0 }),
            other => Err(WqError::Protocol(format!("{what}: expected an array, got {other:?}"))),
        }
    }

    fn error(&self, field: &str, problem: impl std::fmt::Display) -> WqError {
        WqError::Protocol(format!("{} reply, field {field} (#{}): {problem}", self.what, self.next))
    }

    fn take(&mut self, field: &str) -> Result<&'a Value, WqError> {
        let v = self.items.get(self.next).ok_or_else(|| {
            self.error(field, format!("missing (reply has {})", self.items.len()))
        })?;
        self.next += 1;
        Ok(v)
    }

    /// An integer (Lua numbers arrive as integers, numeric strings are accepted).
    pub(crate) fn int(&mut self, field: &str) -> Result<i64, WqError> {
        let v = self.take(field)?;
        match v {
            Value::Int(i) => Ok(*i),
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| self.error(field, format!("not an integer: {v:?}"))),
            other => Err(self.error(field, format!("not an integer: {other:?}"))),
        }
    }

    /// An integer where -1 means "none".
    pub(crate) fn opt(&mut self, field: &str) -> Result<Option<i64>, WqError> {
        match self.int(field)? {
            -1 => Ok(None),
            v if v >= 0 => Ok(Some(v)),
            v => Err(self.error(field, format!("{v} is neither -1 nor a time"))),
        }
    }

    /// A count (a non-negative integer that fits a u32).
    pub(crate) fn count(&mut self, field: &str) -> Result<u32, WqError> {
        let v = self.int(field)?;
        u32::try_from(v).map_err(|_| self.error(field, format!("{v} is not a count")))
    }

    /// A non-negative integer as u64.
    pub(crate) fn u64(&mut self, field: &str) -> Result<u64, WqError> {
        let v = self.int(field)?;
        u64::try_from(v).map_err(|_| self.error(field, format!("{v} is not a count")))
    }

    /// A 0/1 flag.
    pub(crate) fn flag(&mut self, field: &str) -> Result<bool, WqError> {
        match self.int(field)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.error(field, format!("{v} is not 0 or 1"))),
        }
    }

    /// A string's bytes.
    pub(crate) fn bytes(&mut self, field: &str) -> Result<Vec<u8>, WqError> {
        let v = self.take(field)?;
        match v {
            Value::BulkString(b) => Ok(b.clone()),
            Value::SimpleString(s) => Ok(s.clone().into_bytes()),
            Value::Int(i) => Ok(i.to_string().into_bytes()),
            other => Err(self.error(field, format!("not a string: {other:?}"))),
        }
    }

    /// A UTF-8 string.
    pub(crate) fn string(&mut self, field: &str) -> Result<String, WqError> {
        let b = self.bytes(field)?;
        String::from_utf8(b).map_err(|_| self.error(field, "not UTF-8"))
    }

    /// A nested array, read with its own cursor.
    pub(crate) fn array(&mut self, field: &'static str) -> Result<Fields<'a>, WqError> {
        let v = self.take(field)?;
        match v {
            Value::Array(items) => Ok(Fields { what: field, items, next: 0 }),
            other => Err(self.error(field, format!("not an array: {other:?}"))),
        }
    }

    /// The fields not read yet, each as a nested array of `what` (the repeated tail of a
    /// reply: one per leased item, one per Done).
    pub(crate) fn rest(self, what: &'static str) -> Result<Vec<Fields<'a>>, WqError> {
        self.items[self.next..]
            .iter()
            .map(|v| match v {
                Value::Array(items) => Ok(Fields { what, items, next: 0 }),
                other => Err(WqError::Protocol(format!(
                    "{} reply: expected {what} arrays, got {other:?}",
                    self.what
                ))),
            })
            .collect()
    }

    /// Fields not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.items.len().saturating_sub(self.next)
    }
}

/// A script's reply read as `Self`; a reply of another shape is a [`WqError::Protocol`] naming
/// the script (`what`).
pub(crate) trait Reply: Sized {
    /// Reads reply `v` of script `what`.
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError>;
}

/// The reply as it came (callers that read it themselves).
impl Reply for Value {
    fn read(_: &'static str, v: &Value) -> Result<Self, WqError> {
        Ok(v.clone())
    }
}

/// A reply nobody reads (scripts that only write).
impl Reply for () {
    fn read(_: &'static str, _: &Value) -> Result<Self, WqError> {
        Ok(())
    }
}

/// One number.
impl Reply for i64 {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        int(what, v)
    }
}

/// A 0/1 answer.
impl Reply for bool {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        match int(what, v)? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(WqError::Protocol(format!("{what}: {n} is not 0 or 1"))),
        }
    }
}

/// A count.
impl Reply for u32 {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        let n = int(what, v)?;
        u32::try_from(n).map_err(|_| WqError::Protocol(format!("{what}: {n} is not a count")))
    }
}

/// A value, or nil for none.
impl Reply for Option<Vec<u8>> {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        match v {
            Value::Nil => Ok(None),
            Value::BulkString(b) => Ok(Some(b.clone())),
            other => Err(WqError::Protocol(format!("{what}: expected a value, got {other:?}"))),
        }
    }
}

/// An integer reply (scripts that return one number).
pub(crate) fn int(what: &'static str, v: &Value) -> Result<i64, WqError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(WqError::Protocol(format!("{what}: expected an integer, got {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn fields_are_read_in_order_by_name() {
        let v = Value::Array(vec![
            Value::Int(7),
            Value::Int(-1),
            bulk("12"),
            bulk("id"),
            Value::Array(vec![Value::Int(1)]),
        ]);
        let mut f = Fields::new("t", &v).unwrap();
        assert_eq!(f.int("a").unwrap(), 7);
        assert_eq!(f.opt("b").unwrap(), None);
        assert_eq!(f.count("c").unwrap(), 12);
        assert_eq!(f.string("d").unwrap(), "id");
        assert!(f.array("e").unwrap().flag("x").unwrap());
        assert_eq!(f.remaining(), 0);
    }

    #[test]
    fn a_malformed_reply_names_the_script_and_the_field() {
        let v = Value::Array(vec![Value::Int(1)]);
        let mut f = Fields::new("lease", &v).unwrap();
        f.int("now").unwrap();
        let e = f.int("next_due").unwrap_err().to_string();
        assert!(e.contains("lease reply, field next_due (#1): missing"), "{e}");
        let v = Value::Array(vec![Value::Int(-5), bulk("x"), Value::Int(2)]);
        let mut f = Fields::new("done", &v).unwrap();
        assert!(f.count("n").unwrap_err().to_string().contains("-5 is not a count"));
        assert!(f.int("w").unwrap_err().to_string().contains("not an integer"));
        assert!(f.flag("b").unwrap_err().to_string().contains("not 0 or 1"));
        assert!(Fields::new("x", &Value::Nil).is_err());
    }
}
