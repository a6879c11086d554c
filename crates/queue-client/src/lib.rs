//! Typed client of kjob-queue with retries and backoff
