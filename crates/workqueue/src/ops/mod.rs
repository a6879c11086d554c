//! The store's operations, one module per concern, each script directly above the method that
//! runs it (as asynq's `rdb.go` does), with a `KEYS` / `ARGV` header, its keys from
//! [`crate::keys`] and its reply read into named fields through [`crate::reply::Fields`].

mod add;
mod done;
mod expectations;
mod lease;
mod maintain;
mod records;
mod stats;

pub(crate) use add::Taker;

/// Milliseconds of `d` as a script argument.
pub(crate) fn ms_arg(d: std::time::Duration) -> Vec<u8> {
    crate::store::ms(d).to_string().into_bytes()
}

/// A number as a script argument.
pub(crate) fn num_arg(n: impl std::fmt::Display) -> Vec<u8> {
    n.to_string().into_bytes()
}
