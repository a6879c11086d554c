//! kjob-watcher: informer events to enqueue requests, as the upstream Job controller handlers
