//! client-go's event-correlator constants (`tools/record/events_cache.go`), shared by the
//! worker's local correlator and the queue service's shared one, so both gate events alike.

use std::time::Duration;

/// Events a source may send about one object at once (client-go `defaultSpamBurst`).
pub const SPAM_BURST: u32 = 25;
/// Refill of that allowance: one event every 5 minutes (client-go `defaultSpamQPS`, 1/300).
pub const SPAM_REFILL_PERIOD: Duration = Duration::from_secs(300);
/// Similar events (differing only by message) seen before they are combined (client-go
/// `defaultAggregateMaxEvents`).
pub const AGGREGATE_MAX_EVENTS: u32 = 10;
/// How long similar events are remembered for combining (client-go
/// `defaultAggregateIntervalInSeconds`).
pub const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// Prefix of a combined event's message (client-go `EventAggregatorByReasonMessageFunc`).
pub const AGGREGATE_PREFIX: &str = "(combined from similar events): ";
/// Most events in one GateEvents call (one script call: bounds its run time); the worker's
/// event writer gates at most this many at once.
pub const MAX_GATE_EVENTS: usize = 256;
/// Longest event message GateEvents accepts: 4 KiB, room above the API server's 1 KiB `note`
/// limit (the writer truncates what it writes, not what it correlates); an event with a longer
/// message is correlated by the worker alone.
pub const MAX_GATED_MESSAGE_BYTES: usize = 4096;
