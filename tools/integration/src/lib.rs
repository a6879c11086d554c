//! Integration tests only: see tests/. This crate ships nothing.
