//! The pure parts of `kjob-demo`: example loading, expectation matching and the live view.
//!
//! The binary (`src/main.rs`) starts the processes and drives these; everything here is
//! plain functions over Jobs, tested without any process.

pub mod examples;
pub mod expect;
pub mod view;

#[cfg(test)]
mod testutil;
