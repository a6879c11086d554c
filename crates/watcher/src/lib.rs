//! kjob-watcher: informer events to enqueue requests, as the upstream Job controller handlers
//! decide them.

pub mod handlers;
pub mod model;
pub mod selector;
